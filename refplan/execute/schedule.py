"""The schedule of one process: chunks, messages, queues and their staging.

Everything here is derived from the plans, the endpoints and the budget alone (plus this process's
validated shard views), by the same steps at both ends of every queue, so the r-th message of A's
queue to B is the r-th of B's queue from A. The staging pool (``_POOL``) lives here and only here:
other modules reach it as ``schedule._POOL``, never through a copy of the name.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Generic, Protocol, TypeVar

import torch

from ..box import volume
from ..plan import TransferPlan, TransferSegment
from ..requests import TransferEndpoints
from .common import StagingBudget, TransferRejectedError, _Context, _describe, _Refusal

_T = TypeVar("_T")

_SLOTS = 2  # staging slots per queue: round r+1 is packed while round r is in flight


@dataclass(frozen=True)
class Chunk:
    """A slab of a segment: the same strides on both sides, shifted offsets, a smaller shape."""

    source_offset: int
    target_offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return volume(self.shape)


def _split_axis(shape: tuple[int, ...], limit: int) -> tuple[int, int]:
    """(split axis, run length) of ``chunk_segment`` for ``limit >= 1`` elements per chunk."""
    inner = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        inner[axis] = inner[axis + 1] * shape[axis + 1]
    split = next(axis for axis in range(len(shape)) if inner[axis] <= limit)
    return split, min(shape[split], limit // inner[split])


def chunk_count(shape: tuple[int, ...], limit: int) -> int:
    """How many chunks ``chunk_segment`` makes of ``shape`` at ``limit`` elements, by arithmetic.

    The schedule is bounded with this before any chunk is built, so a hostile extent (2**50) or a
    one-element budget costs one multiplication, not gigabytes.
    """
    if not shape:
        return 1
    split, run = _split_axis(shape, limit)
    return math.prod(shape[:split]) * -(-shape[split] // run)


def _chunks(segment: TransferSegment, limit: int) -> list[Chunk]:
    shape = segment.shape
    if not shape:
        return [Chunk(segment.source_offset, segment.target_offset, ())]
    split, run = _split_axis(shape, limit)
    s_str, t_str = segment.source_strides, segment.target_strides
    out: list[Chunk] = []
    for index in product(*(range(e) for e in shape[:split])):
        s_base = segment.source_offset + sum(i * s for i, s in zip(index, s_str))
        t_base = segment.target_offset + sum(i * s for i, s in zip(index, t_str))
        for start in range(0, shape[split], run):
            extent = min(run, shape[split] - start)
            out.append(
                Chunk(
                    s_base + start * s_str[split],
                    t_base + start * t_str[split],
                    (1,) * split + (extent,) + shape[split + 1 :],
                )
            )
    return out


def chunk_segment(segment: TransferSegment, element_size: int, budget: StagingBudget) -> list[Chunk]:
    """Cut ``segment`` into boxes of at most ``bytes_per_peer`` bytes, counted element by element.

    With ``M = bytes_per_peer // element_size`` and ``inner(k)`` the element count of one index
    of axis ``k`` (the product of the extents after ``k``): the split axis is the outermost ``k``
    with ``inner(k) <= M``. Axes before it are walked one index at a time; axis ``k`` is cut into
    runs of ``min(extent_k, M // inner(k))`` (the last run may be shorter). So a segment that fits
    is one chunk; otherwise slabs along the outermost axis are as thick as fit; and if a slab one
    element thick along an axis does not fit, the split moves to the next axis, down to single
    elements. Every chunk is a box, hence a strided view with the segment's own strides, and
    holds ``numel × element_size <= bytes_per_peer`` bytes. ``M < 1`` raises
    ``TransferRejectedError``. Chunks come in row-major order of their origin; there are
    ``chunk_count(segment.shape, M)`` of them.
    """
    limit = budget.bytes_per_peer // element_size
    if limit < 1:
        raise TransferRejectedError(
            f"bytes_per_peer={budget.bytes_per_peer} cannot stage one element of {element_size} bytes"
        )
    return _chunks(segment, limit)


@dataclass(frozen=True)
class _Op:
    """One network chunk with this process on one side."""

    key: tuple[str, int]  # (parameter, location) of the side this process touches
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # strides of the side this process touches
    nbytes: int
    itemsize: int
    free: bool = False  # contiguous at both ends and at least _DIRECT_MIN: never staged (_free)
    # For a free chunk, where it lies at both ends: (parameter, source location, source offset,
    # target location, target offset). The same at both ends of its queue, so both can tell
    # whether it continues the chunk before it at both ends (``_joins``).
    ends: tuple[str, int, int, int, int] | None = None


@dataclass(frozen=True)
class _Local:
    source: tuple[str, int]
    target: tuple[str, int]
    segment: TransferSegment
    nbytes: int


@dataclass
class _Piece:
    """One wire message: a chunk of at least ``_DIRECT_MIN`` bytes alone, or a run of smaller ones.

    Both ends cut a round's chunks into pieces by chunk size alone, so they agree on every
    piece. ``direct`` is this process's view of a one-chunk piece that is contiguous in its own
    shard: those bytes go straight from (or into) the shard, with no staging copy.
    """

    first: int  # index of the first chunk in the message's parts
    last: int  # one past the last chunk
    start: int  # byte range of the piece in the message's staging layout
    end: int
    direct: torch.Tensor | None = None


@dataclass
class _Message:
    """Consecutive chunks of one peer queue travelling in one round (chunk offsets aligned per dtype)."""

    parts: tuple[tuple[_Op, int], ...]
    nbytes: int  # bytes of the staging layout, alignment padding included
    pieces: list[_Piece] = field(default_factory=list)

    @property
    def payload(self) -> int:
        return sum(op.nbytes for op, _at in self.parts)


_MAX_CHUNKS = 1 << 24  # message tags hold a piece index below this


_DIRECT_MIN = 64 << 10
"""Chunks this large travel as messages of their own (straight from/into a contiguous shard);
smaller ones share a staged message, where one copy costs less than one more message."""


_FREE_FACTOR = 16
"""Wire bytes of free chunks (``_free``) one message may carry, in units of the queue's message
limit: they need no staging, so the staging budget does not bound them, but a round still posts
a bounded number of them (at most ``_FREE_FACTOR * limit / _DIRECT_MIN`` messages per queue)."""


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a box of a flat buffer is one dense row-major run (torch's ``is_contiguous`` rule:
    axes of extent 1 do not count). A pure function of the segment, so both ends of a queue
    compute the same answer for each other's side."""
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1:
            if stride != expected:
                return False
            expected *= extent
    return True


def _free(
    nbytes: int, shape: tuple[int, ...], source_strides: tuple[int, ...], target_strides: tuple[int, ...]
) -> bool:
    """A chunk that goes straight from the source shard into the target shard at both ends.

    It takes no staging at either end, so it does not count against the staging budget: packing
    it into the budget-bound messages would cut a sync into more rounds than its staged bytes
    need (measured: 5 rounds instead of 1 for the ZeRO-2 bench batch, and 1.25-1.47x instead of
    1.12x the raw collective). Both ends decide it from the segment alone, so they agree.
    """
    return nbytes >= _DIRECT_MIN and _contiguous(shape, source_strides) and _contiguous(shape, target_strides)


def _large(op: _Op) -> bool:
    """Whether a chunk travels as a message of its own (see ``_DIRECT_MIN``)."""
    return op.nbytes >= _DIRECT_MIN


def _joins(before: _Op, op: _Op) -> bool:
    """Whether free chunk ``op`` continues free chunk ``before`` at both ends: the same parameter
    and locations, each side starting where the other chunk ends. Then the two are one contiguous
    run in both shards and travel as one message (``_pieces``). Decided from ``ends``, which both
    ends of the queue hold alike, so they cut the same pieces."""
    a, b = before.ends, op.ends
    if a is None or b is None or a[0] != b[0] or a[1] != b[1] or a[3] != b[3]:
        return False
    count = before.nbytes // before.itemsize
    return b[2] == a[2] + count and b[4] == a[4] + count


def _pieces(parts: tuple[tuple[_Op, int], ...]) -> list[_Piece]:
    """Cut a message's chunks into wire messages, the same way at both ends.

    A free chunk (``_free``) travels in place: alone, or with the free chunks after it that
    continue it at both ends (a segment cut by the message limit, or adjacent segments), as one
    message. Each message costs both ends a send or receive and gloo's per-message work (about
    0.1 ms of CPU on each side on 2 shared cores, issue 26), and the staging limit does not
    apply to bytes that are never staged; ``pack_messages`` still bounds the free bytes of one
    message. A chunk of ``_DIRECT_MIN`` or more that is staged travels alone (so it can land in
    place where it is contiguous), and consecutive smaller ones share one staged range.
    """
    out: list[_Piece] = []
    i = 0
    while i < len(parts):
        j = i + 1
        if parts[i][0].free:  # no staging range: sent and received in place
            while j < len(parts) and parts[j][0].free and _joins(parts[j - 1][0], parts[j][0]):
                j += 1
            out.append(_Piece(i, j, 0, 0))
            i = j
            continue
        if not _large(parts[i][0]):
            while j < len(parts) and not _large(parts[j][0]):
                j += 1
        out.append(_Piece(i, j, parts[i][1], parts[j - 1][1] + parts[j - 1][0].nbytes))
        i = j
    return out


def pack_messages(
    sizes: Sequence[int],
    bytes_per_peer: int,
    alignments: Sequence[int] | None = None,
    free: Sequence[bool] | None = None,
) -> list[list[tuple[int, int]]]:
    """Group consecutive chunk sizes greedily into messages of at most ``bytes_per_peer`` staged bytes.

    Returns, per message, (chunk index, byte offset) pairs; chunk i starts at a multiple of
    ``alignments[i]`` (its element size; 16 for every chunk when not given), so staging can be
    viewed as the chunk's dtype (complex128 needs 16, a 1-byte type none). A chunk larger than
    the budget cannot occur (``chunk_segment`` bounds it) and would get a message of its own.
    A chunk marked in ``free`` is staged at neither end: it gets offset -1, takes no staging
    bytes, and only ``_FREE_FACTOR * bytes_per_peer`` of such bytes share one message.
    Both ends of a queue call this on the same sizes, alignments and marks, so they agree on
    every message.
    """
    out: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    end = 0  # staged bytes of the current message
    wire = 0  # free bytes of the current message
    for index, size in enumerate(sizes):
        if free is not None and free[index]:
            if current and wire + size > _FREE_FACTOR * bytes_per_peer:
                out.append(current)
                current, end, wire = [], 0, 0
            current.append((index, -1))
            wire += size
            continue
        align = max(1, alignments[index]) if alignments is not None else 16
        start = -(-end // align) * align
        if current and start + size > bytes_per_peer:
            out.append(current)
            current, start, wire = [], 0, 0
        current.append((index, start))
        end = start + size
    if current:
        out.append(current)
    return out


def _messages(ops: list[_Op], limit: int) -> list[_Message]:
    out = []
    groups = pack_messages([op.nbytes for op in ops], limit, [op.itemsize for op in ops], [op.free for op in ops])
    for group in groups:
        parts = tuple((ops[i], offset) for i, offset in group)
        staged = max((at + op.nbytes for op, at in parts if not op.free), default=0)
        out.append(_Message(parts, staged, _pieces(parts)))
    return out


@dataclass
class _Schedule:
    incoming: dict[int, list[_Message]] = field(default_factory=dict)
    outgoing: dict[int, list[_Message]] = field(default_factory=dict)
    local: list[_Local] = field(default_factory=list)
    segments: int = 0
    sources: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # validated carrier views
    targets: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    slots: dict[tuple[str, int], list[torch.Tensor]] = field(default_factory=dict)  # (direction, peer)
    arenas: list[torch.Tensor] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    digest: tuple[int, tuple[int, ...]] | None = None  # the schedule digest and its summary, when remembered
    most_rounds: int = 0  # the most rounds of any process's schedule (from the verdicts)
    params: Mapping[str, _Param] = field(default_factory=dict)  # every plan, checked (for _written_by)
    endpoints: TransferEndpoints | None = None  # as checked (an exact copy of a subclass's)
    budget: StagingBudget | None = None  # as checked, likewise
    layout: _Layout | None = None  # the remembered layout this schedule is an instance of
    owners: list[torch.Tensor] = field(default_factory=list)  # the caller's buffers, as passed
    program: object | None = None  # the transport's prepared views for this call (``transport._program``)
    program_key: tuple[object, ...] | None = None  # where a new program is kept if the call ends cleanly
    pending: tuple[_Span, ...] | None = None  # a remembered layout's spans, not yet bound to the pieces (``_bind``)


class _Pool:
    """Staging arenas of calls that finished cleanly, kept for reuse, at most ``bound`` bytes.

    A fresh allocation is zeroed by the kernel page by page on first touch; in a sync loop that
    costs more than packing, so arenas are reused. The pool is bounded in bytes by the
    ``total_bytes`` of the budget in use, least recently used size first, and a call makes room
    before it allocates, so pooled and in-use staging together stay within that bound (issue 26:
    8 arenas per distinct size, kept forever, grew to 555 MiB over 200 calls of 2-4 MiB staging
    each, above the 256 MiB a budget promises). Only a call that finished cleanly returns its
    arenas (``_recycle``); a failed one keeps them out of the pool for good (``_RETAINED``).
    """

    def __init__(self) -> None:
        self.free: OrderedDict[tuple[str, int], list[torch.Tensor]] = OrderedDict()  # LRU first
        self.held = 0  # bytes of every arena in ``free``
        self.lock = threading.Lock()  # calls on different groups may run in different threads

    def take(self, device: torch.device, nbytes: int) -> torch.Tensor | None:
        key = (str(device), nbytes)
        with self.lock:
            free = self.free.get(key)
            if not free:
                return None
            arena = free.pop()
            self.held -= nbytes
            if free:
                self.free.move_to_end(key)
            else:
                del self.free[key]
            return arena

    @staticmethod
    def pools(arena: torch.Tensor, bound: int) -> bool:
        """Whether ``give`` keeps ``arena`` (one larger than the whole bound is dropped instead)."""
        return arena.numel() <= bound

    def give(self, arena: torch.Tensor, bound: int) -> None:
        if not self.pools(arena, bound):
            return
        nbytes = arena.numel()
        key = (str(arena.device), nbytes)
        with self.lock:
            self.free.setdefault(key, []).append(arena)
            self.free.move_to_end(key)
            self.held += nbytes
            self._trim(bound)

    def trim(self, bound: int) -> None:
        """Release arenas, least recently used size first, until at most ``bound`` bytes are held."""
        with self.lock:
            self._trim(bound)

    def _trim(self, bound: int) -> None:
        released = False
        while self.held > max(bound, 0) and self.free:
            key, free = next(iter(self.free.items()))
            self.held -= free.pop(0).numel()
            if not free:
                del self.free[key]
            released = True
        if released:  # a kept program may view an arena released: it must not keep it alive
            _PROGRAMS.clear()

    def clear(self) -> None:
        with self.lock:
            self.free.clear()
            self.held = 0
        _PROGRAMS.clear()


_POOL = _Pool()


def _recycle(sched: _Schedule, bound: int) -> None:
    """Return a clean call's arenas to the pool, which keeps at most ``bound`` bytes."""
    for arena in sched.arenas:
        _POOL.give(arena, bound)
    sched.arenas.clear()


def _reach(offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    return offset + sum((e - 1) * s for e, s in zip(shape, strides))


def _queue_limits(widest: Mapping[tuple[int, int], int], budget: StagingBudget) -> dict[tuple[int, int], int]:
    """Message byte limit of each (sender, receiver) queue, the same on both ends.

    A process stages at most ``_SLOTS`` messages per queue at once (the pipeline), so a message
    gets ``bytes_per_peer // _SLOTS`` and a queue's staging stays within ``bytes_per_peer`` — unless
    that cannot hold one element of the queue's widest dtype (``widest``), where a message holds
    one element (the least that works). Dividing ``total_bytes`` by the queues of the busier end
    keeps every process's staging within ``total_bytes``; below one element that is a refusal.
    """
    queues: dict[int, int] = {}
    for sender, receiver in widest:
        queues[sender] = queues.get(sender, 0) + 1
        queues[receiver] = queues.get(receiver, 0) + 1
    return {
        (s, r): min(
            max(budget.bytes_per_peer // _SLOTS, size),
            budget.total_bytes // (_SLOTS * max(queues[s], queues[r])),
        )
        for (s, r), size in widest.items()
    }


def _view(buf: torch.Tensor, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """The box of a flat contiguous shard buffer; bounds were checked before the verdict."""
    return torch.as_strided(buf, shape, strides, buf.storage_offset() + offset)


def _direct(buf: torch.Tensor, op: _Op) -> torch.Tensor | None:
    """The chunk's bytes in the shard as a flat uint8 tensor, when they are contiguous there."""
    view = _view(buf, op.offset, op.shape, op.strides)
    if not view.is_contiguous():
        return None
    return view.reshape(-1).view(torch.uint8)


def _direct_run(buf: torch.Tensor, parts: Sequence[tuple[_Op, int]]) -> torch.Tensor | None:
    """A run of free chunks that continue each other (``_joins``) as one flat uint8 tensor of the
    shard, or None if some chunk of it is not contiguous there after all."""
    views = [_direct(buf, op) for op, _at in parts]
    if any(v is None for v in views):
        return None
    first = parts[0][0]
    count = sum(op.nbytes for op, _at in parts) // first.itemsize
    return buf[first.offset : first.offset + count].view(torch.uint8)


_Key = tuple[str, int]  # (parameter, location)


_Queue = tuple[int, int]  # (sending process, receiving process)


@dataclass(frozen=True)
class _Param:
    """One parameter whose plan, segments and dtype passed the global checks."""

    plan: TransferPlan
    segments: list[TransferSegment]
    dtype: torch.dtype


@dataclass(frozen=True)
class _Mine:
    """A segment with this process on at least one side, its buffers and bounds checked."""

    name: str
    segment: TransferSegment
    source_process: int
    target_process: int


def _build_queues(
    ctx: _Context,
    mine: Sequence[_Mine],
    params: Mapping[str, _Param],
    limits: Mapping[_Queue, int],
    budget: StagingBudget,
    sched: _Schedule,
) -> None:
    """Local copies, then the chunks of every other segment (their count already bounded) in
    global order, cut into messages per peer queue; refuses a schedule above ``max_rounds``.

    Both ends of a queue walk the same segments in the same order with the same limit, so the
    r-th message of A's queue to B is the r-th of B's queue from A.
    """
    outgoing: dict[int, list[_Op]] = {}
    incoming: dict[int, list[_Op]] = {}
    for item in mine:
        name, seg, s_proc, t_proc = item.name, item.segment, item.source_process, item.target_process
        size = params[name].dtype.itemsize
        sched.segments += 1
        if s_proc == t_proc:
            sched.local.append(_Local((name, seg.source_rank), (name, seg.target_rank), seg, seg.numel * size))
            continue
        for chunk in _chunks(seg, limits[(s_proc, t_proc)] // size):
            nbytes = chunk.numel * size
            free = _free(nbytes, chunk.shape, seg.source_strides, seg.target_strides)
            ends = (name, seg.source_rank, chunk.source_offset, seg.target_rank, chunk.target_offset) if free else None
            if s_proc == ctx.me:
                key, off, strides = (name, seg.source_rank), chunk.source_offset, seg.source_strides
                outgoing.setdefault(t_proc, []).append(_Op(key, off, chunk.shape, strides, nbytes, size, free, ends))
            else:
                key, off, strides = (name, seg.target_rank), chunk.target_offset, seg.target_strides
                incoming.setdefault(s_proc, []).append(_Op(key, off, chunk.shape, strides, nbytes, size, free, ends))
    # Small chunks first in each queue (a stable partition, so both ends still agree): they then
    # share one staged piece instead of each travelling as a message of its own between two large
    # chunks (the ZeRO-2 bench batch: 8 norm halves of 1 KiB were 8 of a queue's 26 messages).
    for ops in (*outgoing.values(), *incoming.values()):
        ops.sort(key=_large)
    sched.outgoing = {p: _messages(ops, limits[(ctx.me, p)]) for p, ops in sorted(outgoing.items())}
    sched.incoming = {p: _messages(ops, limits[(p, ctx.me)]) for p, ops in sorted(incoming.items())}
    rounds = max((len(q) for q in (*sched.incoming.values(), *sched.outgoing.values())), default=0)
    if rounds > budget.max_rounds:
        raise _Refusal(
            f"the schedule of this process needs {rounds} rounds, above max_rounds={budget.max_rounds}: "
            "raise the staging budget"
        )


_Span = tuple[tuple[str, int], int, int] | None
"""Where a direct piece lies in this process's shard: (parameter and location, first element,
element count); None for a staged piece."""


def _allocate_staging(sched: _Schedule, bound: int, spans: Sequence[_Span] | None = None) -> tuple[_Span, ...]:
    """Mark the direct pieces (contiguous in this process's shard: no staging copy) and allocate
    two staging slots per queue for the others; returns where each piece lies (``_Span``, in
    queue, message and piece order).

    With ``spans`` (what an earlier call returned for the same layout, ``_Layout``), the pieces
    are bound by slicing the shards' flat views at those ranges instead of being tested one by
    one: which pieces are contiguous depends only on the layout, the shards' addresses do not
    matter. Allocated before the verdict, so that running out of memory is this process's refusal
    rather than a raise after its peers have started moving.
    """
    sizes: dict[tuple[str, int], int] = {}
    found: list[_Span] = []
    at = 0
    for direction, queues, store in (
        ("send", sched.outgoing, sched.sources),
        ("receive", sched.incoming, sched.targets),
    ):
        for peer, messages in queues.items():
            for message in messages:
                staged = False
                for piece in message.pieces:
                    if spans is not None:  # bound when the transport first needs them (``_bind``)
                        staged = staged or spans[at] is None
                        at += 1
                        continue
                    op = message.parts[piece.first][0]
                    if piece.last == piece.first + 1:
                        piece.direct = _direct(store[op.key], op)
                    elif op.free:  # a run of free chunks, one contiguous range at both ends (_joins)
                        piece.direct = _direct_run(store[op.key], message.parts[piece.first : piece.last])
                    if op.free and piece.direct is None:  # _contiguous disagrees with torch
                        raise _Refusal(
                            f"parameter {op.key[0]!r}: a chunk meant to be sent in place is not contiguous"
                        )
                    if piece.direct is None:
                        staged = True
                        found.append(None)
                    else:
                        count = sum(o.nbytes for o, _at in message.parts[piece.first : piece.last]) // op.itemsize
                        found.append((op.key, op.offset, count))
                if staged:
                    key = (direction, peer)
                    sizes[key] = max(sizes.get(key, 0), message.nbytes)
    try:
        steps = {key: -(-size // 64) * 64 for key, size in sorted(sizes.items())}
        # Taken last key first: the pool hands back the arena given last (``_recycle`` gives them
        # in key order), so a warm call gets each queue the arena it had, and the transport's
        # views kept for those addresses (``_PROGRAMS``) stay usable.
        arenas = {key: _POOL.take(sched.device, _SLOTS * steps[key]) for key in reversed(list(steps))}
        # Make room first: what stays pooled plus what this call holds stays within total_bytes.
        _POOL.trim(bound - sum(_SLOTS * step for step in steps.values()))
        for key, step in steps.items():
            arena = arenas[key]
            if arena is None:
                arena = torch.empty(_SLOTS * step, dtype=torch.uint8, device=sched.device)
            sched.arenas.append(arena)
            sched.slots[key] = [arena[i * step : i * step + sizes[key]] for i in range(_SLOTS)]
    except (RuntimeError, MemoryError) as exc:
        _PROGRAMS.clear()  # arenas taken from the pool above are dropped with this refusal (as in ``_execute``)
        raise _Refusal(f"cannot allocate staging: {_describe(exc)}") from None
    if spans is not None:
        sched.pending = tuple(spans)
    return tuple(found) if spans is None else tuple(spans)


def _bind(sched: _Schedule) -> None:
    """Bind the direct pieces of a schedule laid out from a remembered layout to this call's shards
    (the spans ``_allocate_staging`` left pending), in the order it found them.

    Deferred from the checks to the first use, because a warm call whose transport's views are
    kept (``_PROGRAMS``) never needs them: on the 272 MiB ``--sync`` batch that is 22 pieces on a
    sender and 42 on a receiver, two views each, every call. Binding only slices this call's
    checked shard views at ranges the layout proved contiguous, so it cannot fail by the caller's
    input.
    """
    spans, sched.pending = sched.pending, None
    if spans is None:
        return
    at = 0
    for queues, store in ((sched.outgoing, sched.sources), (sched.incoming, sched.targets)):
        for messages in queues.values():
            for message in messages:
                for piece in message.pieces:
                    span = spans[at]
                    at += 1
                    if span is not None:
                        key, start, count = span
                        piece.direct = store[key][start : start + count].view(torch.uint8)


@dataclass(frozen=True)
class _Layout:
    """This process's schedule of a batch without the shards' addresses: what the local segment
    checks (``checks._check_local_segments``), ``_build_queues`` and the contiguity tests of
    ``_allocate_staging`` derive, all pure functions of the plans, endpoints, budget, dtypes,
    group, this process and the element counts of its buffers (``_LAYOUTS`` keys it on them).

    Its messages are templates: each call gets fresh pieces (``instantiate``), so the views a
    call binds to them never outlive it or reach another call (the transport's views of a call's
    buffers are kept apart, in ``_PROGRAMS``, only for calls on the same addresses). ``params`` holds the plans, so
    that no id in the key can be reused by another object while the layout is remembered.
    """

    params: Mapping[str, _Param]
    segments: int
    local: tuple[_Local, ...]
    outgoing: tuple[tuple[int, tuple[_Message, ...]], ...]
    incoming: tuple[tuple[int, tuple[_Message, ...]], ...]
    spans: tuple[_Span, ...]

    @staticmethod
    def of(sched: _Schedule, spans: tuple[_Span, ...]) -> _Layout:
        def frozen(queues: Mapping[int, list[_Message]]) -> tuple[tuple[int, tuple[_Message, ...]], ...]:
            return tuple((peer, tuple(map(_unbound, messages))) for peer, messages in queues.items())

        return _Layout(sched.params, sched.segments, tuple(sched.local), frozen(sched.outgoing),
                       frozen(sched.incoming), spans)

    def instantiate(self, sched: _Schedule) -> None:
        """Give ``sched`` this layout's queues, with pieces of its own."""
        def fresh(queues: tuple[tuple[int, tuple[_Message, ...]], ...]) -> dict[int, list[_Message]]:
            return {peer: list(map(_unbound, messages)) for peer, messages in queues}

        sched.segments = self.segments
        sched.local = list(self.local)
        sched.outgoing = fresh(self.outgoing)
        sched.incoming = fresh(self.incoming)


def _unbound(message: _Message) -> _Message:
    """``message`` with pieces of its own, bound to no buffer: what a layout keeps, and what each
    call that reuses it starts from."""
    return _Message(message.parts, message.nbytes, [_Piece(p.first, p.last, p.start, p.end) for p in message.pieces])


class _Kept(Generic[_T]):
    """The last ``limit`` entries put (least recently used first out), under a lock: calls on
    different groups may run in different threads.

    ``drop`` is called with every entry let go (evicted, replaced, forgotten or cleared), after the
    lock is released: what an entry registered elsewhere for its own sake (the transport's
    programs register a finalizer on each buffer they view) must go with it, or it outlives the
    entry and grows with every entry ever made.
    """

    def __init__(self, limit: int, drop: Callable[[_T], None] | None = None) -> None:
        self.limit = limit
        self.drop = drop
        self.entries: OrderedDict[tuple[object, ...], _T] = OrderedDict()
        self.lock = threading.Lock()
        self.dead: list[tuple[object, ...]] = []  # keys forgotten while the lock was held (``forget``)

    def _bury(self, gone: list[_T]) -> None:
        while self.dead:
            entry = self.entries.pop(self.dead.pop(), None)
            if entry is not None:
                gone.append(entry)

    def _let_go(self, gone: list[_T]) -> None:
        if self.drop is not None:
            for entry in gone:
                self.drop(entry)

    def get(self, key: tuple[object, ...]) -> _T | None:
        gone: list[_T] = []
        with self.lock:
            self._bury(gone)
            entry = self.entries.get(key)
            if entry is not None:
                self.entries.move_to_end(key)
        self._let_go(gone)
        return entry

    def put(self, key: tuple[object, ...], entry: _T) -> None:
        gone: list[_T] = []
        with self.lock:
            self._bury(gone)
            replaced = self.entries.get(key)
            if replaced is not None and replaced is not entry:
                gone.append(replaced)
            self.entries[key] = entry
            self.entries.move_to_end(key)
            while len(self.entries) > self.limit:
                gone.append(self.entries.popitem(last=False)[1])
        self._let_go(gone)

    def forget(self, key: tuple[object, ...]) -> None:
        """Drop ``key`` now if the lock is free, else at the next use: a finalizer calls this, and
        one can run inside any allocation, also while this thread holds the lock (a garbage
        collection started there), where waiting would deadlock and popping would change the
        entries under the method that holds it."""
        if self.lock.acquire(blocking=False):
            try:
                entry = self.entries.pop(key, None)
            finally:
                self.lock.release()
            if entry is not None:
                self._let_go([entry])
        else:
            self.dead.append(key)

    def clear(self) -> None:
        with self.lock:
            gone = list(self.entries.values())
            self.entries.clear()
            self.dead.clear()
        self._let_go(gone)

    def __len__(self) -> int:
        gone: list[_T] = []
        with self.lock:
            self._bury(gone)
            count = len(self.entries)
        self._let_go(gone)
        return count


_LAYOUTS: _Kept[_Layout] = _Kept(4)
"""Layouts remembered per process (``_Layout``); ``release_staging()`` forgets them. Reached as
``schedule._LAYOUTS``, like the pool."""


class _Watched(Protocol):
    """A kept entry that registered finalizers on the buffers it views (``transport._Program``)."""

    @property
    def detachers(self) -> list[Callable[[], object]]: ...


def _unwatch(entry: _Watched) -> None:
    """Detach the finalizers a program let go of registered: they exist only to forget it."""
    detachers, entry.detachers[:] = list(entry.detachers), []
    for detach in detachers:
        detach()


_PROGRAMS: _Kept[_Watched] = _Kept(4, _unwatch)
"""The transport's prepared views of the last four warm calls (``transport._Program``), keyed by the
layout and the addresses of every buffer and staging arena they view; reached as
``schedule._PROGRAMS``.

Why keep views between calls at all: building them (a view per chunk and piece, lists, tags,
labels) costs the interpreter little alone but, on a loaded machine after each call's copies
have gone through the caches, several milliseconds of CPU a call over four processes (issue 26,
item 8a; docs/performance.md, "What the interpreter costs under load"). What keeps a kept view
right: a program is used only by a call whose layout (the same object) and buffer and arena
addresses are all the ones it was built on *and* whose own views still address exactly those
(``_Program.still_at``, read from the views as they are now). Holding the storages it views is
not enough: a storage can give its memory back while held (``untyped_storage().resize_(0)``, as
FSDP frees a parameter), another allocation can then take that address, and the held views follow
their storage wherever it is given memory next — a call on buffers at the old address would have
written into (and sent from) the old storage's memory and returned normally. What
keeps it from holding memory nobody else wants: it is dropped when any buffer it was built for
dies (``transport._program`` registers a finalizer on each, which ``forget``s it: at once, or at
the next use if the lock is held then), whenever the pool releases an arena (``_Pool``), and by
``release_staging()``; and whenever it is let go, its finalizers are detached (``_unwatch``), so
that only the kept programs' finalizers exist: before, every program ever kept left one on each
buffer it viewed until that buffer died, so a loop over more layouts or buffers than are kept
grew the finalizer registry by a buffer's worth a call, without bound.
"""
