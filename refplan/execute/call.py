"""The entry points: ``execute_transfers`` runs the phases in order (checks, verdict, transport,
outcome) for a call registered on its group, so that two calls in flight at once on one group in
one process are detected and both fail; ``release_staging`` frees what calls keep between them.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist

from ..maps import ParamAffineMap
from ..plan import TransferPlan
from ..requests import TransferEndpoints
from . import checks, schedule
from .checks import _buffers_device, _prepare
from .common import (
    _RETAINED,
    DEFAULT_TIMEOUT,
    EndpointRanks,
    StagingBudget,
    TransferExecutionError,
    TransferRejectedError,
    TransferStats,
    _checked_timeout,
    _Context,
    _context,
    _describe,
    _Refusal,
)
from .outcome import _CONCURRENT, _FAILED, _OK, _outcome, _written_by
from .schedule import _recycle, _Schedule
from .summary import schedule_digests
from .transport import _drain, _keep, _mark_written, _move, _pack_ahead, _program
from .verdict import _exchange, _group_of, _verdict_device, broken, mark_broken


@dataclass
class _Call:
    """A call in flight on a process group in this process; ``poisoned`` once another call on the
    same group starts before it ends (``_enter``); ``number`` its number on the group here."""

    group: object  # held, so that its id stays this group's while the call is registered
    poisoned: bool = False
    number: int = 0


_NUMBERS: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
"""Calls started on each group in this process, refused ones included (``_enter``): a call's number
goes into its verdict (``verdict._exchange``), so processes at different calls on one group are
refused instead of paired."""


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
    failed = broken(group)
    if failed is not None:
        raise TransferRejectedError(
            f"transfer rejected before any data moved: process {ctx.me}: an earlier call's collective on this "
            f"process group failed in this process ({failed}); a peer may still complete it, and its next "
            "collective would meet this call, so the group is not used again: use a new process group "
            "(dist.new_group)",
            (ctx.me,),
        )
    with _IN_FLIGHT_LOCK:
        # Counted before the refusal below: the refused call is one this process made, and its
        # peers may have made it for real (the race is per process), so its number is spent here
        # as there. The next call's number then differs from the one its peers' pending call
        # carries, and their verdicts refuse the pair instead of matching it.
        try:
            number = _NUMBERS.get(group, 0) + 1
            _NUMBERS[group] = number
        except TypeError:  # a group object that cannot be weakly referenced: unnumbered (0) everywhere
            number = 0
        running = _IN_FLIGHT.get(id(group))
        if running is not None:
            running.poisoned = True
            raise TransferRejectedError(
                f"transfer rejected before any data moved: process {ctx.me}: {_CONCURRENT_TEXT}", (ctx.me,)
            )
        call = _IN_FLIGHT[id(group)] = _Call(group, number=number)
    return call


def _leave(call: _Call | None) -> bool:
    """Unregister ``call``; whether another call marked it before it left. One step under the lock,
    so a call that starts later finds nothing in flight, and one that started earlier was seen."""
    if call is None:
        return False
    with _IN_FLIGHT_LOCK:
        if _IN_FLIGHT.get(id(call.group)) is call:
            del _IN_FLIGHT[id(call.group)]
        return call.poisoned


def _finished_meanwhile(ctx: _Context, sched: _Schedule, outcome: object) -> TransferExecutionError:
    """This process's part of a call finished while another call on its group started here."""
    return TransferExecutionError(
        f"{_CONCURRENT_TEXT}; this process's part finished, but the call cannot count as done",
        _written_by(sched, {ctx.me}) if outcome is not False else None,
        (ctx.me,),
    )


