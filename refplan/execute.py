"""Execute a batch of transfer plans between processes: one collective over a process group.

Why the protocol looks the way it does:

- **Nothing moves until everyone agrees.** Every check that can fail (dtypes, devices, endpoint
  bindings, segment shapes and strides, buffer bounds, aliasing, the schedule's size, the staging
  budget on both the sending and the receiving side, the plan against its maps, staging
  allocation) runs first, on every process, against only what that process can see. Each process
  then packs its protocol, its verdict, the device type of its buffers and a digest of the whole
  schedule (plans, endpoints, budget, dtypes) into one int64 tensor whose size never changes
  (``_HELLO_WORDS``), and the processes all-gather it, so that a peer of another protocol is a
  disagreement, never a collective of mismatched tensors (which gloo answers by aborting the
  process). If any process refused, the digests differ, or the processes
  hold buffers on different device types, *every* process raises the same
  ``TransferRejectedError`` naming the processes and their reasons, and no byte has moved. A lone
  raise would strand the peers inside a collective, which is why no check may raise on its own,
  and why nothing before the verdict does work proportional to a segment's extents: every
  segment's addresses are bounded by its buffer, and the number of chunks and rounds is computed
  arithmetically and bounded before a single chunk is built.
- **After the verdict, nothing is left that can fail by our own logic**, so the only failures are
  the transport's (a dead or stuck peer). Every wait carries ``timeout``: a stuck round becomes a
  ``TransferExecutionError`` instead of a hang. Staging a transport may still write into after a
  timed-out wait is never freed (see ``_RETAINED``). After the last round the processes agree on
  the outcome (``_outcome``), so a failure anywhere is raised everywhere, with the same targets.
- **Rounds with receives before sends.** Each process derives, from the same plans, the same
  global order of chunks; the chunks between two processes form one FIFO queue per direction, and
  the r-th message of A's queue to B is the r-th of B's queue from A. Round r posts the receives
  of every queue's r-th message first and then the sends. Rounds are posted ahead of the waits
  as far as the two staging slots per queue allow, so packing, moving and unpacking overlap;
  a process only waits for rounds that every peer posts without waiting on anything later, so
  no cycle of waits can form.
- **Chunks are strided boxes that fit the budget by their real size.** A chunk is a slab of the
  segment along one axis (see ``chunk_segment``), so it stays a strided view on both shards and
  its byte count is exactly elements × element size (the published executor's span formula did
  not bound that product).
- **Staging is contiguous bytes, unless the shard already is.** gloo cannot send a non-contiguous
  tensor (and fails on one side only), so a message is packed into staging; a message of one
  chunk that is contiguous in this process's shard is sent from (or received into) the shard
  itself. Every chunk starts in staging at a multiple of its element size, so any dtype (complex128
  needs 16 bytes) can view its bytes. Staging is bounded per peer and in total, and allocated
  before the verdict so that running out of memory is a refusal, not a stranded peer.
- **Bits, not values.** Buffers are reinterpreted once, before the verdict, as an integer type of
  the same width (``complex128`` for 16 bytes), so every dtype torch can view moves bit for bit
  with the same copy kernels; the movement uses those validated views and never reads the
  caller's mappings again.
- **Local copies** (source and target location in the same process) are direct strided copies
  between the shards, spread over the rounds while messages are in flight.

Endpoint values are global ranks by default. ``endpoint_ranks="group"`` makes them ranks of
``group``; they are translated with ``get_global_rank`` because ``P2POp`` takes a global peer.
The transport follows the buffers' device and the group's backend for that device type (torch's
``"cpu:gloo,cuda:nccl"`` strings included): CPU tensors travel over gloo, CUDA tensors over NCCL.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from itertools import pairwise, product
from typing import Any, Literal

import torch
import torch.distributed as dist

from .box import volume
from .errors import AffineTransferError, describe_exception
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
    "chunk_count",
    "chunk_segment",
    "execute_transfer",
    "execute_transfers",
    "pack_messages",
    "parse_backend",
    "release_staging",
    "schedule_digest",
]

EndpointRanks = Literal["global", "group"]

DEFAULT_TIMEOUT = timedelta(seconds=300)
"""How long one exchange (the verdict, or one round) may wait before it becomes an error."""

_SCHEMA = "refplan.execute/3"
_MAGIC = 0x7265_6670_6C61_6E33  # "refplan3": a peer running another protocol disagrees, never hangs
_PROTOCOL = 4  # the layout of the verdict message and of the outcome word
_HELLO_AGREED = 4  # words every process must have equal: magic, protocol, message length, outcome
_HELLO_WORDS = 37
"""Words of the one message every call all-gathers before any byte moves (its hello and verdict
together): magic, protocol, this message's length, whether the process runs the outcome
agreement, its number of rounds, the schedule digest, its refusal flag, its global rank, the
device type of its buffers, and its reason (the rest).

Fixed for good, so that a peer of another protocol meets a message of the same size and is found
by comparing words instead of by a collective of mismatched tensors, which gloo answers with
``std::terminate``. 37 is the size of protocol "refplan2"'s verdict and of protocol 3's hello
(which preceded a separate verdict): a process of either reads this message as one of another
magic or protocol and disagrees; it never aborts. Protocol 4 merged the hello and the verdict
into this one all-gather: each is a collective of about 4 ms on 4 processes sharing 2 loaded
cores, a third of a warm call's fixed cost (issue 26).
"""
_HEADER_WORDS = 9  # magic, protocol, length, outcome, rounds, digest, rejected flag, global rank, device type
_REASON_BYTES = (_HELLO_WORDS - _HEADER_WORDS) * 8  # 224
_VERDICT_WORDS = _HELLO_WORDS  # the verdict is the hello: one message of this many words
_SLOTS = 2  # staging slots per queue: round r+1 is packed while round r is in flight
_DEVICE_CODES = {"cpu": 1, "cuda": 2}
_TRANSPORTS = {"cpu": "gloo", "cuda": "nccl"}  # the backend the executor drives for each device type

_RETAINED: list[object] = []
"""Staging (and work handles) of transfers that failed after the verdict.

After a timed-out wait the transport may still write into a posted receive buffer (gloo's I/O
threads, or kernels queued on a CUDA stream), so freeing it could hand live memory to another
tensor. It is kept here for the life of the process; the process group should be aborted or
destroyed (and usually the process restarted) after a ``TransferExecutionError``.
"""


class TransferRejectedError(AffineTransferError):
    """Raised identically on every process when the transfer was refused before any byte moved.

    One exception: a call that starts while another is in flight on its group in the same
    process is refused by that process alone, before it touches the group (``_enter``).

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
    stalled, or the network failed. After the collective outcome (``outcome=True``, the
    default) every surviving process raises it, with the same ``targets``: parameter → target
    locations that may be partly written (those any failed process's queues and local copies
    write, or every target of the batch when the processes could not agree on who failed), and
    ``processes``: the processes that reported a failure (``None`` when the agreement failed).
    """

    def __init__(
        self,
        message: str,
        targets: Mapping[str, tuple[int, ...]] | None = None,
        processes: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(message)
        self.targets: dict[str, tuple[int, ...]] = dict(targets or {})
        self.processes = processes


@dataclass(frozen=True)
class StagingBudget:
    """How much staging, and how large a schedule, one process accepts.

    ``bytes_per_peer``: what one process stages for one peer, per direction, at one time. Two
    messages of a queue are in flight at once (the pipeline), so a message (hence a chunk) holds
    at most ``bytes_per_peer // 2`` bytes, or one element where that is less.
    ``total_bytes``: all staging of one process at one time — every peer, both directions, both
    pipeline slots, and the staging kept between calls for reuse (``_Pool``). With many peers the
    per-queue message limit shrinks to
    ``total_bytes // (2 × queues)`` of whichever end has more queues (both ends derive the same
    number from the plans), so memory does not grow with the number of peers.
    ``max_chunks`` (at most 2**24) and ``max_rounds`` bound the schedule of one process: a budget so small that a
    parameter would become millions of one-element messages is refused, before anything is built,
    instead of spending gigabytes and minutes. A budget that cannot hold one element of some
    parameter is refused the same way. Exhausting ``bytes_per_peer`` makes more rounds, never a
    larger message.
    ``max_work`` bounds what one process does before the verdict (and the per-piece part of its
    movement), estimated by arithmetic before anything is built (``_work``): every segment of the
    batch (each process checks and hashes all of them) costs ``_SEGMENT_WORK`` units, every network
    chunk of this process ``_CHUNK_WORK`` and every round of its schedule ``_ROUND_WORK``; a unit is
    about 20 µs on 4 processes sharing 2 cores. The default (2**17, about 2.6 s there; at most 65 536
    segments in a batch) refuses a schedule of many tiny pieces (10**5 one-element segments, a
    one-element staging budget) at once, with a message naming this field, instead of spending tens
    of seconds on every process before any byte moves. Raise it to accept such a schedule.
    """

    bytes_per_peer: int = 8 << 20
    total_bytes: int = 256 << 20
    max_chunks: int = 1 << 18
    max_rounds: int = 1 << 16
    max_work: int = 1 << 17


@dataclass(frozen=True)
class TransferStats:
    """What this process did in one ``execute_transfers`` call.

    ``segments`` counts segments with this process on either side, ``chunks`` the network chunks it
    sent or received, ``messages`` the messages those chunks travelled in (consecutive chunks
    of one peer queue share a message up to the budget), ``direct_messages`` those sent from or
    received into the shard itself (no staging), ``rounds`` the ``batch_isend_irecv`` calls
    it made. Sent and received bytes count payload (chunk elements × element size, not the
    alignment padding between chunks of a message). Per-peer byte counts are
    keyed by the peer's process id in the endpoints' rank space. ``seconds`` is the whole call
    (checks, verdict, movement, outcome); ``move_seconds`` everything after the verdict (movement
    and outcome). ``phases`` splits the call, in seconds: ``checks`` (everything before the
    verdict: arguments, plans, buffers, schedule, staging, digest), ``verdict`` (its all-gather,
    with the packing that overlaps it; absent for one process), ``move`` (the rounds, local copies
    and, on CUDA, the final wait) and ``outcome`` (the agreement; absent with ``outcome=False`` or one process), so
    that a caller (and ``refplan bench --sync``) sees what a call's fixed cost is made of.
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
    direct_messages: int = 0
    phases: Mapping[str, float] = field(default_factory=dict)

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


