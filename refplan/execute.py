"""Execute a batch of transfer plans between processes: one collective over a process group.

Why the protocol looks the way it does:

- **Nothing moves until everyone agrees.** Every check that can fail (dtypes, devices, endpoint
  bindings, buffer bounds, aliasing, staging budget on both the sending and the receiving side,
  the plan against its maps, staging allocation) runs first, on every process, against only what
  that process can see. Each process then packs its verdict and a digest of the whole schedule
  (plans, endpoints, budget, dtypes) into one fixed-size int64 tensor, and the processes
  all-gather it. If any process refused, or the digests differ, *every* process raises the same
  ``TransferRejectedError`` naming the processes and their reasons, and no byte has moved. A lone
  raise would strand the peers inside a collective, which is why no check may raise on its own.
- **After the verdict, nothing is left that can fail by our own logic**, so the only failures are
  the transport's (a dead or stuck peer). Every wait carries ``timeout``: a stuck round becomes a
  ``TransferExecutionError`` instead of a hang, and gloo closes the pairs it timed out on, which
  makes the peers on the other side fail fast as well.
- **Rounds with receives before sends.** Each process derives, from the same plans, the same
  global order of chunks; the chunks between two processes form one FIFO queue per direction, and
  the r-th chunk of A's queue to B is the r-th of B's queue from A. Round r posts, in one
  ``batch_isend_irecv``, the receives of every queue's r-th chunk first and then the sends. By
  induction on r every posted operation has its counterpart posted in the same round, so no
  cycle of waits can form.
- **Chunks are strided boxes that fit the budget by their real size.** A chunk is a slab of the
  segment along one axis (see ``chunk_segment``), so it stays a strided view on both shards and
  its byte count is exactly elements × element size (the published executor's span formula did
  not bound that product).
- **Staging is contiguous bytes.** gloo cannot send a non-contiguous tensor (and fails on one side
  only), so every network chunk is packed into a per-peer uint8 arena; the arenas are allocated
  before the verdict so that running out of memory is a refusal, not a stranded peer.
- **Local copies** (source and target location in the same process) are direct strided copies
  between the shards, done while a round's messages are in flight.

Endpoint values are global ranks by default. ``endpoint_ranks="group"`` makes them ranks of
``group``; they are translated with ``get_global_rank`` because ``P2POp`` takes a global peer.
The transport device follows the group's backend (gloo: CPU, NCCL: the current CUDA device), so a
process holding no buffer knows it too; every buffer must be on it.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import pairwise, product
from typing import Any, Literal

import torch
import torch.distributed as dist

from .box import volume
from .errors import AffineTransferError
from .maps import ParamAffineMap
from .plan import TransferPlan, TransferSegment
from .requests import TransferEndpoints

__all__ = [
    "DEFAULT_TIMEOUT",
    "Chunk",
    "EndpointRanks",
    "StagingBudget",
    "TransferExecutionError",
    "TransferRejectedError",
    "TransferStats",
    "chunk_segment",
    "execute_transfer",
    "execute_transfers",
    "pack_messages",
    "schedule_digest",
]

EndpointRanks = Literal["global", "group"]

DEFAULT_TIMEOUT = timedelta(seconds=300)
"""How long one exchange (the verdict, or one round) may wait before it becomes an error."""

_SCHEMA = "refplan.execute/1"
_MAGIC = 0x7265_6670_6C61_6E31  # "refplan1": a peer running another protocol disagrees, never hangs
_REASON_BYTES = 256
_HEADER_WORDS = 4  # magic, digest, rejected flag, global rank
_VERDICT_WORDS = _HEADER_WORDS + _REASON_BYTES // 8


class TransferRejectedError(AffineTransferError):
    """Raised identically on every process when the transfer was refused before any byte moved.

    ``processes`` names the processes whose check failed (or, for a schedule disagreement, every
    process); ``reason`` is the same text on every process.
    """

    def __init__(self, reason: str, processes: Sequence[int] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.processes = tuple(processes)


class TransferExecutionError(RuntimeError):
    """The transport failed or timed out after the verdict: target buffers may be partly written.

    Not an ``AffineTransferError``: nothing is wrong with the plan or the buffers; a peer died,
    stalled, or the network failed.
    """


@dataclass(frozen=True)
class StagingBudget:
    """Bytes one process may stage per peer and per direction at one time.

    A chunk never exceeds it; exhausting it makes more rounds, never a larger message. A budget
    that cannot hold one element of some parameter refuses the transfer before anything moves.
    """

    bytes_per_peer: int = 8 << 20


@dataclass(frozen=True)
class TransferStats:
    """What this process did in one ``execute_transfers`` call.

    ``segments`` counts segments with this process on either side, ``chunks`` the network chunks it
    sent or received, ``messages`` the staging buffers those chunks travelled in (consecutive chunks
    of one peer queue share a message up to the budget), ``rounds`` the ``batch_isend_irecv`` calls
    it made. Sent and received bytes count payload (chunk elements × element size, not the
    alignment padding between chunks of a message). Per-peer byte counts are
    keyed by the peer's process id in the endpoints' rank space. ``seconds`` is the whole call
    (checks, verdict, movement); ``move_seconds`` the movement alone.
    """

    segments: int = 0
    chunks: int = 0
    messages: int = 0
    rounds: int = 0
    local_copies: int = 0
    local_copy_bytes: int = 0
    sent_bytes: Mapping[int, int] = field(default_factory=dict)
    received_bytes: Mapping[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    move_seconds: float = 0.0

    @property
    def total_sent(self) -> int:
        return sum(self.sent_bytes.values())

    @property
    def total_received(self) -> int:
        return sum(self.received_bytes.values())


@dataclass(frozen=True)
class Chunk:
    """A slab of a segment: the same strides on both sides, shifted offsets, a smaller shape."""

    source_offset: int
    target_offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return volume(self.shape)


def _max_elements(budget: StagingBudget, element_size: int) -> int:
    return budget.bytes_per_peer // element_size


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
    ``TransferRejectedError``. Chunks come in row-major order of their origin.
    """
    limit = _max_elements(budget, element_size)
    if limit < 1:
        raise TransferRejectedError(
            f"bytes_per_peer={budget.bytes_per_peer} cannot stage one element of {element_size} bytes"
        )
    shape = segment.shape
    ndim = len(shape)
    if ndim == 0:
        return [Chunk(segment.source_offset, segment.target_offset, ())]
    inner = [1] * ndim
    for axis in range(ndim - 2, -1, -1):
        inner[axis] = inner[axis + 1] * shape[axis + 1]
    split = next(axis for axis in range(ndim) if inner[axis] <= limit)
    run = min(shape[split], limit // inner[split])
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


def schedule_digest(
    plans: Mapping[str, TransferPlan],
    endpoints: TransferEndpoints,
    budget: StagingBudget,
    dtypes: Mapping[str, torch.dtype],
    endpoint_ranks: str = "global",
) -> int:
    """A signed 64-bit digest of everything the schedule is derived from (never buffer contents).

    SHA-256 of a canonical JSON document (sorted keys, no whitespace), so equal inputs give equal
    digests in every process and any difference in a plan, a binding, the budget, a dtype or the
    rank space changes it.
    """
    doc = {
        "schema": _SCHEMA,
        "endpoint_ranks": endpoint_ranks,
        "bytes_per_peer": budget.bytes_per_peer,
        "endpoints": endpoints.to_dict(),
        "parameters": {
            name: {"dtype": str(dtypes.get(name)), "plan": plans[name].to_dict()} for name in sorted(plans)
        },
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big", signed=True)


# ---------------------------------------------------------------------------------------------
# Context: who am I, who are my peers, which device carries the bytes.


@dataclass(frozen=True)
class _Context:
    group: dist.ProcessGroup | None
    collective: bool  # more than one process: verdicts are exchanged and chunks sent
    me: int  # this process in the endpoints' rank space
    members: tuple[int, ...]  # valid process ids in the endpoints' rank space, by group rank
    global_ranks: tuple[int, ...]  # global rank of each group rank
    global_rank: int
    device: torch.device | None  # None: no process group, taken from the buffers


def _context(group: dist.ProcessGroup | None, mode: str) -> _Context:
    """Resolve ranks and the transport device; raises only where no peer can be waiting on us."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise TransferRejectedError("a process group was given but torch.distributed is not initialized")
        return _Context(None, False, 0, (0,), (0,), 0, None)
    global_ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    group_rank = dist.get_rank(group)
    if group_rank < 0:
        # Not a member: no member's collective includes this process, so raising strands nobody.
        raise TransferRejectedError(f"global rank {dist.get_rank()} is not a member of the given process group")
    backend = str(dist.get_backend(group)).lower()
    if backend == "gloo":
        device = torch.device("cpu")
    elif backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        # The backend is a property of the group, so every member refuses here, identically.
        raise TransferRejectedError(f"backend {backend!r} is not supported (gloo for CPU tensors, nccl for CUDA)")
    members = tuple(range(len(global_ranks))) if mode == "group" else global_ranks
    me = group_rank if mode == "group" else dist.get_rank()
    return _Context(group, len(global_ranks) > 1, me, members, global_ranks, dist.get_rank(), device)


# ---------------------------------------------------------------------------------------------
# The pre-verdict phase: every check, and the schedule of this process.


class _Refusal(Exception):
    """A local check failed; becomes this process's verdict, never a lone raise."""


@dataclass(frozen=True)
class _Op:
    """One network chunk with this process on one side."""

    parameter: str
    chunk: Chunk
    strides: tuple[int, ...]  # strides of the side this process touches
    location: int  # location of the side this process touches
    nbytes: int
    dtype: torch.dtype


@dataclass(frozen=True)
class _Local:
    parameter: str
    segment: TransferSegment


@dataclass(frozen=True)
class _Message:
    """Consecutive chunks of one peer queue sent as one staging buffer (byte offsets 8-aligned)."""

    parts: tuple[tuple[_Op, int], ...]
    nbytes: int  # staged bytes, alignment padding included

    @property
    def payload(self) -> int:
        return sum(op.nbytes for op, _at in self.parts)


_ALIGN = 8  # every chunk starts 8-byte aligned in a message, so any dtype can view its bytes


def pack_messages(sizes: Sequence[int], bytes_per_peer: int) -> list[list[tuple[int, int]]]:
    """Group consecutive chunk sizes greedily into messages of at most ``bytes_per_peer`` bytes.

    Returns, per message, (chunk index, byte offset) pairs; offsets are 8-aligned. A chunk larger
    than the budget cannot occur (``chunk_segment`` bounds it) and would get a message of its own.
    Both ends of a queue call this on the same sizes, so they agree on every message.
    """
    out: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    end = 0
    for index, size in enumerate(sizes):
        start = -(-end // _ALIGN) * _ALIGN
        if current and start + size > bytes_per_peer:
            out.append(current)
            current, start = [], 0
        current.append((index, start))
        end = start + size
    if current:
        out.append(current)
    return out


def _messages(ops: list[_Op], bytes_per_peer: int) -> list[_Message]:
    out = []
    for group in pack_messages([op.nbytes for op in ops], bytes_per_peer):
        parts = tuple((ops[i], offset) for i, offset in group)
        out.append(_Message(parts, parts[-1][1] + parts[-1][0].nbytes))
    return out


@dataclass
class _Schedule:
    incoming: dict[int, list[_Message]] = field(default_factory=dict)
    outgoing: dict[int, list[_Message]] = field(default_factory=dict)
    local: list[_Local] = field(default_factory=list)
    segments: int = 0
    recv_arena: dict[int, torch.Tensor] = field(default_factory=dict)
    send_arena: dict[int, torch.Tensor] = field(default_factory=dict)


def _dtype_of(dtypes: Any, name: str) -> torch.dtype:
    dtype = dtypes.get(name) if isinstance(dtypes, Mapping) else None
    if not isinstance(dtype, torch.dtype):
        raise _Refusal(f"parameter {name!r}: dtypes gives {dtype!r}, not a torch.dtype")
    return dtype


def _check_segment(name: str, index: int, seg: Any) -> TransferSegment:
    where = f"parameter {name!r}, segment {index}"
    if not isinstance(seg, TransferSegment):
        raise _Refusal(f"{where}: not a TransferSegment")
    ndim = len(seg.shape)
    if len(seg.source_strides) != ndim or len(seg.target_strides) != ndim:
        raise _Refusal(f"{where}: stride vectors do not match shape {seg.shape}")
    if any(e <= 0 for e in seg.shape):
        raise _Refusal(f"{where}: shape {seg.shape} has an extent below 1")
    if any(s < 0 for s in seg.source_strides + seg.target_strides) or min(seg.source_offset, seg.target_offset) < 0:
        raise _Refusal(f"{where}: negative offset or stride")
    return seg


def _bound(table: Mapping[int, int], location: int, side: str, name: str, members: tuple[int, ...]) -> int:
    if location not in table:
        raise _Refusal(f"parameter {name!r}: endpoints bind no process to {side} location {location}")
    process = table[location]
    if process not in members:
        raise _Refusal(
            f"parameter {name!r}: endpoints bind {side} location {location} to process {process}, "
            f"which is not in the process group {list(members)}"
        )
    return process


def _check_buffer(
    name: str, side: str, location: int, tensor: Any, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    where = f"parameter {name!r}: {side} buffer for location {location}"
    if not isinstance(tensor, torch.Tensor):
        raise _Refusal(f"{where} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.dtype != dtype:
        raise _Refusal(f"{where} has dtype {tensor.dtype}, the transfer is declared {dtype}")
    if tensor.device != device:
        raise _Refusal(f"{where} is on {tensor.device}, the transport device is {device}")
    if tensor.layout != torch.strided or not tensor.is_contiguous():
        # Plan offsets address the shard in row-major order: only a contiguous buffer means that.
        raise _Refusal(f"{where} is not a contiguous strided tensor")
    return tensor


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def _check_aliasing(
    sources: list[tuple[str, int, torch.Tensor]], targets: list[tuple[str, int, torch.Tensor]]
) -> None:
    """Targets pairwise disjoint, and no source overlapping a target (byte ranges in memory).

    Views of one allocation are fine as long as their bytes do not overlap: guard regions and
    packed flat buffers are common, and only an overlap can corrupt a read or double a write.
    """
    spans = sorted((*_byte_range(t), name, loc) for name, loc, t in targets if t.numel())
    for (_a_lo, a_hi, a_name, a_loc), (b_lo, _b_hi, b_name, b_loc) in pairwise(spans):
        if b_lo < a_hi:
            raise _Refusal(
                f"target buffers overlap in memory: parameter {a_name!r} location {a_loc} and "
                f"parameter {b_name!r} location {b_loc}"
            )
    starts = [s[0] for s in spans]
    for name, loc, tensor in sources:
        if not tensor.numel():
            continue
        lo, hi = _byte_range(tensor)
        i = bisect.bisect_right(starts, lo) - 1
        for j in (i, i + 1):
            if 0 <= j < len(spans) and spans[j][0] < hi and lo < spans[j][1]:
                raise _Refusal(
                    f"source buffer of parameter {name!r} location {loc} overlaps the target buffer of "
                    f"parameter {spans[j][2]!r} location {spans[j][3]} in memory"
                )


def _footprint_ok(offset: int, shape: tuple[int, ...], strides: tuple[int, ...], numel: int) -> bool:
    return offset + sum((e - 1) * s for e, s in zip(shape, strides)) < numel


def _prepare(
    ctx: _Context,
    plans: Any,
    source_buffers: Any,
    target_buffers: Any,
    endpoints: Any,
    dtypes: Any,
    budget: Any,
    maps: Any,
    mode: str,
) -> tuple[_Schedule, torch.device]:
    """Every check, then this process's schedule and staging. Raises ``_Refusal`` only."""
    if mode not in ("global", "group"):
        raise _Refusal(f"endpoint_ranks must be 'global' or 'group', got {mode!r}")
    if not isinstance(budget, StagingBudget) or type(budget.bytes_per_peer) is not int or budget.bytes_per_peer < 1:
        raise _Refusal(f"budget must be a StagingBudget with a positive int bytes_per_peer, got {budget!r}")
    if not isinstance(endpoints, TransferEndpoints):
        raise _Refusal(f"endpoints must be a TransferEndpoints, got {type(endpoints).__name__}")
    if not isinstance(plans, Mapping) or not all(isinstance(k, str) for k in plans):
        raise _Refusal("plans must map parameter name -> TransferPlan")
    for side, buffers in (("source", source_buffers), ("target", target_buffers)):
        if not isinstance(buffers, Mapping):
            raise _Refusal(f"{side}_buffers must map parameter name -> {{location: tensor}}")
        for name, per_location in buffers.items():
            if name not in plans:
                raise _Refusal(f"{side}_buffers name parameter {name!r}, which has no plan")
            if not isinstance(per_location, Mapping):
                raise _Refusal(f"{side}_buffers[{name!r}] must map location -> tensor")

    device = ctx.device
    if device is None:  # no process group: the buffers decide, but they must agree
        devices = {t.device for b in (source_buffers, target_buffers) for m in b.values() for t in m.values()
                   if isinstance(t, torch.Tensor)}
        device = devices.pop() if len(devices) == 1 else torch.device("cpu")

    # Global checks: identical inputs give identical verdicts on every process.
    names = sorted(plans)
    checked: dict[str, tuple[list[TransferSegment], torch.dtype, int]] = {}
    for name in names:
        plan = plans[name]
        if not isinstance(plan, TransferPlan):
            raise _Refusal(f"parameter {name!r}: plan is a {type(plan).__name__}, not a TransferPlan")
        dtype = _dtype_of(dtypes, name)
        size = dtype.itemsize
        segments = [_check_segment(name, i, s) for i, s in enumerate(plan.segments)]
        if segments and _max_elements(budget, size) < 1:
            raise _Refusal(
                f"parameter {name!r}: bytes_per_peer={budget.bytes_per_peer} cannot stage one element "
                f"({dtype}, {size} bytes)"
            )
        for seg in segments:
            _bound(endpoints.source, seg.source_rank, "source", name, ctx.members)
            _bound(endpoints.target, seg.target_rank, "target", name, ctx.members)
        checked[name] = (segments, dtype, size)

    # Local buffers: bound to this process, right dtype/device/layout, no aliasing.
    src: dict[tuple[str, int], torch.Tensor] = {}
    dst: dict[tuple[str, int], torch.Tensor] = {}
    for side, buffers, table, out in (
        ("source", source_buffers, endpoints.source, src),
        ("target", target_buffers, endpoints.target, dst),
    ):
        for name in sorted(buffers):
            dtype = checked[name][1]
            for location in sorted(buffers[name]):
                if location not in table:
                    raise _Refusal(
                        f"parameter {name!r}: {side} buffer for location {location}, which endpoints do not bind"
                    )
                if table[location] != ctx.me:
                    raise _Refusal(
                        f"parameter {name!r}: {side} buffer for location {location}, which endpoints bind to "
                        f"process {table[location]}, not to this process ({ctx.me})"
                    )
                out[(name, location)] = _check_buffer(name, side, location, buffers[name][location], dtype, device)
    _check_aliasing([(n, loc, t) for (n, loc), t in src.items()], [(n, loc, t) for (n, loc), t in dst.items()])

    # Segments touching this process: buffers present and large enough; chunk the network ones.
    sched = _Schedule()
    outgoing: dict[int, list[_Op]] = {}
    incoming: dict[int, list[_Op]] = {}
    for name in names:
        segments, dtype, size = checked[name]
        for index, seg in enumerate(segments):
            s_proc = endpoints.source[seg.source_rank]
            t_proc = endpoints.target[seg.target_rank]
            if ctx.me not in (s_proc, t_proc):
                continue
            sched.segments += 1
            for side, proc, store, loc, off, strides in (
                ("source", s_proc, src, seg.source_rank, seg.source_offset, seg.source_strides),
                ("target", t_proc, dst, seg.target_rank, seg.target_offset, seg.target_strides),
            ):
                if proc != ctx.me:
                    continue
                buf = store.get((name, loc))
                if buf is None:
                    raise _Refusal(
                        f"parameter {name!r}: no {side} buffer for location {loc}, which segment {index} uses"
                    )
                if not _footprint_ok(off, seg.shape, strides, buf.numel()):
                    reach = off + sum((e - 1) * s for e, s in zip(seg.shape, strides))
                    raise _Refusal(
                        f"parameter {name!r}: {side} buffer for location {loc} holds {buf.numel()} elements, "
                        f"segment {index} reaches element {reach}"
                    )
            if s_proc == t_proc:
                sched.local.append(_Local(name, seg))
                continue
            for chunk in chunk_segment(seg, size, budget):
                nbytes = chunk.numel * size
                if s_proc == ctx.me:
                    op = _Op(name, chunk, seg.source_strides, seg.source_rank, nbytes, dtype)
                    outgoing.setdefault(t_proc, []).append(op)
                else:
                    op = _Op(name, chunk, seg.target_strides, seg.target_rank, nbytes, dtype)
                    incoming.setdefault(s_proc, []).append(op)
    sched.outgoing = {peer: _messages(ops, budget.bytes_per_peer) for peer, ops in sorted(outgoing.items())}
    sched.incoming = {peer: _messages(ops, budget.bytes_per_peer) for peer, ops in sorted(incoming.items())}

    # The staging bound, on both sides, from real byte counts (the guard the published one lacked).
    for direction, queues in (("send", sched.outgoing), ("receive", sched.incoming)):
        for peer, messages in queues.items():
            largest = max(m.nbytes for m in messages)
            if largest > budget.bytes_per_peer:
                raise _Refusal(
                    f"a {direction} message with process {peer} needs {largest} bytes, above "
                    f"bytes_per_peer={budget.bytes_per_peer}"
                )

    if maps is not None:
        _verify_against_maps(plans, maps)

    try:
        for arenas, queues in ((sched.send_arena, sched.outgoing), (sched.recv_arena, sched.incoming)):
            for peer, messages in queues.items():
                arenas[peer] = torch.empty(max(m.nbytes for m in messages), dtype=torch.uint8, device=device)
    except (RuntimeError, MemoryError) as exc:
        raise _Refusal(f"cannot allocate staging: {type(exc).__name__}: {exc}") from None
    return sched, device


def _verify_against_maps(plans: Mapping[str, TransferPlan], maps: Any) -> None:
    """Judge each plan against its (target map, source map) with the independent oracle."""
    from .verify import verify_plan

    if not isinstance(maps, Mapping):
        raise _Refusal("maps must map parameter name -> (target map, source map)")
    for name in sorted(plans):
        pair = maps.get(name)
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(m, ParamAffineMap) for m in pair)):
            raise _Refusal(f"parameter {name!r}: maps give no (target map, source map) pair")
        verdict = verify_plan(pair[0], pair[1], plans[name], parameter=name)
        if not verdict.ok:
            raise _Refusal(f"parameter {name!r}: the plan does not verify against its maps: {verdict}")


# ---------------------------------------------------------------------------------------------
# The verdict exchange.


def _encode_reason(reason: str) -> list[int]:
    raw = reason.encode("utf-8")[:_REASON_BYTES].decode("utf-8", "ignore").encode("utf-8")
    raw = raw.ljust(_REASON_BYTES, b"\0")
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, _REASON_BYTES, 8)]


def _decode_reason(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def _exchange(ctx: _Context, device: torch.device, digest: int, reason: str | None, timeout: timedelta) -> None:
    """All-gather every verdict; raise the same ``TransferRejectedError`` everywhere on any refusal."""

    def name(group_rank: int, global_rank: int) -> str:
        process = ctx.members[group_rank] if 0 <= group_rank < len(ctx.members) else global_rank
        return f"process {process}" if process == global_rank else f"process {process} (global rank {global_rank})"

    if not ctx.collective:
        if reason is not None:
            raise TransferRejectedError(
                f"transfer rejected before any data moved: {name(0, ctx.global_rank)}: {reason}", (ctx.me,)
            )
        return
    words = [_MAGIC, digest, int(reason is not None), ctx.global_rank, *_encode_reason(reason or "")]
    mine = torch.tensor(words, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in ctx.members]
    try:
        work = dist.all_gather(gathered, mine, group=ctx.group, async_op=True)
        if work is not None:
            work.wait(timeout)
    except RuntimeError as exc:
        raise TransferExecutionError(
            f"exchanging verdicts failed or timed out after {timeout}; no data moved: {exc}"
        ) from exc
    rows = [[int(v) for v in t.cpu().tolist()] for t in gathered]
    refused = [(r, row) for r, row in enumerate(rows) if row[0] == _MAGIC and row[2]]
    if refused:
        parts = [f"{name(r, row[3])}: {_decode_reason(row[_HEADER_WORDS:])}" for r, row in refused]
        raise TransferRejectedError(
            "transfer rejected before any data moved: " + "; ".join(parts),
            tuple(ctx.members[r] for r, _ in refused),
        )
    digests: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        digests.setdefault(row[1] if row[0] == _MAGIC else 0, []).append(ctx.members[r])
    if len(digests) > 1:
        detail = ", ".join(f"{d & (2**64 - 1):#018x} on processes {procs}" for d, procs in sorted(digests.items()))
        raise TransferRejectedError(
            "transfer rejected before any data moved: processes disagree about the transfer schedule "
            f"(plans, endpoints, budget, dtypes or endpoint_ranks): {detail}",
            tuple(ctx.members),
        )


# ---------------------------------------------------------------------------------------------
# Moving.


def _view(buf: torch.Tensor, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """The box of a flat contiguous shard buffer; bounds were checked before the verdict."""
    return torch.as_strided(buf, shape, strides, buf.storage_offset() + offset)


def _move(
    ctx: _Context,
    sched: _Schedule,
    source_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    target_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    timeout: timedelta,
) -> tuple[int, int, dict[int, int], dict[int, int]]:
    """Run the rounds; returns (rounds, local bytes, sent per peer, received per peer)."""
    peers = sorted(set(sched.incoming) | set(sched.outgoing))
    rounds = max((len(q) for q in (*sched.incoming.values(), *sched.outgoing.values())), default=0)
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    local_bytes = 0
    to_global = dict(zip(ctx.members, ctx.global_ranks))

    def local_copy(item: _Local) -> int:
        seg = item.segment
        s_buf = source_buffers[item.parameter][seg.source_rank]
        t_buf = target_buffers[item.parameter][seg.target_rank]
        _view(t_buf, seg.target_offset, seg.shape, seg.target_strides).copy_(
            _view(s_buf, seg.source_offset, seg.shape, seg.source_strides)
        )
        return seg.numel * t_buf.element_size()

    for r in range(rounds):
        ops: list[dist.P2POp] = []
        labels: list[str] = []
        landing: list[tuple[_Message, torch.Tensor, int]] = []
        for peer in peers:
            queue = sched.incoming.get(peer, [])
            if r < len(queue):
                message = queue[r]
                stage = sched.recv_arena[peer][: message.nbytes]
                ops.append(dist.P2POp(dist.irecv, stage, to_global[peer], ctx.group))
                labels.append(f"receive from process {peer}")
                landing.append((message, stage, peer))
        for peer in peers:
            queue = sched.outgoing.get(peer, [])
            if r < len(queue):
                message = queue[r]
                stage = sched.send_arena[peer][: message.nbytes]
                for op, at in message.parts:
                    shard = source_buffers[op.parameter][op.location]
                    src = _view(shard, op.chunk.source_offset, op.chunk.shape, op.strides)
                    stage[at : at + op.nbytes].view(op.dtype).view(op.chunk.shape).copy_(src)
                ops.append(dist.P2POp(dist.isend, stage, to_global[peer], ctx.group))
                labels.append(f"send to process {peer}")
                sent[peer] = sent.get(peer, 0) + message.payload
        deadline = time.monotonic() + timeout.total_seconds()
        try:
            works = dist.batch_isend_irecv(ops) if ops else []
        except RuntimeError as exc:
            raise TransferExecutionError(f"round {r}: posting failed: {exc}") from exc
        # Local copies overlap the round in flight: an even share of them per round.
        lo, hi = r * len(sched.local) // rounds, (r + 1) * len(sched.local) // rounds
        for item in sched.local[lo:hi]:
            local_bytes += local_copy(item)
        for i, work in enumerate(works):
            left = max(deadline - time.monotonic(), 0.001)
            try:
                work.wait(timedelta(seconds=left))
            except RuntimeError as exc:
                what = labels[i] if len(works) == len(labels) else "its messages"
                raise TransferExecutionError(
                    f"round {r} of {rounds}: {what} failed or timed out (timeout {timeout}); target "
                    f"buffers may be partly written: {exc}"
                ) from exc
        for message, stage, peer in landing:
            for op, at in message.parts:
                shard = target_buffers[op.parameter][op.location]
                dst = _view(shard, op.chunk.target_offset, op.chunk.shape, op.strides)
                dst.copy_(stage[at : at + op.nbytes].view(op.dtype).view(op.chunk.shape))
            received[peer] = received.get(peer, 0) + message.payload
    if rounds == 0:
        for item in sched.local:
            local_bytes += local_copy(item)
    return rounds, local_bytes, sent, received


# ---------------------------------------------------------------------------------------------
# Public entry points.


def execute_transfers(
    plans: Mapping[str, TransferPlan],
    source_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    target_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    endpoints: TransferEndpoints,
    *,
    dtypes: Mapping[str, torch.dtype],
    budget: StagingBudget = StagingBudget(),  # frozen, so a shared default is safe
    group: dist.ProcessGroup | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    maps: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]] | None = None,
    endpoint_ranks: EndpointRanks = "global",
) -> TransferStats:
    """Move a whole batch (parameter name → plan) as one collective over ``group``.

    Every process of ``group`` must call this with the same plans, endpoints, budget, dtypes and
    ``endpoint_ranks`` (checked by digest); buffers hold only what this process owns, keyed by
    parameter and then by map location (a process may own none). Shard buffers must be
    contiguous tensors of the declared dtype on the transport device; they are written in place,
    never resized. ``maps`` (parameter → (target map, source map)) makes each process judge the
    plans with ``refplan.verify.verify_plan`` first. Without ``torch.distributed`` initialized
    (and no ``group``) this is a single process: every endpoint must be process 0.

    Raises ``TransferRejectedError`` on every process, before any byte moves, if any process's
    checks fail or the processes disagree about the schedule; ``TransferExecutionError`` if the
    transport fails or a round exceeds ``timeout`` afterwards.
    """
    started = time.perf_counter()
    ctx = _context(group, endpoint_ranks if endpoint_ranks in ("global", "group") else "global")
    reason: str | None = None
    sched = _Schedule()
    device = ctx.device or torch.device("cpu")
    try:
        sched, device = _prepare(
            ctx, plans, source_buffers, target_buffers, endpoints, dtypes, budget, maps, endpoint_ranks
        )
    except _Refusal as exc:
        reason = str(exc)
    except Exception as exc:  # a bug or odd input must still become a verdict, never a lone raise
        reason = f"unexpected {type(exc).__name__} while checking: {exc}"
    try:
        digest = schedule_digest(plans, endpoints, budget, dtypes, str(endpoint_ranks))
    except Exception as exc:
        digest = 0
        reason = reason or f"cannot compute the schedule digest: {type(exc).__name__}: {exc}"
    _exchange(ctx, device, digest, reason, timeout)

    moving = time.perf_counter()
    with torch.no_grad():
        try:
            rounds, local_bytes, sent, received = _move(ctx, sched, source_buffers, target_buffers, timeout)
        except TransferExecutionError:
            raise
        except Exception as exc:  # pragma: no cover - every input was checked; the transport is left
            raise TransferExecutionError(f"moving failed after the verdict: {type(exc).__name__}: {exc}") from exc
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    done = time.perf_counter()
    queues = (*sched.incoming.values(), *sched.outgoing.values())
    chunks = sum(len(m.parts) for q in queues for m in q)
    messages = sum(len(q) for q in queues)
    return TransferStats(
        segments=sched.segments,
        chunks=chunks,
        messages=messages,
        rounds=rounds,
        local_copies=len(sched.local),
        local_copy_bytes=local_bytes,
        sent_bytes=dict(sorted(sent.items())),
        received_bytes=dict(sorted(received.items())),
        seconds=done - started,
        move_seconds=done - moving,
    )


SINGLE = "param"
"""The parameter name ``execute_transfer`` uses for its one plan (as ``plan_transfer`` does)."""


def execute_transfer(
    plan: TransferPlan,
    source_buffers: Mapping[int, torch.Tensor],
    target_buffers: Mapping[int, torch.Tensor],
    endpoints: TransferEndpoints,
    *,
    dtype: torch.dtype,
    budget: StagingBudget = StagingBudget(),  # frozen, so a shared default is safe
    group: dist.ProcessGroup | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    maps: tuple[ParamAffineMap, ParamAffineMap] | None = None,
    endpoint_ranks: EndpointRanks = "global",
) -> TransferStats:
    """The one-parameter case of ``execute_transfers``; ``maps`` is (target map, source map)."""
    return execute_transfers(
        {SINGLE: plan},
        {SINGLE: source_buffers},
        {SINGLE: target_buffers},
        endpoints,
        dtypes={SINGLE: dtype},
        budget=budget,
        group=group,
        timeout=timeout,
        maps=None if maps is None else {SINGLE: maps},
        endpoint_ranks=endpoint_ranks,
    )
