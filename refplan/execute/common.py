"""What every phase of the executor shares: its errors, its budget and statistics, the call's
context (ranks and backends), and the refusal that becomes a verdict.

Kept apart from the phases so that each phase module imports only what it needs, and so that the
one list of staging that must never be freed (``_RETAINED``) lives in exactly one place.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

from ..errors import AffineTransferError, describe_exception
from ..limits import MAX_TIMEOUT as MAX_TIMEOUT  # the bounds of ``_checked_timeout`` (why: there)
from ..limits import MIN_TIMEOUT as MIN_TIMEOUT

EndpointRanks = Literal["global", "group"]


DEFAULT_TIMEOUT = timedelta(seconds=300)
"""How long one exchange (the verdict, or one round) may wait before it becomes an error."""

_RETAINED: list[object] = []
"""Staging (and work handles) of transfers that failed after the verdict.

After a timed-out wait the transport may still write into a posted receive buffer (gloo's I/O
threads, or kernels queued on a CUDA stream), so freeing it could hand live memory to another
tensor. It is kept here for the life of the process; the process group should be aborted or
destroyed (and usually the process restarted) after a ``TransferExecutionError``.
``retained_bytes()`` says how much it holds.
"""


def retained_bytes() -> int:
    """Bytes of memory this process holds for transfers that failed after the verdict.

    Why it exists: that memory can never be freed safely (see ``_RETAINED``), so it lies outside
    the staging pool's bound (``StagingBudget.total_bytes``) and grows with every failed call. A
    process that goes on after a ``TransferExecutionError`` instead of restarting can watch it
    here (as it watches ``torch.cuda.memory_allocated``) and restart once it is too large. Counted
    per storage, once however many views reach it: the staging arenas and, for messages that land
    in or leave from a caller's shard directly, that shard's storage, which is held too.
    """
    seen: dict[tuple[str, int], int] = {}
    stack: list[object] = list(_RETAINED)
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            seen[(str(item.device), storage.data_ptr())] = storage.nbytes()
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sum(seen.values())


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
    movement), estimated by arithmetic before anything is built (``_work``): every parameter of
    the batch costs ``_PARAMETER_WORK`` units and every segment ``_SEGMENT_WORK`` (each process
    checks and hashes all of them), every network chunk of this process ``_CHUNK_WORK`` and every
    round of its schedule ``_ROUND_WORK``, and what is large beyond those counts (axes past 8 a
    segment, buffers past 2 a parameter, endpoint entries past 1 024, the pieces of ``maps``:
    ``checks._AXES_PER_UNIT`` and its neighbours); a unit is about 20 µs on 4 processes sharing 2 cores.
    The default (2**17, about 2.6 s there; at most 26 214 one-segment parameters, or one parameter
    of 65 534 segments, in a batch) refuses a schedule of many tiny pieces (10**5 one-element segments, a
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
    sent or received, ``messages`` the wire messages those chunks travelled in (consecutive small
    chunks of one peer queue share a staged message up to the budget, and consecutive in-place
    chunks that continue each other at both ends one message), ``direct_messages`` those sent from or
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
    non_member = getattr(getattr(dist, "GroupMember", None), "NON_GROUP_MEMBER", None)  # new_group's answer outside
    if group is not None and group is not non_member and not isinstance(group, dist.ProcessGroup):
        # A bare KeyError from torch's group registry before; no peer's collective can include a
        # call whose group this process cannot name.
        raise TransferRejectedError(
            f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}"
        )
    try:
        global_ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
        group_rank = dist.get_rank(group)
    except Exception as exc:
        # A bare KeyError from torch's registry before (an outside audit, 2026-12-06): a group
        # destroyed with ``destroy_process_group``, or one from before the last
        # ``init_process_group``. This process cannot take part in its collectives at all, so no
        # peer can be waiting on a verdict from this call.
        raise TransferRejectedError(
            "group is not a process group torch.distributed knows in this process (destroyed with "
            f"destroy_process_group, or made before the last init_process_group; torch raised {type(exc).__name__}); "
            "pass a live group"
        ) from exc
    if group_rank < 0:
        # Not a member: no member's collective includes this process, so raising strands nobody.
        raise TransferRejectedError(f"global rank {dist.get_rank()} is not a member of the given process group")
    try:
        config = dist.get_backend_config(group) if hasattr(dist, "get_backend_config") else dist.get_backend(group)
        backend = str(config)
    except Exception:  # the backend is the group's: every member falls back identically
        try:
            backend = str(dist.get_backend(group))
        except Exception:  # no backend to name: ``parse_backend`` gives no transport, refused by device
            backend = ""
    members = tuple(range(len(global_ranks))) if mode == "group" else global_ranks
    me = group_rank if mode == "group" else dist.get_rank()
    return _Context(
        group, len(global_ranks) > 1, me, members, global_ranks, dist.get_rank(), backend, parse_backend(backend)
    )


class _Refusal(Exception):
    """A local check failed; becomes this process's verdict, never a lone raise."""


_describe = describe_exception


def _checked_timeout(value: object) -> timedelta:
    """``value`` as an exact ``timedelta`` within [``MIN_TIMEOUT``, ``MAX_TIMEOUT``], else a refusal
    naming what was given. Read once, through ``timedelta``'s own addition (C-level fields), so that
    a subclass cannot answer each later use differently."""
    if not isinstance(value, timedelta):
        raise _Refusal(f"timeout must be a datetime.timedelta, not {type(value).__name__}")
    exact = timedelta.__add__(timedelta(0), value)
    if not MIN_TIMEOUT <= exact <= MAX_TIMEOUT:
        raise _Refusal(
            f"timeout must be between {MIN_TIMEOUT // timedelta(milliseconds=1)} ms and {MAX_TIMEOUT.days} days, "
            f"not {exact}: gloo and the store count whole milliseconds, and a timeout of centuries overflows "
            "their clocks"
        )
    return exact


def _ended(started: float, limit: timedelta) -> str:
    """How a bounded wait that raised ended, by what happened: "timed out after 0:00:15" only when
    its time was up, else "failed after 0.02 s (timeout 0:00:15)" (a dead peer's closed connection
    ends a wait at once, and used to be reported as "failed or timed out after" the whole timeout)."""
    elapsed = time.monotonic() - started
    if elapsed >= limit.total_seconds() * 0.99:
        return f"timed out after {limit}"
    return f"failed after {elapsed:.2f} s (timeout {limit})"