def schedule_digest(
    plans: Mapping[str, TransferPlan],
    endpoints: TransferEndpoints,
    budget: StagingBudget,
    dtypes: Mapping[str, torch.dtype],
    endpoint_ranks: str = "global",
    key: str | None = None,
) -> int:
    """A signed 64-bit digest of everything the schedule is derived from (never buffer contents).

    SHA-256 of a canonical JSON document (sorted keys, no whitespace), so equal inputs give equal
    digests in every process and any difference in a plan, a binding, the budget, a dtype, the
    rank space or the caller's ``key`` changes it. The key tells apart calls whose schedules are
    otherwise the same (weights and gradients of one shape): calls on a group are matched in
    the order each process makes them, so two such syncs issued in different orders would
    otherwise move each other's bytes.
    """
    doc: dict[str, object] = {
        "schema": _SCHEMA,
        "endpoint_ranks": endpoint_ranks,
        "budget": [budget.bytes_per_peer, budget.total_bytes, budget.max_chunks, budget.max_rounds, budget.max_work],
        "endpoints": endpoints.to_dict(),
        "parameters": {
            name: {"dtype": str(dtypes.get(name)), "plan": plans[name].to_dict()} for name in sorted(plans)
        },
    }
    if key is not None:  # absent rather than null, so the digests of calls without a key stay as they were
        doc["key"] = key
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "backslashreplace")).digest()[:8], "big", signed=True)


# ---------------------------------------------------------------------------------------------
# Context: who am I, who are my peers, which backend carries which device type.


def parse_backend(text: str) -> dict[str, str]:
    """Device type → backend name of a torch backend string.

    ``"gloo"`` (torch's own reading: CPU and CUDA), ``"nccl"`` (CUDA), and torch's device-mapped
    form ``"cpu:gloo,cuda:nccl"``. The executor then drives only the pairs it supports
    (``cpu:gloo``, ``cuda:nccl``); which one is used follows the buffers' device.
    """
    out: dict[str, str] = {}
    for item in str(text).lower().replace(" ", "").split(","):
        if not item:
            continue
        if ":" in item:
            device, _colon, backend = item.partition(":")
            out[device] = backend
        elif item == "gloo":
            out.setdefault("cpu", "gloo")
            out.setdefault("cuda", "gloo")
        elif item == "nccl":
            out.setdefault("cuda", "nccl")
        else:
            out.setdefault("cpu", item)
            out.setdefault("cuda", item)
    return out


@dataclass(frozen=True)
class _Context:
    group: dist.ProcessGroup | None
    collective: bool  # more than one process: verdicts are exchanged and chunks sent
    me: int  # this process in the endpoints' rank space
    members: tuple[int, ...]  # valid process ids in the endpoints' rank space, by group rank
    global_ranks: tuple[int, ...]  # global rank of each group rank
    global_rank: int
    backend: str  # the group's backend string, as torch reports it ("" without a group)
    backends: Mapping[str, str]  # device type -> backend


