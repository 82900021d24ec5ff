"""Guarantees of ``spec/executor.md`` that a hand mutation audit of ``refplan/execute`` found
unguarded: each test here failed on one or more small, plausible mutants of the executor and
passes on the real code.

Single-process tests first (no process group: the checks run all the same), then the store
agreement on one in-process store with a thread per process (as ``test_agree.py``), then one
launch of three gloo processes running a few scenarios in order (as ``test_execute.py``).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import _dist_worker as worker
import pytest
import torch
from torch._C._distributed_c10d import HashStore  # torch.distributed re-exports it without declaring so

from refplan import TransferEndpoints, TransferSegment, contiguous_split_map
from refplan.cli.sync import run_ranks
from refplan.execute import (
    StagingBudget,
    TransferRejectedError,
    agree,
    execute_transfer,
    execute_transfers,
    release_staging,
    schedule_digest,
)
from refplan.plan import TransferPlan

pytestmark = pytest.mark.timeout(120)

ONE = TransferEndpoints({0: 0}, {0: 0})


def _one_segment(segment: TransferSegment, dtype: torch.dtype, source: torch.Tensor, target: torch.Tensor) -> None:
    plan = TransferPlan((segment,), (int(source.numel()),), segment.numel)
    execute_transfer(plan, {0: source}, {0: target}, ONE, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Single process: the checks before the verdict.


def test_a_stride_of_exactly_two_to_the_63_bytes_is_refused() -> None:
    """Guarantee 1: ``stride × itemsize < 2**63`` on every axis. A 2-byte dtype with a stride of
    2**62 (the readers' cap itself) on an extent-1 axis is exactly 2**63 bytes: refused, not left
    to ``torch.as_strided``."""
    segment = TransferSegment(0, 0, (2**62, 1), 0, 0, (4, 1), (1, 4))
    source, target = torch.arange(1, 5, dtype=torch.int16), torch.zeros(4, dtype=torch.int16)
    with pytest.raises(TransferRejectedError, match=f"source stride {2**62} on axis 0 is {2**63} bytes"):
        _one_segment(segment, torch.int16, source, target)
    assert not target.any()


def test_a_negative_target_offset_is_refused_and_nothing_before_the_buffer_is_written() -> None:
    """Guarantee 1: segment fields are checked on both sides (offsets ≥ 0). A target offset of -1
    whose last element still lies inside the buffer would write the element before it."""
    whole = torch.zeros(6, dtype=torch.float32)
    target = whole[1:5]
    segment = TransferSegment(0, 0, (1,), 0, -1, (1,), (3,))
    with pytest.raises(TransferRejectedError, match="negative offset or stride"):
        _one_segment(segment, torch.float32, torch.arange(1.0, 5.0), target)
    assert not whole.any()


def test_a_source_that_runs_into_a_target_starting_after_it_is_refused() -> None:
    """Guarantee 1: no storage overlap between any source and any target buffer, whichever of the
    two starts first in memory (here the source starts before the target and runs into it)."""
    whole = torch.arange(12.0)
    before = whole.clone()
    source, target = whole[0:8], whole[4:12]
    segment = TransferSegment(0, 0, (1,), 0, 0, (1,), (8,))
    with pytest.raises(TransferRejectedError, match="overlaps the target buffer"):
        _one_segment(segment, torch.float32, source, target)
    assert torch.equal(whole, before)


def test_a_budget_of_exactly_one_element_per_peer_is_accepted() -> None:
    """``bytes_per_peer`` below one element is refused; exactly one element is the least that works
    (StagingBudget: "one element where that is less")."""
    segment = TransferSegment(0, 0, (1,), 0, 0, (1,), (4,))
    source, target = torch.arange(1.0, 5.0), torch.zeros(4)
    plan = TransferPlan((segment,), (4,), 4)
    execute_transfer(plan, {0: source}, {0: target}, ONE, dtype=torch.float32, budget=StagingBudget(4))
    assert torch.equal(source, target)
    with pytest.raises(TransferRejectedError, match="cannot stage one element"):
        execute_transfer(plan, {0: source}, {0: target}, ONE, dtype=torch.float32, budget=StagingBudget(3))


def test_a_timeout_of_exactly_one_millisecond_is_accepted() -> None:
    """Guarantee 6: the timeout is a ``timedelta`` from 1 ms to 365 days, both ends included."""
    segment = TransferSegment(0, 0, (1,), 0, 0, (1,), (4,))
    source, target = torch.arange(1.0, 5.0), torch.zeros(4)
    plan = TransferPlan((segment,), (4,), 4)
    execute_transfer(plan, {0: source}, {0: target}, ONE, dtype=torch.float32, timeout=timedelta(milliseconds=1))
    assert torch.equal(source, target)
    target.zero_()
    execute_transfer(plan, {0: source}, {0: target}, ONE, dtype=torch.float32, timeout=timedelta(days=365))
    assert torch.equal(source, target)


def test_the_remembered_digest_is_that_of_the_calls_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guarantees 2 and 10: the key is folded into the digest, also when the checks of the same
    plan objects are remembered from an earlier call with another key (a sync loop with
    ``key=f"step{i}"``): each call's verdict carries the digest of its own key."""
    from refplan.execute import call

    release_staging()
    sent: list[int] = []
    real = call._exchange

    def recording(ctx: Any, device: Any, digest: int, *args: Any, **kwargs: Any) -> Any:
        sent.append(digest)
        return real(ctx, device, digest, *args, **kwargs)

    monkeypatch.setattr(call, "_exchange", recording)
    segment = TransferSegment(0, 0, (1,), 0, 0, (1,), (4,))
    plan = TransferPlan((segment,), (4,), 4)
    source, target = torch.arange(1.0, 5.0), torch.zeros(4)
    budget = StagingBudget()
    for key in ("step0", "step1", "step2"):
        execute_transfer(plan, {0: source}, {0: target}, ONE, dtype=torch.float32, budget=budget, key=key)
    want = [schedule_digest({"param": plan}, ONE, budget, {"param": torch.float32}, "global", key)
            for key in ("step0", "step1", "step2")]
    assert len(set(want)) == 3
    assert sent == want
    release_staging()


def test_a_remembered_layout_is_not_used_for_a_shorter_target_buffer() -> None:
    """Guarantee 1: a call with buffers of other sizes lays out (and checks) again. A target buffer
    one element short, a view into a larger allocation, is refused after a call with the full one."""
    release_staging()
    segment = TransferSegment(0, 0, (1,), 0, 0, (1,), (4,))
    plan = TransferPlan((segment,), (4,), 4)
    source = torch.arange(1.0, 5.0)
    execute_transfer(plan, {0: source}, {0: torch.zeros(4)}, ONE, dtype=torch.float32)
    whole = torch.zeros(6)
    with pytest.raises(TransferRejectedError, match="holds 3 elements"):
        execute_transfer(plan, {0: source}, {0: whole[:3]}, ONE, dtype=torch.float32)
    assert not whole.any()
    release_staging()


# ---------------------------------------------------------------------------------------------
# The store agreement: kinds never complete each other.


def test_a_brief_and_an_outcome_of_the_same_number_never_complete_each_other() -> None:
    """Guarantee 2: an agreement's keys name its kind (``v`` a brief, ``o`` an outcome), "so that
    records of one kind never complete an agreement of the other": two processes at agreement 1,
    one for a brief and one for an outcome, both wait out their (short) timeout; neither returns."""
    store = HashStore()
    links = [agree._Link(store, "refplan/agree/kinds", 2, rank) for rank in range(2)]
    got: dict[int, Any] = {}

    def run(i: int, kind: str) -> None:
        try:
            got[i] = agree.agree_max(links[i], [i + 1], timedelta(milliseconds=300), kind=kind)
        except Exception as exc:
            got[i] = exc

    threads = [threading.Thread(target=run, args=(0, "v")), threading.Thread(target=run, args=(1, "o"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(got) == {0, 1}
    assert all(isinstance(v, Exception) for v in got.values()), got


# ---------------------------------------------------------------------------------------------
# Three gloo processes.

THREE = 3
ENDS3 = TransferEndpoints({0: 0, 1: 2}, {0: 1, 1: 2})
"""Location 0: source on process 0, target on process 1; location 1: both on process 2."""

TIMEOUT = worker.TIMEOUT  # what run_exact passes


class _Waits:
    """A work handle that records the timeout of every ``wait`` made on it."""

    def __init__(self, work: Any, log: list[Any]) -> None:
        self.work, self.log = work, log

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append(args[0] if args else kwargs.get("timeout"))
        return self.work.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


def _three(me: int, world: int) -> dict[str, Any]:
    """Run in each of three processes, in order (every call is collective)."""
    from refplan.execute import call, transport

    dtypes = {"w": torch.float32}
    out: dict[str, Any] = {}

    # 1. The group's first call: process 2 holds no buffer (only location 0 is used). Guarantee 7:
    #    a process holding no buffer joins the verdict; it has no device type to disagree about.
    lone = contiguous_split_map((6, 4), [6], 0)
    pairs = {"w": (lone, lone)}
    try:
        out["no_buffers"] = {"raised": None, **worker.run_exact(pairs, ENDS3, dtypes, me)}
    except Exception as exc:
        out["no_buffers"] = {"raised": type(exc).__name__, "message": str(exc)}

    # 2. A greeted group's warm call, settled by the brief: process 0 sends 3 rounds to process 1,
    #    process 2 copies locally (0 rounds). Guarantee 9: the outcome waits the timeout once per
    #    round of the *longest* schedule, plus one, which every process learns from the verdicts.
    halves = contiguous_split_map((6, 4), [3, 3], 0)
    pairs = {"w": (halves, halves)}
    seen: dict[str, Any] = {"most_rounds": [], "outcome_timeouts": [], "waits": []}
    real_outcome, real_agree = call._outcome, agree.agree_max
    real_send, real_receive = transport._send, transport._receive

    def outcome(ctx: Any, sched: Any, *args: Any, **kwargs: Any) -> Any:
        seen["most_rounds"].append(sched.most_rounds)
        return real_outcome(ctx, sched, *args, **kwargs)

    def agree_max(link: Any, words: Any, timeout: Any, **kwargs: Any) -> Any:
        if kwargs.get("kind") == "o":
            seen["outcome_timeouts"].append(timeout)
        return real_agree(link, words, timeout, **kwargs)

    def send(*args: Any) -> Any:
        return _Waits(real_send(*args), seen["waits"])

    def receive(*args: Any) -> Any:
        return _Waits(real_receive(*args), seen["waits"])

    call._outcome, agree.agree_max = outcome, agree_max
    transport._send, transport._receive = send, receive
    try:
        tight = StagingBudget(bytes_per_peer=32)  # 16 bytes a message: 4 floats, 12 floats to move
        out["rounds"] = [worker.run_exact(pairs, ENDS3, dtypes, me, budget=tight) for _ in range(2)]
    finally:
        call._outcome, agree.agree_max = real_outcome, real_agree
        transport._send, transport._receive = real_send, real_receive
    out["seen"] = seen
    out["linked"] = agree.link_of(torch.distributed.group.WORLD) is not None

    # 3. Last (a mutant that lets it through leaves the group out of step): the processes pass
    #    different ``outcome`` flags. Guarantee 9: "Every process must pass the same outcome (the
    #    verdicts compare it)": refused everywhere, before any byte moves.
    plans = worker.plan(pairs, ENDS3, dtypes, "balanced")
    b = worker.make_buffers(pairs, ENDS3, me, dtypes)
    flag = me != 1
    out["outcome_flags"] = worker.expect_rejection(
        lambda: execute_transfers(plans, b.sources, b.targets, ENDS3, dtypes=dtypes,
                                  timeout=timedelta(seconds=2), outcome=flag), b)
    return out


@pytest.fixture(scope="module")
def three() -> list[dict[str, Any]]:
    outcomes = run_ranks(_three, THREE, timeout=timedelta(seconds=30), deadline_s=90, grace_s=10)
    errors = [f"process {o.rank}: {o.error}" for o in outcomes if not o.ok]
    assert not errors, "\n".join(errors)
    return [o.value for o in outcomes]


def test_a_process_holding_no_buffer_joins_the_verdict(three: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(three):
        r = res["no_buffers"]
        assert r["raised"] is None, (rank, r)
        assert r["exact"] and r["guards"] and r["sources_intact"], (rank, r)


def test_every_process_learns_the_most_rounds_and_bounds_its_outcome_by_them(three: list[dict[str, Any]]) -> None:
    rounds = [max(c["rounds"] for c in res["rounds"]) for res in three]
    assert rounds == [3, 3, 0], rounds
    for rank, res in enumerate(three):
        for c in res["rounds"]:
            assert c["exact"] and c["guards"] and c["sources_intact"], (rank, c)
        assert res["seen"]["most_rounds"] == [3, 3], (rank, res["seen"])
        assert res["linked"], "a group of three with a TCPStore agrees through it"
        assert res["seen"]["outcome_timeouts"] == [TIMEOUT * 4] * 2, (rank, res["seen"])


def test_every_wait_of_a_round_carries_the_calls_timeout(three: list[dict[str, Any]]) -> None:
    """Guarantee 6: every wait carries ``timeout`` (the rest of it since the round's wait began)."""
    for rank in (0, 1):
        waits = three[rank]["seen"]["waits"]
        assert waits, f"process {rank} posted nothing"
        assert all(isinstance(w, timedelta) and timedelta(0) < w <= TIMEOUT for w in waits), (rank, waits)


def test_processes_passing_different_outcome_flags_are_refused_everywhere(three: list[dict[str, Any]]) -> None:
    results = [res["outcome_flags"] for res in three]
    assert all(r["raised"] == "TransferRejectedError" and r["unchanged"] for r in results), results
    assert len({r["message"] for r in results}) == 1, results
    assert "outcome agreement off" in results[0]["message"], results