def execute_transfers(
    plans: Mapping[str, TransferPlan],
    source_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    target_buffers: Mapping[str, Mapping[int, torch.Tensor]],
    endpoints: TransferEndpoints,
    *,
    dtypes: Mapping[str, torch.dtype],
    budget: StagingBudget = StagingBudget(),  # noqa: B008  # frozen, so a shared default is safe
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

    ``timeout`` bounds every wait of the call (the verdict, each round, the outcome); it is checked
    like the other arguments, a ``timedelta`` from ``MIN_TIMEOUT`` (1 ms: the transports count whole
    milliseconds) to ``MAX_TIMEOUT`` (365 days: gloo's clock arithmetic overflows for centuries).

    Raises ``TransferRejectedError`` on every process, before any byte moves, if any process's
    checks fail or the processes disagree about the schedule; ``TransferExecutionError`` if the
    transport fails or a round exceeds ``timeout`` afterwards. With ``outcome`` (the default)
    the processes then agree on the outcome, so that every surviving process raises it, naming
    the same targets that may be partly written, even one with no traffic to the process that
    failed; ``outcome=False`` skips that agreement (one small all-reduce) for callers that
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
    try:
        holds: torch.device | None = None
        try:
            timeout = _checked_timeout(timeout)
        except _Refusal as exc:  # refused like any other argument, so this process's verdict goes out
            reason, timeout = str(exc), DEFAULT_TIMEOUT  # under the default: the others wait at most that
        if type(outcome) is not bool:  # ``None`` or ``"no"`` read as "on" before: refused like the rest
            reason = reason or f"outcome must be a bool, got {type(outcome).__name__}"
            outcome = True
        try:
            holds = _buffers_device(source_buffers, target_buffers)
        except _Refusal as exc:
            reason = reason or str(exc)
        except Exception as exc:
            reason = reason or f"unexpected {_describe(exc)} while checking buffers"
        try:
            verdict_device = _verdict_device(ctx, holds) if ctx.collective else torch.device("cpu")
        except Exception as exc:  # CUDA unusable here; the verdict goes out on CPU and may not match
            verdict_device = torch.device("cpu")
            reason = reason or f"cannot select a CUDA device for the verdict: {_describe(exc)}"
        if reason is None:
            try:
                sched = _prepare(
                    ctx, plans, source_buffers, target_buffers, endpoints, dtypes, budget, maps, endpoint_ranks,
                    holds, key,
                )
            except _Refusal as exc:
                reason = str(exc)
            except Exception as exc:  # a bug or odd input must still become a verdict, never a lone raise
                reason = f"unexpected {_describe(exc)} while checking"
        try:
            # A refusal is reported before any digest is compared, so a refusing process skips the
            # digest: for a batch refused for its size it would cost as much as the checks it skipped.
            # Of the plans and dtypes as checked (``sched.params``: the same objects, or exact copies of what a
            # plan that could read differently each time held when it was checked).
            digest, summary = (0, ()) if reason is not None else sched.digest or schedule_digests(
                {name: param.plan for name, param in sched.params.items()}, sched.endpoints or endpoints,
                sched.budget or budget, {name: param.dtype for name, param in sched.params.items()},
                str(endpoint_ranks), key
            )
        except Exception as exc:
            digest, summary = 0, ()
            reason = reason or f"cannot compute the schedule digest: {_describe(exc)}"
        if call is not None and call.poisoned and reason is None:
            reason = _CONCURRENT_TEXT
        # While the verdict is in flight: senders pack their first rounds, and every process that
        # moves anything makes its transport's views (``_pack_ahead``), which a receiver would
        # otherwise make once the verdict is in, before posting the receives every sender waits on.
        moves = sched.outgoing or sched.incoming or sched.local
        ahead = None if reason is not None or not moves else partial(_pack_ahead, sched)
        mine = max((len(q) for q in (*sched.incoming.values(), *sched.outgoing.values())), default=0)
        phases: dict[str, float] = {"checks": time.perf_counter() - started}
        packed, sched.most_rounds = _exchange(
            ctx, verdict_device, digest, reason, holds, timeout, ahead, outcome is not False, mine, phases,
            call.number if call is not None else 0, summary, sched.params if reason is None else (),
        )

        moving = time.perf_counter()
        failure: TransferExecutionError | None = None
        rounds, local_bytes = 0, 0
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        with torch.no_grad():
            try:
                # On CUDA the buffers' device is the current one while moving, as torch asks of
                # batch_isend_irecv's callers ("must set the current GPU device"), whatever the
                # caller's current device is; nothing else reads the current device here.
                with torch.cuda.device(sched.device) if sched.device.type == "cuda" else contextlib.nullcontext():
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
            _mark_written(sched)
        moved = time.perf_counter()
        phases["move"] = moved - moving
        if outcome is not False and ctx.collective:
            status = _FAILED if failure is not None else _CONCURRENT if call is not None and call.poisoned else _OK
            try:
                _outcome(ctx, sched, verdict_device, status, failure, timeout)
            except TransferExecutionError as exc:
                _nccl_failed(ctx, sched, exc)
                raise
            phases["outcome"] = time.perf_counter() - moved
        if failure is not None:
            _nccl_failed(ctx, sched, failure)
            if not failure.targets and outcome is not False:
                failure.targets = _written_by(sched, {ctx.me})
            raise failure
        if call is not None and call.poisoned:  # started after this call's status went out (or outcome=False)
            raise _finished_meanwhile(ctx, sched, outcome)
        _keep(sched, (sched.budget or budget).total_bytes)  # before the arenas go back: a release there drops it
        _recycle(sched, (sched.budget or budget).total_bytes)
        if _leave(call):
            # Marked after the check above, before this call left the group: the other call was
            # refused as concurrent, so this one must not return normally either (an outside
            # probe held it in ``_recycle`` and it returned while the other raised, 2026-12-07).
            raise _finished_meanwhile(ctx, sched, outcome)
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
            direct_messages=_program(sched).direct,  # the one ``_move`` ran
            phases=phases,
        )
    finally:
        # Arenas still held here were taken (from the pool, where a kept program may view them) and
        # are not going back: a refused call drops them, a failed one keeps them (``_RETAINED``).
        # A kept program that views one would hold staging that no bound counts (issue 26, item 4).
        if sched.arenas:
            schedule._PROGRAMS.clear()
            _record_current_stream(sched.arenas)


def _nccl_failed(ctx: _Context, sched: _Schedule, failure: BaseException) -> None:
    """After a failed call whose rounds went over NCCL, refuse its group from then on.

    A round's wait that times out aborts the NCCL communicator on that process, and torch does
    not promise anything of a group after a failed operation; the next call's verdict, settled
    through the store, would otherwise post round 0 on the aborted communicator and fail after
    the verdict with the peers' targets partly written. Every surviving process learns of a
    failure anywhere from the outcome, so every one marks the group (``verdict.mark_broken``)."""
    if ctx.collective and sched.device.type == "cuda":
        mark_broken(_group_of(ctx), "a transfer over NCCL", failure)


def _record_current_stream(arenas: list[torch.Tensor]) -> None:
    """Before a call lets go of CUDA staging it packed into (a refusal, or an allocation that
    failed part-way), mark each arena as used by the current stream, where the packing copies
    were queued (``Tensor.record_stream``): the caching allocator knows only the stream an arena
    was allocated on, and a pooled arena may come from a call made under another stream
    (``torch.cuda.stream(...)``, another thread). Dropped without this, its memory could be
    handed to a tensor on the allocating stream while this stream's copies still write into it.
    Never raises: it runs while a refusal is being raised."""
    for arena in arenas:
        if arena.device.type == "cuda":
            with contextlib.suppress(Exception):
                arena.record_stream(torch.cuda.current_stream(arena.device))


SINGLE = "param"
"""The parameter name ``execute_transfer`` uses for its one plan (as ``plan_transfer`` does)."""


def execute_transfer(
    plan: TransferPlan,
    source_buffers: Mapping[int, torch.Tensor],
    target_buffers: Mapping[int, torch.Tensor],
    endpoints: TransferEndpoints,
    *,
    dtype: torch.dtype,
    budget: StagingBudget = StagingBudget(),  # noqa: B008  # frozen, so a shared default is safe
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


def release_staging() -> None:
    """Free the staging memory kept for reuse between calls (e.g. before a memory-hungry phase),
    and forget the batches whose checks and layouts were remembered (which keeps their plans alive)
    and the transport's views kept for warm calls (which keep the buffers they view alive, and put
    a finalizer, a weak reference, on each: ``torch.utils.swap_tensors`` refuses such a tensor, so
    call this before swapping parameters a sync used)."""
    schedule._POOL.clear()
    schedule._PROGRAMS.clear()
    schedule._LAYOUTS.clear()
    checks._CHECKED.clear()
    checks._JUDGED.clear()  # and the judgements against maps, which keep their plans and maps alive