def _context(group: dist.ProcessGroup | None, mode: str) -> _Context:
    """Resolve ranks and backends; raises only where no peer can be waiting on us."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise TransferRejectedError("a process group was given but torch.distributed is not initialized")
        return _Context(None, False, 0, (0,), (0,), 0, "", {})
    global_ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    group_rank = dist.get_rank(group)
    if group_rank < 0:
        # Not a member: no member's collective includes this process, so raising strands nobody.
        raise TransferRejectedError(f"global rank {dist.get_rank()} is not a member of the given process group")
    try:
        config = dist.get_backend_config(group) if hasattr(dist, "get_backend_config") else dist.get_backend(group)
        backend = str(config)
    except Exception:  # the backend is the group's: every member falls back identically
        backend = str(dist.get_backend(group))
    members = tuple(range(len(global_ranks))) if mode == "group" else global_ranks
    me = group_rank if mode == "group" else dist.get_rank()
    return _Context(
        group, len(global_ranks) > 1, me, members, global_ranks, dist.get_rank(), backend, parse_backend(backend)
    )


def _verdict_device(ctx: _Context, local: torch.device | None) -> torch.device:
    """The device of the verdict tensor: the same device *type* on every process.

    A collective on a device-mapped group goes to the backend of the tensor's device, so every
    process must pick the same type from what they share — the group's backend — never from
    their own buffers: CPU whenever the group has gloo for CPU, else CUDA (the buffers' device,
    else the group's bound device, else the current device).
    """
    if ctx.backends.get("cpu") == "gloo" or "cuda" not in ctx.backends:
        return torch.device("cpu")
    if local is not None and local.type == "cuda":
        return local
    bound = getattr(ctx.group if ctx.group is not None else dist.group.WORLD, "bound_device_id", None)
    if isinstance(bound, torch.device) and bound.type == "cuda":
        return bound
    return torch.device("cuda", torch.cuda.current_device())


# ---------------------------------------------------------------------------------------------
# The pre-verdict phase: every check, and the schedule of this process.


class _Refusal(Exception):
    """A local check failed; becomes this process's verdict, never a lone raise."""


_describe = describe_exception


def _ended(started: float, limit: timedelta) -> str:
    """How a bounded wait that raised ended, by what happened: "timed out after 0:00:15" only when
    its time was up, else "failed after 0.02 s (timeout 0:00:15)" (a dead peer's closed connection
    ends a wait at once, and used to be reported as "failed or timed out after" the whole timeout)."""
    elapsed = time.monotonic() - started
    if elapsed >= limit.total_seconds() * 0.99:
        return f"timed out after {limit}"
    return f"failed after {elapsed:.2f} s (timeout {limit})"


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


_ORDERED_BATCHES = False
"""Post each round as one batch in piece order even over gloo: NCCL's path, which the CPU tests
take by setting this (the tagged, out-of-order posting is gloo's alone)."""

_MAX_IN_FLIGHT = 32  # rounds posted and not yet waited on, at most
_MAX_CHUNKS = 1 << 24  # message tags hold a piece index below this

_SEGMENT_WORK = 2  # every segment of the batch: checked, hashed (and, if it is this process's, chunked)
_CHUNK_WORK = 1  # every network chunk of this process: built, queued, packed or unpacked
_ROUND_WORK = 8  # every round of this process: posted and waited for, a gloo exchange (130 µs measured)


def _work(segments: int, chunks: int, rounds: int) -> int:
    """The pre-verdict cost model in work units (``StagingBudget.max_work``): pure arithmetic on
    counts known before anything is built, so a schedule too costly to start is refused at once.

    Measured on 2 shared cores (issue 26): 10**5 one-element segments cost 25-28 s per process
    before the verdict, a one-element staging budget 27 s; both were within ``max_chunks``, which
    bounds what can be tagged, not what it costs.
    """
    return segments * _SEGMENT_WORK + chunks * _CHUNK_WORK + rounds * _ROUND_WORK


def _too_much_work(what: str, work: int, budget: StagingBudget, detail: str) -> _Refusal:
    """The knob first: a reason is cut to the verdict's reason field, and the details can wait."""
    return _Refusal(
        f"{what} is estimated at {work} work units, above max_work={budget.max_work}: raise "
        f"StagingBudget(max_work=...) to accept it ({detail}; a unit is about 20 µs)"
    )


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


def _pieces(parts: tuple[tuple[_Op, int], ...]) -> list[_Piece]:
    out: list[_Piece] = []
    i = 0
    while i < len(parts):
        j = i + 1
        if parts[i][0].free:  # no staging range: sent and received in place
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
    digest: int | None = None  # the schedule digest, when the checked batch was remembered with it
    most_rounds: int = 0  # the most rounds of any process's schedule (from the verdicts)
    params: Mapping[str, _Param] = field(default_factory=dict)  # every plan, checked (for _written_by)
    endpoints: TransferEndpoints | None = None


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

    def give(self, arena: torch.Tensor, bound: int) -> None:
        nbytes = arena.numel()
        if nbytes > bound:
            return
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
        while self.held > max(bound, 0) and self.free:
            key, free = next(iter(self.free.items()))
            self.held -= free.pop(0).numel()
            if not free:
                del self.free[key]

    def clear(self) -> None:
        with self.lock:
            self.free.clear()
            self.held = 0


_POOL = _Pool()


def _recycle(sched: _Schedule, bound: int) -> None:
    """Return a clean call's arenas to the pool, which keeps at most ``bound`` bytes."""
    for arena in sched.arenas:
        _POOL.give(arena, bound)
    sched.arenas.clear()


def release_staging() -> None:
    """Free the staging memory kept for reuse between calls (e.g. before a memory-hungry phase),
    and forget the batches whose checks were remembered (which keeps their plans alive)."""
    _POOL.clear()
    _CHECKED.clear()


# Same-width carriers: copies move bits (NaN payloads, sub-byte and float8 types alike).
_CARRIERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def _quantized(dtype: torch.dtype) -> bool:
    """Quantized dtypes carry scales outside their bytes: moving the bytes alone is not a copy."""
    return str(dtype).removeprefix("torch.").startswith(("qint", "quint"))


def _dtype_of(dtypes: object, name: str) -> torch.dtype:
    dtype = dtypes.get(name) if isinstance(dtypes, Mapping) else None
    if not isinstance(dtype, torch.dtype):
        raise _Refusal(f"parameter {name!r}: dtypes gives {dtype!r}, not a torch.dtype")
    if _quantized(dtype) or dtype.itemsize not in _CARRIERS:
        raise _Refusal(f"parameter {name!r}: dtype {dtype} cannot be moved as plain bytes (quantized or unsized)")
    return dtype


def _ints(value: object, where: str, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int for v in value):
        raise _Refusal(f"{where}: {what} {value!r} is not a tuple of ints")
    return value


def _injective(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """No two indices of the box reach the same address: sorted by stride, each axis steps past
    the whole span of the finer axes (what a box of a row-major shard satisfies)."""
    span = 0
    for stride, extent in sorted((s, e) for s, e in zip(strides, shape) if e > 1):
        if stride <= span:
            return False
        span += (extent - 1) * stride
    return True


_INT64_BYTES = 1 << 63
"""Byte offsets, strides and extents must stay below this: ``torch.as_strided`` takes int64 element
counts and multiplies them by the element size (C ``int64_t``); past it, it raises after the verdict."""


def _check_numbers(where: str, seg: TransferSegment, itemsize: int) -> None:
    """Every number of a segment, in bytes of its dtype, inside what torch's int64 arithmetic holds.

    Checked on every process, by arithmetic, before the verdict: every stride, extent-1 axes
    included (the range checks multiply a stride by extent − 1, so a stride of 2**63 there passes
    them and overflowed in ``torch.as_strided`` only while moving: the sender failed to post and
    its receiver waited out the whole timeout), and each side's last byte (``(offset + Σ(extent−1)
    ·stride + 1) × itemsize``), which bounds the segment's offset, extents and size too.
    """
    for side, offset, strides in (
        ("source", seg.source_offset, seg.source_strides),
        ("target", seg.target_offset, seg.target_strides),
    ):
        for axis, stride in enumerate(strides):
            if stride * itemsize >= _INT64_BYTES:
                raise _Refusal(
                    f"{where}: {side} stride {stride} on axis {axis} is {stride * itemsize} bytes of "
                    f"{itemsize}-byte elements, not below 2**63"
                )
        end = (_reach(offset, seg.shape, strides) + 1) * itemsize
        if end > _INT64_BYTES:
            raise _Refusal(
                f"{where}: the {side} side ends at byte {end} (offset {offset}, {itemsize}-byte elements), "
                "past 2**63"
            )


def _check_segment(name: str, index: int, seg: object, itemsize: int) -> TransferSegment:
    where = f"parameter {name!r}, segment {index}"
    if not isinstance(seg, TransferSegment):
        raise _Refusal(f"{where}: not a TransferSegment")
    shape = _ints(seg.shape, where, "shape")
    ndim = len(shape)
    s_str = _ints(seg.source_strides, where, "source strides")
    t_str = _ints(seg.target_strides, where, "target strides")
    if len(s_str) != ndim or len(t_str) != ndim:
        raise _Refusal(f"{where}: stride vectors do not match shape {shape}")
    for value, what in ((seg.source_rank, "source location"), (seg.target_rank, "target location"),
                        (seg.source_offset, "source offset"), (seg.target_offset, "target offset")):
        if type(value) is not int:
            raise _Refusal(f"{where}: {what} {value!r} is not an int")
    if any(e <= 0 for e in shape):
        raise _Refusal(f"{where}: shape {shape} has an extent below 1")
    if any(s < 0 for s in s_str + t_str) or min(seg.source_offset, seg.target_offset) < 0:
        raise _Refusal(f"{where}: negative offset or stride")
    for side, strides in (("source", s_str), ("target", t_str)):
        if not _injective(shape, strides):
            raise _Refusal(
                f"{where}: shape {shape} with {side} strides {strides} reaches some {side} element more than once"
            )
    _check_numbers(where, seg, itemsize)
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


def _buffers_device(source_buffers: object, target_buffers: object) -> torch.device | None:
    """The one device every local buffer is on (None: this process holds none).

    A ``meta`` tensor is refused here, first, for what it is: it has a shape and no data, so
    there is nothing to move (its ``data_ptr()`` is 0, which later checks read as an overlap in
    memory, and its device type has no transport, which read as a backend problem).
    """
    devices: set[torch.device] = set()
    for side, buffers in (("source", source_buffers), ("target", target_buffers)):
        if isinstance(buffers, Mapping):
            for name, per_location in buffers.items():
                if isinstance(per_location, Mapping):
                    for location, t in per_location.items():
                        if isinstance(t, torch.Tensor) and t.device.type == "meta":
                            raise _Refusal(
                                f"parameter {name!r}: {side} buffer for location {location} is a meta tensor, "
                                "which holds no data to move"
                            )
                    devices.update(t.device for t in per_location.values() if isinstance(t, torch.Tensor))
    if len(devices) > 1:
        raise _Refusal(f"this process's buffers are on several devices: {sorted(str(d) for d in devices)}")
    return devices.pop() if devices else None


def _check_buffer(name: str, side: str, location: int, tensor: object, dtype: torch.dtype) -> torch.Tensor:
    """The buffer as a flat carrier view (same bytes, an integer type of the same width)."""
    where = f"parameter {name!r}: {side} buffer for location {location}"
    if not isinstance(tensor, torch.Tensor):
        raise _Refusal(f"{where} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.dtype != dtype:
        raise _Refusal(f"{where} has dtype {tensor.dtype}, the transfer is declared {dtype}")
    if tensor.layout != torch.strided or tensor.is_quantized or not tensor.is_contiguous():
        # Plan offsets address the shard in row-major order: only a contiguous buffer means that.
        raise _Refusal(f"{where} is not a contiguous strided tensor")
    try:
        return tensor.detach().reshape(-1).view(_CARRIERS[dtype.itemsize])
    except Exception as exc:
        raise _Refusal(f"{where}: cannot view its bytes: {_describe(exc)}") from None


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


_Key = tuple[str, int]  # (parameter, location)
_Queue = tuple[int, int]  # (sending process, receiving process)


@dataclass(frozen=True)
class _Arguments:
    """The caller's containers once their types are known; what they hold is checked later."""

    plans: Mapping[str, object]
    sources: Mapping[str, Mapping[int, object]]
    targets: Mapping[str, Mapping[int, object]]
    endpoints: TransferEndpoints
    budget: StagingBudget
    key: str | None = None


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


def _prepare(
    ctx: _Context,
    plans: object,
    source_buffers: object,
    target_buffers: object,
    endpoints: object,
    dtypes: object,
    budget: object,
    maps: object,
    mode: str,
    holds: torch.device | None,
    call_key: object = None,
) -> _Schedule:
    """Every check, then this process's schedule and staging. Raises ``_Refusal`` only.

    The steps run in this order, and the first failure is the refusal a caller reads: the shapes
    of the arguments, the plans (checks every process makes identically), this process's
    buffers, the segments that touch them, the plans against ``maps``; then the schedule is built
    and its staging allocated (a failure there is a refusal too). Nothing here costs more than
    the number of segments, buffers and (bounded) chunks: extents enter only through arithmetic,
    and chunks are built only after their count is known to fit.
    """
    args = _check_arguments(ctx, plans, source_buffers, target_buffers, endpoints, budget, mode, holds, call_key)
    key = _batch_key(ctx, args, dtypes, mode)
    remembered = _CHECKED.get(key) if key is not None else None
    digest: int | None
    if remembered is not None:  # the same plan objects passed these checks before: they cannot fail now
        _kept, params, limits, digest = remembered
    else:
        params, limits = _check_plans(ctx, args, dtypes)
        digest = _remember(key, args, params, limits, dtypes, mode)
    sched = _Schedule(device=holds or torch.device("cpu"), digest=digest, params=params, endpoints=args.endpoints)
    _check_buffers(ctx, args, params, sched)
    mine = _check_local_segments(ctx, args, params, limits, sched)
    if maps is not None:
        _verify_against_maps({name: p.plan for name, p in params.items()}, maps)
    _build_queues(ctx, mine, params, limits, args.budget, sched)
    _allocate_staging(sched, args.budget.total_bytes)
    return sched


_CHECKED: dict[tuple[object, ...], tuple[tuple[TransferPlan, ...], dict[str, _Param], dict[_Queue, int], int]] = {}
"""Batches whose global checks passed, with their limits and digest, keyed by ``_batch_key``."""
_CHECKED_LIMIT = 4


def _batch_key(ctx: _Context, args: _Arguments, dtypes: object, mode: str) -> tuple[object, ...] | None:
    """What the global checks and the digest depend on: the plan *objects* (by identity), and the
    values of the endpoints, budget, dtypes, rank mode and group members. None when some plan is
    not deeply immutable (a ``TransferPlan`` whose segments are not a tuple), so is not remembered.

    A sync loop calls the executor with the same plans step after step; their segments are frozen
    and were checked on the first call, so later calls skip ``_check_plans`` and the digest's
    serialization. Buffers, bounds and everything else that can change are checked every call.
    The remembered entry holds the plans themselves, so no id in a key can be reused by another
    object while the entry exists.
    """
    try:
        if not isinstance(dtypes, Mapping):
            return None
        names = sorted(args.plans)
        plans = [args.plans[name] for name in names]
        if not all(type(p) is TransferPlan and type(p.segments) is tuple for p in plans):
            return None
        kinds = tuple(dtypes.get(name) for name in names)
        if not all(type(k) is torch.dtype for k in kinds):
            return None
        budget = args.budget
        return (
            tuple(zip(names, map(id, plans), kinds)),
            tuple(sorted(args.endpoints.source.items())),
            tuple(sorted(args.endpoints.target.items())),
            (budget.bytes_per_peer, budget.total_bytes, budget.max_chunks, budget.max_rounds, budget.max_work),
            mode,
            ctx.members,
            args.key,
        )
    except Exception:  # an odd key or value: checked the long way, every call
        return None


def _remember(
    key: tuple[object, ...] | None,
    args: _Arguments,
    params: dict[str, _Param],
    limits: dict[_Queue, int],
    dtypes: object,
    mode: str,
) -> int | None:
    """The digest of a batch whose global checks just passed, remembered with them (at most
    ``_CHECKED_LIMIT`` batches, the oldest forgotten first). None when not remembered; then the
    caller computes the digest itself, and reports its failure as before."""
    if key is None or not isinstance(dtypes, Mapping):
        return None
    try:
        digest = schedule_digest(
            {n: p.plan for n, p in params.items()}, args.endpoints, args.budget, dtypes, mode, args.key
        )
    except Exception:
        return None
    while len(_CHECKED) >= _CHECKED_LIMIT:
        del _CHECKED[next(iter(_CHECKED))]
    _CHECKED[key] = (tuple(p.plan for p in params.values()), params, limits, digest)
    return digest


def _check_arguments(
    ctx: _Context,
    plans: object,
    source_buffers: object,
    target_buffers: object,
    endpoints: object,
    budget: object,
    mode: str,
    holds: torch.device | None,
    call_key: object = None,
) -> _Arguments:
    """The containers the later checks walk: their types, the budget's fields, every buffer
    naming a planned parameter, and a transport for the buffers' device type.

    First, because every later step indexes these containers: a wrong type here is named as
    what it is instead of surfacing as an odd exception deep inside a later check.
    """
    if mode not in ("global", "group"):
        raise _Refusal(f"endpoint_ranks must be 'global' or 'group', got {mode!r}")
    if call_key is not None and type(call_key) is not str:
        raise _Refusal(f"key must be a str or None, got {type(call_key).__name__}")
    if not isinstance(budget, StagingBudget) or not all(
        type(v) is int and v >= 1
        for v in (budget.bytes_per_peer, budget.total_bytes, budget.max_chunks, budget.max_rounds, budget.max_work)
    ):
        raise _Refusal(f"budget must be a StagingBudget of positive ints, got {budget!r}")
    if budget.max_chunks > _MAX_CHUNKS:
        raise _Refusal(f"max_chunks={budget.max_chunks} is above {_MAX_CHUNKS}, the most one process can tag")
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
    transport = _TRANSPORTS.get(holds.type) if holds is not None else None
    if holds is not None and ctx.backends and (transport is None or ctx.backends.get(holds.type) != transport):
        # The group has no backend the executor drives for this device type.
        needs = (f"need the {transport} backend" if transport is not None else
                 "cannot be moved: the executor moves CPU tensors over gloo and CUDA tensors over nccl")
        raise _Refusal(f"buffers on {holds} {needs}; the process group's backend is {ctx.backend!r}")
    assert isinstance(source_buffers, Mapping) and isinstance(target_buffers, Mapping)  # checked above
    key = None if call_key is None else str(call_key)
    return _Arguments(plans, source_buffers, target_buffers, endpoints, budget, key)


def _check_plans(
    ctx: _Context, args: _Arguments, dtypes: object
) -> tuple[dict[str, _Param], dict[_Queue, int]]:
    """The checks every process makes identically, and each queue's message limit.

    Every process holds the same plans, endpoints, dtypes and budget (the digest proves it), so
    these verdicts agree everywhere: each plan and segment well formed (``_check_segment``), a
    movable dtype, every location bound to a member of the group, and a budget that can stage
    one element of every queue's widest dtype. The limits derived here are the same at both
    ends of a queue, which is what lets both ends cut the same messages.
    """
    budget, endpoints = args.budget, args.endpoints
    # Before any segment is looked at: every process checks (and hashes) all of them, so their
    # number alone can exceed the work budget, and is known from the plans' lengths.
    count = sum(len(p.segments) for p in args.plans.values() if isinstance(p, TransferPlan))
    if _work(count, 0, 0) > budget.max_work:
        raise _too_much_work("the batch", _work(count, 0, 0), budget,
                             f"{count} segments, each checked by every process before the verdict")
    params: dict[str, _Param] = {}
    widest: dict[_Queue, tuple[int, str, torch.dtype]] = {}  # queue -> its widest element
    for name in sorted(args.plans):
        plan = args.plans[name]
        if not isinstance(plan, TransferPlan):
            raise _Refusal(f"parameter {name!r}: plan is a {type(plan).__name__}, not a TransferPlan")
        dtype = _dtype_of(dtypes, name)
        segments = [_check_segment(name, i, s, dtype.itemsize) for i, s in enumerate(plan.segments)]
        if segments and budget.bytes_per_peer < dtype.itemsize:
            raise _Refusal(
                f"parameter {name!r}: bytes_per_peer={budget.bytes_per_peer} cannot stage one element "
                f"({dtype}, {dtype.itemsize} bytes)"
            )
        for seg in segments:
            s_proc = _bound(endpoints.source, seg.source_rank, "source", name, ctx.members)
            t_proc = _bound(endpoints.target, seg.target_rank, "target", name, ctx.members)
            if s_proc != t_proc and widest.get((s_proc, t_proc), (0, "", dtype))[0] < dtype.itemsize:
                widest[(s_proc, t_proc)] = (dtype.itemsize, name, dtype)
        params[name] = _Param(plan, segments, dtype)
    limits = _queue_limits({q: w[0] for q, w in widest.items()}, budget)
    for (sender, receiver), (size, name, dtype) in sorted(widest.items()):
        if limits[(sender, receiver)] < size:
            raise _Refusal(
                f"parameter {name!r}: the staging budget (bytes_per_peer={budget.bytes_per_peer}, "
                f"total_bytes={budget.total_bytes}) leaves {limits[(sender, receiver)]} bytes per message from "
                f"process {sender} to process {receiver}, which cannot stage one element ({dtype}, {size} bytes)"
            )
    return params, limits


def _check_buffers(ctx: _Context, args: _Arguments, params: Mapping[str, _Param], sched: _Schedule) -> None:
    """This process's buffers: each bound to this process, of its parameter's dtype, contiguous,
    and no two overlapping in memory where a write could land on a read or another write.

    The flat carrier views made here are kept in ``sched`` and are all the movement ever
    touches, so a mapping that changes after the checks cannot make it touch anything unchecked.
    """
    for side, buffers, table, out in (
        ("source", args.sources, args.endpoints.source, sched.sources),
        ("target", args.targets, args.endpoints.target, sched.targets),
    ):
        for name in sorted(buffers):
            dtype = params[name].dtype
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
                out[(name, location)] = _check_buffer(name, side, location, buffers[name][location], dtype)
    _check_aliasing([(n, loc, t) for (n, loc), t in sched.sources.items()],
                    [(n, loc, t) for (n, loc), t in sched.targets.items()])


def _check_local_segments(
    ctx: _Context, args: _Arguments, params: Mapping[str, _Param], limits: Mapping[_Queue, int], sched: _Schedule
) -> list[_Mine]:
    """The segments that touch this process: each one's buffer present, every address inside it
    (``offset + Σ(extent−1)·stride < numel``), no target written more often than it has elements,
    and the number of network chunks within ``max_chunks``.

    All of it is arithmetic on extents, so a hostile extent (2**50) is refused at the cost of a
    multiplication, before anything proportional to it is built.
    """
    endpoints, budget = args.endpoints, args.budget
    mine: list[_Mine] = []
    written: dict[_Key, int] = {}
    chunks = 0
    staged: dict[_Queue, int] = {}  # bytes of each queue whose message limit is below _DIRECT_MIN
    for name, param in params.items():
        for index, seg in enumerate(param.segments):
            s_proc = endpoints.source[seg.source_rank]
            t_proc = endpoints.target[seg.target_rank]
            if ctx.me not in (s_proc, t_proc):
                continue
            for side, proc, store, loc, off, strides in (
                ("source", s_proc, sched.sources, seg.source_rank, seg.source_offset, seg.source_strides),
                ("target", t_proc, sched.targets, seg.target_rank, seg.target_offset, seg.target_strides),
            ):
                if proc != ctx.me:
                    continue
                buf = store.get((name, loc))
                if buf is None:
                    raise _Refusal(
                        f"parameter {name!r}: no {side} buffer for location {loc}, which segment {index} uses"
                    )
                reach = _reach(off, seg.shape, strides)
                if reach >= buf.numel():
                    raise _Refusal(
                        f"parameter {name!r}: {side} buffer for location {loc} holds {buf.numel()} elements, "
                        f"segment {index} reaches element {reach}"
                    )
                if side == "target":
                    total = written.get((name, loc), 0) + seg.numel
                    written[(name, loc)] = total
                    if total > buf.numel():
                        raise _Refusal(
                            f"parameter {name!r}: segments up to {index} write {total} elements into the target "
                            f"buffer for location {loc}, which holds {buf.numel()}"
                        )
            if s_proc != t_proc:
                limit = limits[(s_proc, t_proc)]
                chunks += chunk_count(seg.shape, limit // param.dtype.itemsize)
                if chunks > budget.max_chunks:
                    raise _Refusal(
                        f"the schedule of this process needs more than max_chunks={budget.max_chunks} network "
                        f"chunks (at parameter {name!r}, segment {index}) with bytes_per_peer="
                        f"{budget.bytes_per_peer}: raise the staging budget"
                    )
                if limit < _DIRECT_MIN:  # every chunk of the queue is staged: bytes / limit rounds at least
                    staged[(s_proc, t_proc)] = staged.get((s_proc, t_proc), 0) + seg.numel * param.dtype.itemsize
            mine.append(_Mine(name, seg, s_proc, t_proc))
    # The rounds are known only once messages are packed; ceil(staged bytes / limit) bounds them
    # from below (a message holds at most ``limit`` staged bytes), which is what tiny budgets cost.
    rounds = max((-(-nbytes // limits[q]) for q, nbytes in staged.items()), default=0)
    segments = sum(len(p.segments) for p in params.values())
    work = _work(segments, chunks, rounds)
    if work > budget.max_work:
        raise _too_much_work(
            "the schedule of this process", work, budget,
            f"{segments} segments in the batch, {chunks} network chunks, at least {rounds} rounds with "
            f"bytes_per_peer={budget.bytes_per_peer}; a larger bytes_per_peer makes fewer chunks and rounds",
        )
    return mine


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
            if s_proc == ctx.me:
                key, off, strides = (name, seg.source_rank), chunk.source_offset, seg.source_strides
                outgoing.setdefault(t_proc, []).append(_Op(key, off, chunk.shape, strides, nbytes, size, free))
            else:
                key, off, strides = (name, seg.target_rank), chunk.target_offset, seg.target_strides
                incoming.setdefault(s_proc, []).append(_Op(key, off, chunk.shape, strides, nbytes, size, free))
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


def _allocate_staging(sched: _Schedule, bound: int) -> None:
    """Mark the direct pieces (one chunk, contiguous in this process's shard: no staging copy)
    and allocate two staging slots per queue for the others.

    Allocated before the verdict, so that running out of memory is this process's refusal
    rather than a raise after its peers have started moving.
    """
    sizes: dict[tuple[str, int], int] = {}
    for direction, queues, store in (
        ("send", sched.outgoing, sched.sources),
        ("receive", sched.incoming, sched.targets),
    ):
        for peer, messages in queues.items():
            for message in messages:
                for piece in message.pieces:
                    if piece.last == piece.first + 1:
                        op = message.parts[piece.first][0]
                        piece.direct = _direct(store[op.key], op)
                        if op.free and piece.direct is None:  # _contiguous disagrees with torch
                            raise _Refusal(
                                f"parameter {op.key[0]!r}: a chunk meant to be sent in place is not contiguous"
                            )
                if any(piece.direct is None for piece in message.pieces):
                    key = (direction, peer)
                    sizes[key] = max(sizes.get(key, 0), message.nbytes)
    try:
        steps = {key: -(-size // 64) * 64 for key, size in sorted(sizes.items())}
        arenas = {key: _POOL.take(sched.device, _SLOTS * step) for key, step in steps.items()}
        # Make room first: what stays pooled plus what this call holds stays within total_bytes.
        _POOL.trim(bound - sum(_SLOTS * step for step in steps.values()))
        for key, step in steps.items():
            arena = arenas[key]
            if arena is None:
                arena = torch.empty(_SLOTS * step, dtype=torch.uint8, device=sched.device)
            sched.arenas.append(arena)
            sched.slots[key] = [arena[i * step : i * step + sizes[key]] for i in range(_SLOTS)]
    except (RuntimeError, MemoryError) as exc:
        raise _Refusal(f"cannot allocate staging: {_describe(exc)}") from None


def _verify_against_maps(plans: Mapping[str, TransferPlan], maps: object) -> None:
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


def _encode_reason(reason: str, nbytes: int = _REASON_BYTES) -> list[int]:
    """``nbytes // 8`` words of a reason; nothing here can raise (lone surrogates are escaped)."""
    try:
        raw = str(reason).encode("utf-8", "backslashreplace")
        raw = raw[:nbytes].decode("utf-8", "ignore").encode("utf-8")
    except Exception:
        raw = b"(the reason could not be encoded)"[:nbytes]
    raw = raw.ljust(nbytes, b"\0")
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, nbytes, 8)]


def _decode_reason(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def _gather(
    ctx: _Context,
    device: torch.device,
    words: Sequence[int],
    timeout: timedelta,
    meanwhile: Callable[[], int] | None = None,
) -> tuple[list[list[int]], int]:
    """All-gather one int64 word list per process (every process sends as many words: the verdict
    is ``_HELLO_WORDS`` long in every protocol, the outcome one word after an agreed verdict);
    ``meanwhile`` runs while it is in flight."""
    mine = torch.tensor(list(words), dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in ctx.members]
    work = dist.all_gather(gathered, mine, group=ctx.group, async_op=True)
    done = meanwhile() if meanwhile is not None else 0
    if work is not None:
        work.wait(timeout)
    return [[int(v) for v in t.cpu().tolist()] for t in gathered], done


def _exchange(
    ctx: _Context,
    device: torch.device,
    digest: int,
    reason: str | None,
    holds: torch.device | None,
    timeout: timedelta,
    meanwhile: Callable[[], int] | None = None,
    outcome: bool = True,
    rounds: int = 0,
    phases: dict[str, float] | None = None,
) -> tuple[int, int]:
    """All-gather every process's verdict, one message of ``_HELLO_WORDS`` words (hello and
    verdict in one); raise the same ``TransferRejectedError`` everywhere on messages whose
    agreed words differ (another protocol, or options), any refusal, digest disagreement, or
    buffers on different device types.

    The size never changes because a collective of tensors of different sizes is not an error
    gloo reports: it aborts the process. ``meanwhile`` runs while the message is in flight (work
    that only touches this process's own staging: ``_pack_ahead``); its result is returned, 0
    without it, with the most rounds any process's schedule has (``rounds`` is this process's),
    which bounds how long the outcome agreement may wait for the slowest process. ``phases``
    receives the seconds of the exchange (with ``meanwhile``) as ``verdict``.
    """

    def name(group_rank: int, global_rank: int) -> str:
        process = ctx.members[group_rank] if 0 <= group_rank < len(ctx.members) else global_rank
        return f"process {process}" if process == global_rank else f"process {process} (global rank {global_rank})"

    if not ctx.collective:
        if reason is not None:
            raise TransferRejectedError(
                f"transfer rejected before any data moved: {name(0, ctx.global_rank)}: {reason}", (ctx.me,)
            )
        return 0, rounds
    code = 0 if holds is None else _DEVICE_CODES.get(holds.type, 99)
    header = [_MAGIC, _PROTOCOL, _HELLO_WORDS, int(outcome), rounds, digest, int(reason is not None),
              ctx.global_rank, code]
    # The reason fills what the header leaves of the fixed size, whatever the module's constants
    # say, so that nothing can make this process's message another size than its peers'.
    words = header + _encode_reason(reason or "", (_HELLO_WORDS - len(header)) * 8)
    started = time.monotonic()
    try:
        rows, done = _gather(ctx, device, words, timeout, meanwhile)
    except Exception as exc:
        raise TransferExecutionError(
            f"exchanging verdicts {_ended(started, timeout)}; no data moved: {_describe(exc)}"
        ) from exc
    if phases is not None:
        phases["verdict"] = time.monotonic() - started
    if any(row[:_HELLO_AGREED] != rows[0][:_HELLO_AGREED] for row in rows):
        # Built from the gathered rows alone, so every process raises the same text.
        detail = "; ".join(
            f"{name(r, ctx.global_ranks[r])}: magic {row[0] & (2**64 - 1):#018x}, protocol {row[1]}, "
            f"a message of {row[2]} words, outcome agreement {'on' if row[3] else 'off'}"
            for r, row in enumerate(rows)
        )
        raise TransferRejectedError(
            "transfer rejected before any data moved: processes run different executor protocols or "
            f"options ({detail})",
            tuple(ctx.members),
        )
    most_rounds = max(max(row[4], 0) for row in rows)
    refused = [(r, row) for r, row in enumerate(rows) if row[6]]
    if refused:
        parts = [f"{name(r, row[7])}: {_decode_reason(row[_HEADER_WORDS:])}" for r, row in refused]
        raise TransferRejectedError(
            "transfer rejected before any data moved: " + "; ".join(parts),
            tuple(ctx.members[r] for r, _ in refused),
        )
    digests: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        digests.setdefault(row[5], []).append(ctx.members[r])
    if len(digests) > 1:
        detail = ", ".join(f"{d & (2**64 - 1):#018x} on processes {procs}" for d, procs in sorted(digests.items()))
        raise TransferRejectedError(
            "transfer rejected before any data moved: processes disagree about the transfer schedule "
            f"(plans, endpoints, budget, dtypes or endpoint_ranks): {detail}",
            tuple(ctx.members),
        )
    kinds: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        if row[8]:
            kinds.setdefault(row[8], []).append(ctx.members[r])
    if len(kinds) > 1:
        names = {v: k for k, v in _DEVICE_CODES.items()}
        detail = "; ".join(f"{names.get(k, 'other')} on processes {procs}" for k, procs in sorted(kinds.items()))
        raise TransferRejectedError(
            f"transfer rejected before any data moved: processes hold buffers on different device types ({detail}); "
            "one transfer uses one transport",
            tuple(p for procs in kinds.values() for p in procs),
        )
    return done, most_rounds


# ---------------------------------------------------------------------------------------------
# Moving.


@dataclass
class _Round:
    index: int
    works: list[Any]
    labels: list[tuple[str, int]]  # (direction, peer) of each work
    landing: list[tuple[_Message, _Piece, torch.Tensor | None]]
    buffers: list[torch.Tensor]


_Wire = tuple[int, _Message, int, _Piece, torch.Tensor, "torch.Tensor | None"]


def _wires(sched: _Schedule, r: int, direction: str) -> list[_Wire]:
    """Round r's pieces on every queue of one direction, in peer order and piece order: (peer,
    message, piece index, piece, the tensor on the wire, the queue's staging slot this round).

    The wire is the shard itself for a direct piece, else the piece's range of the slot
    (slots alternate by round parity, so round r+1 packs while round r is in flight).
    """
    queues = sched.outgoing if direction == "send" else sched.incoming
    out = []
    for peer in sorted(queues):
        message = queues[peer][r] if r < len(queues[peer]) else None
        if message is None:
            continue
        slot = sched.slots.get((direction, peer))
        stage = slot[r % _SLOTS] if slot is not None else None
        for i, piece in enumerate(message.pieces):
            wire = piece.direct
            if wire is None:
                assert stage is not None
                wire = stage[piece.start : piece.end]
            out.append((peer, message, i, piece, wire, stage))
    return out


def _pack(sched: _Schedule, message: _Message, piece: _Piece, wire: torch.Tensor) -> None:
    """Copy a staged piece's chunks from the source shards into its range of the staging slot."""
    for o, at in message.parts[piece.first : piece.last]:
        src = _view(sched.sources[o.key], o.offset, o.shape, o.strides)
        start = at - piece.start
        wire[start : start + o.nbytes].view(src.dtype).view(o.shape).copy_(src)


def _pack_ahead(sched: _Schedule) -> int:
    """Pack the staged sends of the first ``_SLOTS`` rounds (each has its own slot) while the
    verdict is in flight, and return how many rounds are packed.

    This only reads the caller's validated source shards and writes this process's own staging,
    so it changes nothing the caller can see if the verdict is a refusal, and it is bounded by
    the staging already allocated. The verdict exchange is a collective whose latency (about
    3 ms on 4 gloo processes sharing 2 cores, as much as any small collective there) would
    otherwise be idle time. Any failure here leaves the packing to ``_move``.
    """
    rounds = min(_SLOTS, max((len(q) for q in sched.outgoing.values()), default=0))
    try:
        with torch.no_grad():
            for r in range(rounds):
                for _peer, message, _i, piece, wire, _stage in _wires(sched, r, "send"):
                    if piece.direct is None:
                        _pack(sched, message, piece, wire)
    except Exception:
        return 0
    return rounds


def _move(
    ctx: _Context, sched: _Schedule, timeout: timedelta, packed: int = 0
) -> tuple[int, int, dict[int, int], dict[int, int]]:
    """Run the rounds, two in flight; returns (rounds, local bytes, sent per peer, received per peer).

    The staged sends of rounds below ``packed`` were packed already (``_pack_ahead``).
    """
    rounds = max((len(q) for q in (*sched.incoming.values(), *sched.outgoing.values())), default=0)
    sent = {peer: sum(m.payload for m in queue) for peer, queue in sched.outgoing.items()}
    received = {peer: sum(m.payload for m in queue) for peer, queue in sched.incoming.items()}
    local_bytes = 0
    to_global = dict(zip(ctx.members, ctx.global_ranks))

    def local_copy(item: _Local) -> int:
        seg = item.segment
        _view(sched.targets[item.target], seg.target_offset, seg.shape, seg.target_strides).copy_(
            _view(sched.sources[item.source], seg.source_offset, seg.shape, seg.source_strides)
        )
        return item.nbytes

    tagged = sched.device.type == "cpu" and not _ORDERED_BATCHES

    def tag(r: int, i: int) -> int:
        # Unique among the pieces of the rounds that can be in flight on one pair (fewer than 64;
        # a message has fewer than 2**24 pieces, as max_chunks is at most that); without tags
        # (NCCL ignores them anyway) messages match in posting order.
        return (r % (2 * _MAX_IN_FLIGHT)) << 24 | i if tagged else 0

    def post(r: int) -> _Round:
        """Post round r: every receive, then every send.

        Over gloo each piece carries a tag, so a send may be posted out of order: direct pieces
        (and staged ones packed during the verdict) go out at once and each other staged piece as
        soon as it is packed, overlapping the packing
        with the transfer. NCCL matches in posting order and needs one grouped batch, so there
        the whole round is packed first and posted in piece order. Labels for error messages are
        (direction, peer) pairs, worded only if a wait fails: this runs once per piece.
        """
        recvs: list[tuple[torch.Tensor, int, int]] = []  # (wire, global peer, tag)
        labels: list[tuple[str, int]] = []
        landing: list[tuple[_Message, _Piece, torch.Tensor | None]] = []
        buffers: list[torch.Tensor] = []
        ready: list[tuple[torch.Tensor, int, int, tuple[str, int]]] = []  # direct, or packed during the verdict
        staged: list[tuple[_Message, _Piece, torch.Tensor, int, int, tuple[str, int]]] = []
        in_order: list[tuple[torch.Tensor, int, int, tuple[str, int]]] = []  # piece order, which NCCL matches by
        for direction in ("receive", "send"):
            receive = direction == "receive"
            for peer, message, i, piece, wire, stage in _wires(sched, r, direction):
                label = (direction, peer)
                dst, t = to_global[peer], tag(r, i)
                buffers.append(wire)
                if receive:
                    recvs.append((wire, dst, t))
                    labels.append(label)
                    landing.append((message, piece, None if piece.direct is not None else stage))
                    continue
                in_order.append((wire, dst, t, label))
                if piece.direct is not None or r < packed:
                    ready.append((wire, dst, t, label))
                else:
                    staged.append((message, piece, wire, dst, t, label))

        works: list[Any] = []
        try:
            if tagged:
                # gloo has no batching of its own: one isend/irecv per piece costs less than a
                # batch call per packed piece.
                for wire, dst, t in recvs:
                    works.append(dist.irecv(wire, dst, ctx.group, t))
                for wire, dst, t, label in ready:
                    works.append(dist.isend(wire, dst, ctx.group, t))
                    labels.append(label)
                for message, piece, wire, dst, t, label in staged:
                    _pack(sched, message, piece, wire)
                    works.append(dist.isend(wire, dst, ctx.group, t))
                    labels.append(label)
            else:
                for message, piece, wire, _dst, _t, _label in staged:
                    _pack(sched, message, piece, wire)
                ops = [dist.P2POp(dist.irecv, wire, dst, ctx.group, t) for wire, dst, t in recvs]
                ops += [dist.P2POp(dist.isend, wire, dst, ctx.group, t) for wire, dst, t, _label in in_order]
                works = list(dist.batch_isend_irecv(ops)) if ops else []
                labels += [label for _wire, _dst, _t, label in in_order]
        except Exception as exc:
            _RETAINED.append(buffers)
            raise TransferExecutionError(
                f"round {r} of {rounds}: posting failed; target buffers may be partly written: {_describe(exc)}"
            ) from exc
        return _Round(r, works, labels, landing, buffers)

    def finish(rnd: _Round, in_flight: list[_Round]) -> None:
        # A round posted ahead waits behind earlier ones: its timeout runs from this wait.
        started = time.monotonic()
        deadline = started + timeout.total_seconds()
        for i, work in enumerate(rnd.works):
            left = max(deadline - time.monotonic(), 0.001)
            try:
                work.wait(timedelta(seconds=left))
            except Exception as exc:
                # Posted buffers may still be written by the transport: never free them.
                _RETAINED.append([(x.works, x.buffers) for x in in_flight])
                if len(rnd.works) == len(rnd.labels):
                    direction, peer = rnd.labels[i]
                    what = f"{direction} {'from' if direction == 'receive' else 'to'} process {peer}"
                else:
                    what = "its messages"
                # Rounds are posted ahead: a peer that died (or stalled) in any round in flight
                # fails the wait for the oldest one, so that is the earliest round it can have
                # been, never necessarily the one.
                last = max(x.index for x in in_flight)
                which = (f"round {rnd.index} of {rounds}" if last == rnd.index else
                         f"round {rnd.index} of {rounds} or a later one (rounds {rnd.index}-{last} were in flight)")
                raise TransferExecutionError(
                    f"{which}: {what} {_ended(started, timeout)}; target buffers may be partly written: "
                    f"{_describe(exc)}"
                ) from exc
        for message, piece, stage in rnd.landing:
            if stage is not None:
                for op, at in message.parts[piece.first : piece.last]:
                    dst = _view(sched.targets[op.key], op.offset, op.shape, op.strides)
                    dst.copy_(stage[at : at + op.nbytes].view(dst.dtype).view(op.shape))

    # Post ahead as far as staging allows: round s reuses slot s % 2 of a queue, so it waits only
    # for an in-flight round of the same parity that stages on a queue that s stages on too (a
    # message sent straight from/into shards holds no slot). Any such local choice of when to
    # wait is deadlock-free: a process only waits for rounds every peer has already posted or
    # will post without waiting on anything later.
    def staging(r: int) -> set[tuple[str, int]]:
        used = set()
        for direction, queues in (("send", sched.outgoing), ("receive", sched.incoming)):
            for peer, queue in queues.items():
                if r < len(queue) and any(p.direct is None for p in queue[r].pieces):
                    used.add((direction, peer))
        return used

    in_flight: list[tuple[_Round, set[tuple[str, int]]]] = []
    for r in range(rounds):
        need = staging(r)
        while in_flight and (
            len(in_flight) >= _MAX_IN_FLIGHT
            or any(t.index % _SLOTS == r % _SLOTS and used & need for t, used in in_flight)
        ):
            oldest, _used = in_flight.pop(0)
            finish(oldest, [oldest] + [t for t, _u in in_flight])
        in_flight.append((post(r), need))
        # Local copies overlap the rounds in flight: an even share of them per round.
        lo, hi = r * len(sched.local) // rounds, (r + 1) * len(sched.local) // rounds
        for item in sched.local[lo:hi]:
            local_bytes += local_copy(item)
    while in_flight:
        oldest, _used = in_flight.pop(0)
        finish(oldest, [oldest] + [t for t, _u in in_flight])
    if rounds == 0:
        for item in sched.local:
            local_bytes += local_copy(item)
    return rounds, local_bytes, sent, received


def _drain(device: torch.device, timeout: timedelta, sched: _Schedule) -> None:
    """Wait, bounded, for this process's queued CUDA work (unpacking copies) to finish.

    ``torch.cuda.synchronize`` has no timeout; an event polled against the deadline does, and on
    a timeout the staging is retained rather than freed under kernels that may still read it.
    """
    if device.type != "cuda":
        return
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    deadline = time.monotonic() + timeout.total_seconds()
    while not event.query():  # type: ignore[no-untyped-call]
        if time.monotonic() > deadline:
            _RETAINED.append(sched.slots)
            raise TransferExecutionError(
                f"queued CUDA copies did not finish within {timeout}; target buffers may be partly written"
            )
        time.sleep(0.0005)


# ---------------------------------------------------------------------------------------------
# The collective outcome.

_OK, _FAILED, _CONCURRENT = 0, 1, 2  # status words of the outcome agreement
_STATUS_TEXT = {_FAILED: "failed after the verdict", _CONCURRENT: "had another call on this group start meanwhile"}
_LISTED_PARAMETERS = 16  # parameters an error message lists targets of (``targets`` holds them all)


def _written_by(sched: _Schedule, failed: set[int] | None) -> dict[str, tuple[int, ...]]:
    """Parameter → target locations that a failed process's queues or local copies write: every
    segment with a failed process on either side (``None``: any process may have failed).

    A pure function of the plans, the endpoints and the failed set, which the agreement makes
    the same on every process, so every process names the same targets.
    """
    out: dict[str, set[int]] = {}
    ends = sched.endpoints
    for name, param in sched.params.items():
        for seg in param.segments:
            if failed is None or ends is None or {
                ends.source.get(seg.source_rank), ends.target.get(seg.target_rank)
            } & failed:
                out.setdefault(name, set()).add(seg.target_rank)
    return {name: tuple(sorted(locs)) for name, locs in sorted(out.items())}


def _describe_targets(targets: Mapping[str, tuple[int, ...]]) -> str:
    if not targets:
        return "none"
    items = list(targets.items())
    text = "; ".join(f"{name!r} locations {list(locs)}" for name, locs in items[:_LISTED_PARAMETERS])
    if len(items) > _LISTED_PARAMETERS:
        text += f"; and {len(items) - _LISTED_PARAMETERS} more parameters (see the error's targets)"
    return text


def _outcome(
    ctx: _Context,
    sched: _Schedule,
    device: torch.device,
    status: int,
    failure: BaseException | None,
    timeout: timedelta,
) -> None:
    """After the last round: every process all-gathers its status word, and if any process failed
    every surviving one raises ``TransferExecutionError`` naming the same targets.

    Without it, a process with no traffic to a dead or stuck peer returned normally while the
    peer's targets were partly written. The wait is bounded by ``timeout`` for each round of the
    longest schedule (each of its rounds may wait that long) plus one; if the agreement itself
    fails (a dead peer), nobody can know who failed, so every target of the batch is named.
    """
    own = str(failure) if failure is not None else "this process finished its part"
    started, limit = time.monotonic(), timeout * (1 + sched.most_rounds)
    try:
        rows, _none = _gather(ctx, device, [status], limit)
    except Exception as exc:
        targets = _written_by(sched, None)
        raise TransferExecutionError(
            f"{own}; the outcome agreement {_ended(started, limit)} ({_describe(exc)}), so any process may have "
            f"failed; target buffers may be partly written: every target of the batch: {_describe_targets(targets)}",
            targets,
        ) from (failure or exc)
    failed = {ctx.members[r]: row[0] for r, row in enumerate(rows) if row[0] != _OK}
    if not failed:
        return
    targets = _written_by(sched, set(failed))
    who = ", ".join(
        f"process {p} {_STATUS_TEXT.get(code, f'reported status {code}')}" for p, code in sorted(failed.items())
    )
    raise TransferExecutionError(
        f"{own}; the processes agree: {who}; target buffers that may be partly written: {_describe_targets(targets)}",
        targets,
        tuple(sorted(failed)),
    ) from failure


# ---------------------------------------------------------------------------------------------
# Calls in flight.


@dataclass
class _Call:
    """A call in flight on a process group in this process; ``poisoned`` once another call on the
    same group starts before it ends (``_enter``)."""

    group: object  # held, so that its id stays this group's while the call is registered
    poisoned: bool = False


_IN_FLIGHT: dict[int, _Call] = {}
_IN_FLIGHT_LOCK = threading.Lock()
_CONCURRENT_TEXT = (
    "another execute_transfers call on this process group started in this process while this one was in flight; "
    "calls on a group are matched in the order each process makes them, so two at once would mix their "
    "messages: both fail"
)


def _enter(ctx: _Context) -> _Call | None:
    """Register a call on its group; refuse it if another call on the group is in flight here.

    Calls on a group are matched in the order each process makes them (as torch.distributed's
    collectives are), so two in flight at once from one process (two threads) would pair their
    verdicts, outcomes and messages with the wrong peers' calls. Both fail: this one at once,
    before it touches the group (a lone raise strands nobody: no peer can be inside this call's
    collectives, which it never posts), and the one in flight through its verdict, if it has not
    been exchanged yet, or else the outcome agreement, so every process of that call raises.
    A single process (no collective) has nothing to mix and is not registered.
    """
    if not ctx.collective:
        return None
    group = ctx.group if ctx.group is not None else dist.group.WORLD
    with _IN_FLIGHT_LOCK:
        running = _IN_FLIGHT.get(id(group))
        if running is not None:
            running.poisoned = True
            raise TransferRejectedError(
                f"transfer rejected before any data moved: process {ctx.me}: {_CONCURRENT_TEXT}", (ctx.me,)
            )
        call = _IN_FLIGHT[id(group)] = _Call(group)
    return call


def _leave(call: _Call | None) -> None:
    if call is not None:
        with _IN_FLIGHT_LOCK:
            if _IN_FLIGHT.get(id(call.group)) is call:
                del _IN_FLIGHT[id(call.group)]


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
    outcome: bool = True,
    key: str | None = None,
) -> TransferStats:
    """Move a whole batch (parameter name → plan) as one collective over ``group``.

    Every process of ``group`` must call this with the same plans, endpoints, budget, dtypes and
    ``endpoint_ranks`` (checked by digest); buffers hold only what this process owns, keyed by
    parameter and then by map location (a process may own none). Shard buffers must be
    contiguous tensors of the declared dtype, all on one device of this process, and all processes'
    buffers on one device type (CPU over gloo, CUDA over NCCL; the group's backend string may map
    both); they are written in place, never resized. ``maps`` (parameter → (target map, source
    map)) makes each process judge the plans with ``refplan.verify.verify_plan`` first. Without
    ``torch.distributed`` initialized (and no ``group``) this is a single process: every endpoint
    must be process 0.

    Raises ``TransferRejectedError`` on every process, before any byte moves, if any process's
    checks fail or the processes disagree about the schedule; ``TransferExecutionError`` if the
    transport fails or a round exceeds ``timeout`` afterwards. With ``outcome`` (the default)
    the processes then agree on the outcome, so that every surviving process raises it, naming
    the same targets that may be partly written, even one with no traffic to the process that
    failed; ``outcome=False`` skips that agreement (one small all-gather) for callers that
    combine outcomes themselves, and then only the processes whose own part failed raise.

    Calls on a group are matched in the order each process makes them. ``key`` (any string, the
    same on every process, e.g. ``"weights"``) is folded into the digest, so two syncs of the same
    shape issued in different orders on different processes are refused before any byte moves.
    Two calls in flight at once on one group in one process (two threads) both fail: the later
    one at once with ``TransferRejectedError``, the earlier one on every process of its call.
    """
    started = time.perf_counter()
    ctx = _context(group, endpoint_ranks if endpoint_ranks in ("global", "group") else "global")
    call = _enter(ctx)
    try:
        return _execute(
            ctx, call, started, plans, source_buffers, target_buffers, endpoints, dtypes, budget, timeout, maps,
            endpoint_ranks, outcome, key,
        )
    finally:
        _leave(call)


def _execute(
    ctx: _Context,
    call: _Call | None,
    started: float,
    plans: Mapping[str, TransferPlan],
    source_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    target_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    endpoints: TransferEndpoints,
    dtypes: Mapping[str, torch.dtype],
    budget: StagingBudget,
    timeout: timedelta,
    maps: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]] | None,
    endpoint_ranks: EndpointRanks,
    outcome: bool,
    key: str | None,
) -> TransferStats:
    """``execute_transfers`` once its call is registered on the group (``_enter``)."""
    reason: str | None = None
    sched = _Schedule()
    holds: torch.device | None = None
    try:
        holds = _buffers_device(source_buffers, target_buffers)
    except _Refusal as exc:
        reason = str(exc)
    except Exception as exc:
        reason = f"unexpected {_describe(exc)} while checking buffers"
    try:
        verdict_device = _verdict_device(ctx, holds) if ctx.collective else torch.device("cpu")
    except Exception as exc:  # CUDA unusable here; the verdict goes out on CPU and may not match
        verdict_device = torch.device("cpu")
        reason = reason or f"cannot select a CUDA device for the verdict: {_describe(exc)}"
    if reason is None:
        try:
            sched = _prepare(
                ctx, plans, source_buffers, target_buffers, endpoints, dtypes, budget, maps, endpoint_ranks, holds, key
            )
        except _Refusal as exc:
            reason = str(exc)
        except Exception as exc:  # a bug or odd input must still become a verdict, never a lone raise
            reason = f"unexpected {_describe(exc)} while checking"
    try:
        # A refusal is reported before any digest is compared, so a refusing process skips the
        # digest: for a batch refused for its size it would cost as much as the checks it skipped.
        digest = 0 if reason is not None else sched.digest if sched.digest is not None else schedule_digest(
            plans, endpoints, budget, dtypes, str(endpoint_ranks), key
        )
    except Exception as exc:
        digest = 0
        reason = reason or f"cannot compute the schedule digest: {_describe(exc)}"
    if call is not None and call.poisoned and reason is None:
        reason = _CONCURRENT_TEXT
    ahead = None if reason is not None or not sched.outgoing else partial(_pack_ahead, sched)
    mine = max((len(q) for q in (*sched.incoming.values(), *sched.outgoing.values())), default=0)
    phases: dict[str, float] = {"checks": time.perf_counter() - started}
    packed, sched.most_rounds = _exchange(
        ctx, verdict_device, digest, reason, holds, timeout, ahead, outcome is not False, mine, phases
    )

    moving = time.perf_counter()
    failure: TransferExecutionError | None = None
    rounds, local_bytes = 0, 0
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    with torch.no_grad():
        try:
            rounds, local_bytes, sent, received = _move(ctx, sched, timeout, packed)
            _drain(sched.device, timeout, sched)
        except TransferExecutionError as exc:
            failure = exc
        except Exception as exc:  # every input was checked; what is left is the transport's
            _RETAINED.append(sched.slots)
            failure = TransferExecutionError(
                f"moving failed after the verdict; target buffers may be partly written: {_describe(exc)}"
            )
            failure.__cause__ = exc
    moved = time.perf_counter()
    phases["move"] = moved - moving
    if outcome is not False and ctx.collective:
        status = _FAILED if failure is not None else _CONCURRENT if call is not None and call.poisoned else _OK
        _outcome(ctx, sched, verdict_device, status, failure, timeout)
        phases["outcome"] = time.perf_counter() - moved
    if failure is not None:
        if not failure.targets and outcome is not False:
            failure.targets = _written_by(sched, {ctx.me})
        raise failure
    if call is not None and call.poisoned:  # started after this call's status went out (or outcome=False)
        raise TransferExecutionError(
            f"{_CONCURRENT_TEXT}; this process's part finished, but the call cannot count as done",
            _written_by(sched, {ctx.me}) if outcome is not False else None,
            (ctx.me,),
        )
    _recycle(sched, budget.total_bytes)
    done = time.perf_counter()
    queues = (*sched.incoming.values(), *sched.outgoing.values())
    chunks = sum(len(m.parts) for q in queues for m in q)
    messages = sum(len(m.pieces) for q in queues for m in q)
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
        direct_messages=sum(1 for q in queues for m in q for p in m.pieces if p.direct is not None),
        phases=phases,
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
    outcome: bool = True,
    key: str | None = None,
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
        outcome=outcome,
        key=key,
    )
