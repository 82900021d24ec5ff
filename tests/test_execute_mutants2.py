"""Guarantees of ``spec/executor.md`` that the second part of a hand mutation audit of
``refplan/execute`` found unguarded: each test here failed on a small, plausible mutant of the
executor (named in its docstring) and passes on the real code.

Deterministic: the checks before the verdict (one process), the store agreement driven step by
step on one in-process store, and one launch of two gloo processes whose receiver waits, in a
fixed order, for every receive it posted (so that a staging slot reused too early is seen every
time, not only when the network happens to be fast).
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import HashStore  # torch.distributed re-exports it without declaring so

from refplan import TransferEndpoints, TransferSegment
from refplan.cli.sync import run_ranks
from refplan.execute import (
    StagingBudget,
    TransferRejectedError,
    agree,
    execute_transfer,
)
from refplan.plan import TransferPlan

pytestmark = pytest.mark.timeout(60)

ONE = TransferEndpoints({0: 0}, {0: 0})


def _plan(segments: tuple[TransferSegment, ...], numel: int) -> TransferPlan:
    return TransferPlan(segments, (numel,), sum(s.numel for s in segments))


# ---------------------------------------------------------------------------------------------
# The checks before the verdict (one process: they run all the same).


def test_plan_names_that_are_not_str_are_refused() -> None:
    """``plans`` maps parameter *names* (str) to plans: a non-str key is refused by name, not
    moved (the digest's JSON would also write ``0`` and ``"0"`` alike).
    Mutant 12 (checks.py: the str test on the plans' keys dropped) moved the data and returned."""
    from refplan.execute import execute_transfers

    segment = TransferSegment(0, 0, (1,), 0, 0, (1,), (4,))
    source, target = torch.arange(1.0, 5.0), torch.zeros(4)
    with pytest.raises(TransferRejectedError, match="plans must map parameter name"):
        execute_transfers({0: _plan((segment,), 4)}, {0: {0: source}}, {0: {0: target}}, ONE,  # type: ignore[dict-item]
                          dtypes={0: torch.float32})  # type: ignore[dict-item]
    assert not target.any()


# ---------------------------------------------------------------------------------------------
# A failed collective.


def test_a_failed_all_gather_marks_the_group_so_its_next_call_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group on which one of the executor's collectives failed in this process is refused from
    then on, before anything is posted on it (``verdict._BROKEN``): a peer may still complete that
    collective, and its next one would meet this process's next call. The all-gather of verdicts
    or outcomes is one of those collectives, like the all-reduces.
    Mutant 18 (verdict.py: ``_gather`` no longer calls ``mark_broken``) let the next call in."""
    from refplan.execute import call, verdict

    class Group:  # stands for a process group: weakly referenceable, compared by identity
        pass

    group = Group()
    ctx = SimpleNamespace(members=(0, 1), group=group, collective=True, me=0)

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected all-gather failure")

    monkeypatch.setattr(verdict.dist, "all_gather", failing)
    with pytest.raises(RuntimeError, match="injected all-gather failure"):
        verdict._gather(ctx, torch.device("cpu"), [1, 2], timedelta(seconds=1))  # type: ignore[arg-type]
    assert "all-gather" in (verdict.broken(group) or ""), verdict.broken(group)
    with pytest.raises(TransferRejectedError, match="an earlier call's collective on this process group failed"):
        call._enter(ctx)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The store agreement, one step at a time on one in-process store.


def test_old_keys_are_deleted_when_the_first_arrival_is_unsettled() -> None:
    """Agreement protocol: "the first process to arrive at agreement ``seq`` (settled or not)
    deletes the keys of agreement ``seq - 2``", of that agreement's kind. Here process 0 always
    arrives first and unsettled (``early``: it writes its own record as the answer and does not
    wait), process 1 after it, and the kinds alternate as a call loop's do (a brief ``v``, an
    outcome ``o``): a loop of such agreements leaves a bounded number of keys.
    Mutant 23 (agree.py: ``arrived % _UNSETTLED == 1`` read as ``arrived == 1``) deleted nothing
    here; mutant 24 (``_forget_older`` looks up the kind of ``seq - 1``, not ``seq - 2``) deleted
    keys of the wrong kind, which do not exist: both left every agreement's three keys (36 after 12)."""
    store = HashStore()
    links = [agree._Link(store, "refplan/agree/unsettled", 2, rank) for rank in range(2)]
    second = timedelta(seconds=5)
    for n in range(12):
        kind = "vo"[n % 2]
        first = agree.agree_max(links[0], [n + 1], second, early=True, kind=kind)
        after = agree.agree_max(links[1], [n], second, kind=kind)
        assert first[0] == [n + 1] and after[0] == [n + 1], (n, first, after)
    assert store.num_keys() <= 3 * 3, store.num_keys()

# ---------------------------------------------------------------------------------------------
# Two gloo processes.

_N = 16384  # float32 elements of 64 KiB: a chunk of _DIRECT_MIN bytes, one message of its own


def _slot_reuse(me: int, world: int) -> dict[str, Any]:
    """Process 0 sends to process 1 three rounds (message limit 64 KiB): round 0 a small chunk
    that process 1 stages (strided in its target), round 1 a 64 KiB chunk contiguous in process
    1's target (received in place: no slot there), round 2 a 64 KiB chunk process 1 stages again
    (strided in its target), in slot 0 like round 0.

    Process 1's receives wait for every receive it has posted so far, so whatever round 2 would
    write into slot 0 has landed before round 0 is unpacked from it, if round 2 was posted then."""
    from refplan.execute import transport

    small = TransferSegment(0, 0, (1,), 0, 0, (2,), (4,))  # staged at the receiver
    inplace = TransferSegment(0, 4, (2,), 0, 8, (1,), (_N,))  # strided at the sender, contiguous at the receiver
    strided = TransferSegment(0, 4 + 2 * _N - 1, (1,), 0, 8 + _N, (2,), (_N,))  # staged at the receiver
    segments = (small, inplace, strided)
    source_numel = strided.source_offset + _N
    target_numel = strided.target_offset + 2 * (_N - 1) + 1
    plan = TransferPlan(segments, (target_numel,), sum(s.numel for s in segments))
    ends = TransferEndpoints({0: 0}, {0: 1})
    source = torch.arange(1, source_numel + 1, dtype=torch.int32).view(torch.float32)
    target = torch.zeros(target_numel, dtype=torch.float32)
    posted: list[Any] = []  # receives posted and not yet waited for
    count = [0]
    real_receive = transport._receive

    class _AfterAllPosted:
        def __init__(self, work: Any) -> None:
            self.work = work

        def wait(self, *args: Any) -> Any:
            while posted:  # each gloo work waited once: a second wait would wait for another message
                posted.pop(0).wait(*args)
            return True

    def receive(*args: Any) -> Any:
        work = real_receive(*args)
        posted.append(work)
        count[0] += 1
        return _AfterAllPosted(work)

    if me == 1:
        transport._receive = receive
    try:
        execute_transfer(plan, {0: source} if me == 0 else {}, {0: target} if me == 1 else {}, ends,
                         dtype=torch.float32, budget=StagingBudget(bytes_per_peer=2 * (_N * 4)),
                         timeout=timedelta(seconds=20))
    finally:
        transport._receive = real_receive
    if me == 0:
        return {"receives": 0, "exact": True}
    want = torch.zeros(target_numel, dtype=torch.int32)
    for seg in segments:
        s = torch.as_strided(source.view(torch.int32), seg.shape, seg.source_strides, seg.source_offset)
        torch.as_strided(want, seg.shape, seg.target_strides, seg.target_offset).copy_(s)
    return {"receives": count[0], "exact": bool(torch.equal(want, target.view(torch.int32)))}


def test_a_staging_slot_is_not_reused_while_a_round_that_stages_on_it_is_in_flight() -> None:
    """Spec, transport: "round s reuses slot s % 2 of a queue, so it waits only for an in-flight
    round of the same parity that stages on a queue that s stages on too". A round in between
    that holds no slot on the queue (received in place) must not let round 2 into slot 0 while
    round 0 still has to be unpacked from it.
    Mutant 43 (transport.py: the wait tests ``!=`` parity) posted round 2 at once and unpacked
    round 0 from round 2's bytes; ``test_random_layouts_policies_dtypes_and_budgets`` caught it
    only when the network happened to deliver round 2 first, this test every time."""
    outcomes = run_ranks(_slot_reuse, 2, timeout=timedelta(seconds=30), deadline_s=60, grace_s=5)
    errors = [f"process {o.rank}: {o.error}" for o in outcomes if not o.ok]
    assert not errors, "\n".join(errors)
    receiver = outcomes[1].value
    assert receiver["receives"] == 3, receiver
    assert receiver["exact"], receiver
