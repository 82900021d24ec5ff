"""The collective outcome: after the last round, every process's status word, agreed.

So that a process with no traffic to a failed peer does not return normally while that peer's
targets are partly written: every surviving process raises, naming the same targets.

The agreement is the maximum of the 1-word status over the processes, through the group's store
where its hello linked it (``agree``: a process that failed writes its status as the answer at
once, so nobody waits for a peer that may be dead), else one 1-word ``all_reduce(MAX)``: every
process sees the same answer, so all take the same branch; only when it is not ``_OK`` do they
all-gather the words over the group to learn who failed. A warm call's fixed cost is mostly such
small agreements (issue 26, item 8c).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from . import agree
from .common import MAX_TIMEOUT, TransferExecutionError, _Context, _describe, _ended
from .schedule import _Schedule
from .verdict import _gather, mark_broken

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


def _statuses(
    ctx: _Context, link: agree._Link | None, device: torch.device, status: int, timeout: timedelta
) -> list[int]:
    """Every process's status word, by group rank, once the agreement said one failed.

    One all-gather, except on a group whose collectives are NCCL's (``device`` is CUDA) and that
    agrees through the store: there the store answers (one word per process, its own status at
    its group rank, so the elementwise maximum is every process's). After a failed round on NCCL
    the communicator is aborted (a wait that times out aborts it), so an all-gather failed at
    once on that process and left every process to name every target of the batch. Over gloo
    the all-gather stays: a dead peer's closed connection ends it at once, where the store would
    wait out the whole limit for a record that never comes.
    """
    if link is not None and device.type == "cuda":
        words = [_OK] * len(ctx.members)
        words[ctx.members.index(ctx.me)] = status
        # The outcome's count before it may have been settled early (a failure is written at
        # once), so a peer may still be reading the verdict's answer: the keys two agreements
        # back are deleted by the process that completes this count, never by the first here.
        return agree.agree_max(link, words, timeout, kind="o", forget_first=False)[0]
    rows, _none = _gather(ctx, device, [status], timeout)
    return [row[0] for row in rows]


def _outcome(
    ctx: _Context,
    sched: _Schedule,
    device: torch.device,
    status: int,
    failure: BaseException | None,
    timeout: timedelta,
) -> None:
    """After the last round: the processes agree on the highest status word (one all-reduce), and
    if any process failed they all-gather the words and every surviving one raises
    ``TransferExecutionError`` naming the same targets.

    Without it, a process with no traffic to a dead or stuck peer returned normally while the
    peer's targets were partly written. The wait is bounded by ``timeout`` for each round of the
    longest schedule (each of its rounds may wait that long) plus one, at most ``MAX_TIMEOUT``;
    if the agreement itself fails (a dead peer), nobody can know who failed, so every target of
    the batch is named.
    """
    own = str(failure) if failure is not None else "this process finished its part"
    # Capped at the longest timeout a call takes: a product of a long (legal) timeout and many
    # rounds went past what gloo's clock arithmetic holds, and a finished all-reduce's wait then
    # failed at once ("Operation timed out!" with 365 days and 512 rounds), on every process.
    started, limit = time.monotonic(), min(timeout * (1 + sched.most_rounds), MAX_TIMEOUT)
    try:
        link = agree.link_of(ctx.group if ctx.group is not None else dist.group.WORLD)
        if link is not None:
            # Every process that finished sends the same word (``_OK``): the count decides.
            answer = agree.agree_max(link, [status], limit, early=status != _OK, uniform=True, kind="o")[0][0]
        else:
            word = torch.tensor([status], dtype=torch.int64, device=device)
            try:
                work = dist.all_reduce(word, op=dist.ReduceOp.MAX, group=ctx.group, async_op=True)
                if work is not None:
                    work.wait(limit)
            except Exception as exc:
                mark_broken(ctx.group if ctx.group is not None else dist.group.WORLD, "an outcome's all-reduce", exc)
                raise
            answer = int(word.item())
        if answer == _OK:  # the same answer everywhere: every process returns here
            return
        statuses = _statuses(ctx, link, device, status, max(limit - timedelta(seconds=time.monotonic() - started),
                                                              timeout))
    except Exception as exc:
        targets = _written_by(sched, None)
        # Its limit is not the caller's timeout as given, so the message says where it comes from
        # (a caller who passed 5 s read "timeout 0:00:10" and nothing else: an outside probe).
        why = "" if limit == timeout else (
            f"; its limit is the call's timeout {timeout} for each of the {sched.most_rounds} rounds of the "
            "longest schedule, plus one" + (f", capped at {MAX_TIMEOUT}" if limit == MAX_TIMEOUT else "")
        )
        raise TransferExecutionError(
            f"{own}; the outcome agreement {_ended(started, limit)} ({_describe(exc)}){why}, so any process may "
            f"have failed; target buffers may be partly written: every target of the batch: "
            f"{_describe_targets(targets)}",
            targets,
        ) from (failure or exc)
    failed = {ctx.members[r]: code for r, code in enumerate(statuses) if code != _OK}
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
