"""Issue 26 on two gloo processes: the staging pool's bound, the fixed-size header before the
verdict, the collective outcome after the last round, and two calls in flight on one group.

Like ``test_execute.py``, two processes are forked once (``two``) and run every scenario of
``_dist_worker.TWO_SCENARIOS`` in order; the tests judge what came back. The single-process
tests at the end check the pieces (the pool, the target sets) directly.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import _dist_worker as worker
import pytest
import torch

from refplan.cli.sync import run_ranks
from refplan.execute import verdict

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("execute")]


@pytest.fixture(scope="module")
def two() -> dict[str, list[Any]]:
    """One launch of 2 gloo processes running every two-process scenario."""
    outcomes = run_ranks(worker.two_process_scenarios, 2, timeout=timedelta(seconds=60), deadline_s=200)
    errors = [f"process {o.rank}: {o.error}" for o in outcomes if not o.ok]
    assert not errors, "\n".join(errors)
    return {name: [o.value[name] for o in outcomes] for name in outcomes[0].value}


scenario = worker.scenario


# ---------------------------------------------------------------------------------------------
# Item 4: staging kept for reuse stays within the budget's total_bytes.


def test_staging_pool_stays_within_total_bytes_across_changing_sizes(two: dict[str, list[Any]]) -> None:
    for rank, res in enumerate(scenario(two, "pool_bound")):
        assert res["exact"], f"process {rank}: a target element differs"
        assert res["sizes"] >= 20, res  # the sizes did change from call to call
        assert 0 < res["most"] <= worker.POOL_BOUND, res
        assert res["held"] == res["actual"], "the pool's count disagrees with the arenas it holds"
        assert res["after"] == 0, "release_staging left arenas in the pool"


def test_a_refused_call_leaves_no_kept_program_holding_staging_beyond_total_bytes(
    two: dict[str, list[Any]],
) -> None:
    for rank, res in enumerate(scenario(two, "pool_refused")):
        assert res["raised"] == [None, "TransferRejectedError"] * 3, (rank, res["raised"])
        assert res["exact"], f"process {rank}: a target element differs"
        assert 0 < res["most"] <= worker.POOL_REFUSED_BOUND, (rank, res)
        assert res["after"] == 0, res


def _same_rejection(per_process: list[dict[str, Any]], *needles: str) -> str:
    messages = {r["message"] for r in per_process}
    assert all(r["raised"] == "TransferRejectedError" for r in per_process), per_process
    assert len(messages) == 1, f"processes raised different messages: {messages}"
    message = messages.pop()
    assert message.startswith("transfer rejected before any data moved"), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert all(r["unchanged"] for r in per_process), "a buffer changed although the transfer was rejected"
    return message


# ---------------------------------------------------------------------------------------------
# Item 5: a fixed-size hello before the verdict.


def test_greeted_group_settles_calls_by_the_brief_and_rejects_through_the_full_exchange(
    two: dict[str, list[Any]],
) -> None:
    """Protocols 6 and 7 (item 8c): the full all-gather once per group, then the two-word brief;
    every call the brief does not settle goes on to the full exchange on both processes. On a
    group whose hello showed both processes able, the brief and the outcome are agreed through the
    group's store (``agreements``: one each per call); where one process offers no store, neither
    process uses it, and calls, rejections and failures read the same."""
    per_process = scenario(two, "brief")
    for rank, res in enumerate(per_process):
        for case in ("first", "second", "again", "other_second", "other_third", "unlinked_first",
                     "unlinked_second", "large_first", "large_second", "linked_after"):
            assert res[case]["raised"] is None and res[case]["exact"] and res[case]["guards"], (rank, case, res[case])
        # The group's first call: the full message only (its outcome through the store it just
        # linked); after it, the brief only, and both agreements through the store.
        assert res["first"]["counts"] == {"brief": 0, "full": 1, "agreements": 1}, (rank, res["first"])
        assert res["second"]["counts"] == {"brief": 1, "full": 0, "agreements": 2}, (rank, res["second"])
        assert res["again"]["counts"] == {"brief": 1, "full": 0, "agreements": 2}, (rank, res["again"])
        for case in ("refused", "keys", "protocol"):  # not settled: both go on to the full exchange
            assert res[case]["counts"] == {"brief": 1, "full": 1, "agreements": 1}, (rank, case, res[case])
        # A first call that met another protocol greets nobody: the next call is a full exchange.
        assert res["other_first"]["counts"] == {"brief": 0, "full": 1, "agreements": 0}, (rank, res["other_first"])
        assert res["other_second"]["counts"] == {"brief": 0, "full": 1, "agreements": 1}, (rank, res["other_second"])
        assert res["other_third"]["counts"] == {"brief": 1, "full": 0, "agreements": 2}, (rank, res["other_third"])
        assert res["first"]["linked"] and res["other_third"]["linked"] and res["linked_after"]["linked"], rank
        # Process 1 offered no store in the group's hello: both processes use the all-reduce.
        for case in ("unlinked_first", "unlinked_second"):
            assert not res[case]["linked"], (rank, case)
            assert res[case]["counts"]["agreements"] == 0, (rank, case, res[case])
        assert res["unlinked_second"]["counts"] == {"brief": 1, "full": 0, "agreements": 0}, rank
        # A group larger than the store's limit (``agree._STORE_MAX_PROCESSES``, set to 1 for its
        # hello) is never linked: the store is one server, and an agreement costs it per process.
        for case in ("large_first", "large_second"):
            assert not res[case]["linked"], (rank, case)
        assert res["large_first"]["counts"] == {"brief": 0, "full": 1, "agreements": 0}, rank
        assert res["large_second"]["counts"] == {"brief": 1, "full": 0, "agreements": 0}, rank
        # Process 1's part fails after the verdict: both processes raise, naming process 1, on
        # either transport of the outcome (through the store, process 1 answers at once).
        for case in ("unlinked_failed", "linked_failed"):
            assert res[case]["raised"] == "TransferExecutionError", (rank, case, res[case])
            assert "process 1 failed after the verdict" in res[case]["message"], (rank, case, res[case])
            assert res[case]["processes"] == (1,), (rank, case, res[case])
        assert res["linked_failed"]["counts"]["agreements"] == 2, (rank, res["linked_failed"])
    for case in ("unlinked_failed", "linked_failed"):
        assert per_process[0][case]["targets"] == per_process[1][case]["targets"], case
    _same_rejection([r["refused"] for r in per_process], "process 1:", "dtype")
    _same_rejection([r["keys"] for r in per_process], "disagree about the transfer schedule")
    for case in ("protocol", "other_first"):
        _same_rejection([r[case] for r in per_process], "different executor protocols",
                        f"protocol {verdict._PROTOCOL}, a message of 37 words", "protocol 5")


def _reduced(briefs: list[list[int]]) -> list[int]:
    """What ``all_reduce(MAX)`` gives every process: the elementwise maximum."""
    return [max(column) for column in zip(*briefs)]


def _agreed(digest: int, outcome: int = 1, code: int = 1) -> tuple[int, ...]:
    return (verdict._MAGIC, verdict._PROTOCOL, verdict._HELLO_WORDS, outcome, digest, code)


def test_brief_settles_only_identical_unrefused_verdicts_and_carries_the_most_rounds() -> None:
    """The brief's arithmetic, without processes: the maximum of the two words shows agreement
    exactly when every process sent the same hash (the first word alone cannot: it would let a
    smaller hash through), and then the most rounds of any process."""
    same = [verdict._brief(_agreed(7), False, r) for r in (3, 0, 11, 5)]
    assert verdict._settled(_reduced(same)) == 11
    assert verdict._settled(_reduced([verdict._brief(_agreed(7), False, 0)] * 2)) == 0
    for other in (_agreed(8), _agreed(7, outcome=0), _agreed(7, code=2)):  # digest, outcome flag, device type
        briefs = [verdict._brief(_agreed(7), False, 2), verdict._brief(other, False, 2)]
        assert verdict._settled(_reduced(briefs)) is None
        assert verdict._settled(_reduced(briefs[::-1])) is None
    refused = [verdict._brief(_agreed(7), False, 1), verdict._brief(_agreed(7), True, 1)]
    assert verdict._settled(_reduced(refused)) is None
    assert verdict._settled(_reduced([verdict._brief(_agreed(7), True, 1)] * 2)) is None  # all refused alike
    beyond = 1 << verdict._ROUND_BITS
    assert verdict._settled(_reduced([verdict._brief(_agreed(7), False, beyond)] * 2)) is None
    assert verdict._settled(_reduced([verdict._brief(_agreed(7), False, beyond - 2)] * 2)) == beyond - 2
    for words in (same[0], refused[1]):
        assert len(words) == verdict._BRIEF_WORDS and all(0 <= w < 2**63 for w in words)


def test_verdict_of_another_size_is_a_collective_rejection_not_an_abort(two: dict[str, list[Any]]) -> None:
    per_process = scenario(two, "header")
    # A longer reason field no longer changes the message's size (it used to abort the job, then
    # was refused by the hello): the reason fills the fixed size, and the call simply moves.
    assert all(r["size"]["raised"] is None for r in per_process), per_process
    _same_rejection([r["protocol"] for r in per_process], "different executor protocols",
                    "process 0: magic", f"protocol {verdict._PROTOCOL}, a message of 37 words", "process 1: magic",
                    "protocol 3")
    _same_rejection([r["magic"] for r in per_process], "different executor protocols", "0x726566706c616e34")
    for rank, res in enumerate(per_process):
        assert all(res["after"][k] for k in ("exact", "guards", "sources_intact")), f"process {rank}: {res['after']}"


# ---------------------------------------------------------------------------------------------
# Item 2: the collective outcome.


def test_a_failure_anywhere_is_raised_everywhere_with_the_same_targets(two: dict[str, list[Any]]) -> None:
    per_process = scenario(two, "outcome")
    agreed = [r["agreed"] for r in per_process]
    assert all(r["raised"] == "TransferExecutionError" for r in agreed), agreed
    # Process 1's segments write target location 1 of both parameters; process 0's none of its own.
    assert all(r["targets"] == {"a": (1,), "b": (1,)} for r in agreed), agreed
    assert all(r["processes"] == (1,) for r in agreed), agreed
    assert "process 1 failed after the verdict" in agreed[0]["message"]
    assert agreed[0]["message"].startswith("this process finished its part")
    assert agreed[1]["message"].startswith("round 0 of 1: injected transport failure")
    alone = [r["alone"] for r in per_process]
    assert alone[0]["raised"] is None, "outcome=False still agreed on the outcome"
    # Protocol 5: an ok call agrees by one all-reduce alone; the all-gather naming who failed runs
    # on every process exactly when one failed, never with outcome=False.
    assert all(r["ok"]["raised"] is None for r in per_process), [r["ok"] for r in per_process]
    assert [r["gathers"] for r in per_process] == [{"ok": 0, "agreed": 1, "alone": 0}] * 2
    assert alone[1]["raised"] == "TransferExecutionError" and alone[1]["processes"] is None
    for rank, res in enumerate(per_process):
        assert all(res["after"][k] for k in ("exact", "guards", "sources_intact")), f"process {rank}: {res['after']}"


def test_dead_peer_survivors_all_raise_naming_every_target() -> None:
    outcomes = run_ranks(worker.dead_peer, 3, timeout=timedelta(seconds=30), deadline_s=120, grace_s=60)
    assert not outcomes[1].ok, "process 1 was meant to die"
    survivors = [outcomes[0], outcomes[2]]
    assert all(o.ok for o in survivors), [o.error for o in survivors]
    results = [o.value for o in survivors]
    for res in results:
        assert res["raised"] == "TransferExecutionError", res
        assert res["targets"] == {"w": (0, 1, 2)} and res["processes"] is None, res
        assert "the outcome agreement" in res["message"], res["message"]
        # the agreement's limit is not the call's timeout: the message says how it was derived
        assert (f"its limit is the call's timeout {timedelta(seconds=worker.DEAD_TIMEOUT_S)} for each of the "
                in res["message"]), res["message"]
    assert results[1]["message"].startswith("this process finished its part"), "process 2 had no traffic"
    # Issue 26: process 1 died at once, so process 0's round failed at once: it did not time out
    # (it used to read "failed or timed out after 0:00:03" for an immediate closed connection).
    # Its round has a receive from and a send to process 1, waited for last posted first: the
    # send fails unless its bytes left before the reset, and then the receive does.
    assert any(f"round 0 of 1: {what} process 1 failed after " in results[0]["message"]
               for what in ("send to", "receive from")), results[0]["message"]
    assert f"(timeout {timedelta(seconds=worker.DEAD_TIMEOUT_S)})" in results[0]["message"]


def test_a_survivor_names_the_rounds_its_peer_can_have_died_in() -> None:
    """Rounds are posted ahead, so the wait that fails is the oldest in flight, which can be
    earlier than the round the peer died in: the message says "round r or a later one" and the
    rounds in flight, and the peer's round is among them (issue 26)."""
    import re

    outcomes = run_ranks(worker.died_mid_rounds, 2, timeout=timedelta(seconds=30), deadline_s=90, grace_s=30)
    assert not outcomes[1].ok, "process 1 was meant to die"
    assert outcomes[0].ok, outcomes[0].error
    res = outcomes[0].value
    assert res["raised"] == "TransferExecutionError", res
    found = re.match(r"round (\d+) of 64 or a later one \(rounds (\d+)-(\d+) were in flight\): receive from "
                     r"process 1 failed after [0-9.]+ s \(timeout 0:00:03\)", res["message"])
    if found is not None:
        first, low, high = (int(g) for g in found.groups())
        assert first == low <= worker.DIES_AT_ROUND <= high, res["message"]
        return
    # Or the dead connection is seen when the next round is posted (process 0 receives straight
    # into its shard, so it posts up to _MAX_IN_FLIGHT rounds ahead): that round is named with
    # the rounds in flight, the oldest of which is never later than the one the peer died in
    # (a round is finished only once the peer's messages of it arrived).
    posting = re.match(r"round (\d+) of 64 \(rounds (\d+)-(\d+) were in flight\): posting failed; target "
                       r"buffers may be partly written: ", res["message"])
    assert posting is not None, res["message"]
    posted, low, high = (int(g) for g in posting.groups())
    assert low <= worker.DIES_AT_ROUND and high == posted - 1, res["message"]


def test_a_failed_post_names_its_round_and_the_rounds_in_flight() -> None:
    """A receive that cannot be posted (as when a peer died in a round in flight and its
    connection is gone) names the round being posted and the rounds in flight, which the dead
    peer's round is among or after; both processes raise, neither waits out more than its timeout."""
    import re

    outcomes = run_ranks(worker.failed_posting, 2, timeout=timedelta(seconds=30), deadline_s=90, grace_s=30)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    mine = outcomes[0].value
    assert mine["raised"] == "TransferExecutionError", mine
    found = re.match(r"round (\d+) of 64 \(rounds (\d+)-(\d+) were in flight\): posting failed; target buffers "
                     r"may be partly written: RuntimeError: injected", mine["message"])
    assert found is not None, mine["message"]
    posted, low, high = (int(g) for g in found.groups())
    assert posted == worker.FAILS_AT_POST and low <= high == posted - 1, mine["message"]
    assert outcomes[1].value["raised"] == "TransferExecutionError", outcomes[1].value


def test_a_peer_dead_before_the_hello_is_reported_as_a_failure_not_a_timeout() -> None:
    outcomes = run_ranks(worker.died_before_the_hello, 2, timeout=timedelta(seconds=30), deadline_s=90, grace_s=30)
    assert outcomes[0].ok, outcomes[0].error
    res = outcomes[0].value
    assert res["raised"] == "TransferExecutionError", res
    assert res["message"].startswith("exchanging verdicts failed after "), res["message"]
    assert "(timeout 0:00:03); no data moved" in res["message"], res["message"]


def test_a_wait_is_said_to_time_out_only_when_its_time_is_up() -> None:
    import time

    from refplan.execute.common import _ended

    assert _ended(time.monotonic() - 16, timedelta(seconds=15)) == "timed out after 0:00:15"
    assert _ended(time.monotonic(), timedelta(seconds=15)).startswith("failed after 0.0")
    assert _ended(time.monotonic(), timedelta(seconds=15)).endswith(" s (timeout 0:00:15)")


# ---------------------------------------------------------------------------------------------
# Item 1: two calls in flight on one group in one process; keys.


@pytest.mark.parametrize("case", ["shared", "distinct"])
def test_two_calls_in_flight_on_one_group_both_fail(two: dict[str, list[Any]], case: str) -> None:
    per_process = scenario(two, "concurrent")
    mine = per_process[0][case]
    assert mine["entered"], "the first call never reached the point where it was held"
    second = mine["second"]
    assert second["raised"] == "TransferRejectedError", second
    assert "another execute_transfers call on this process group" in second["message"]
    assert second["unchanged"] and second["seconds"] < 5, second
    firsts = [per_process[0][case]["first"], per_process[1][case]["first"]]
    for res in firsts:
        assert res["raised"] == "TransferExecutionError", firsts
        assert "process 0 had another call on this group start meanwhile" in res["message"], res["message"]
        assert res["processes"] == (0,), res
    assert firsts[0]["targets"] == firsts[1]["targets"] == {"w": (0, 1)}, firsts
    for rank, res in enumerate(per_process):
        assert all(res["after"][k] for k in ("exact", "guards", "sources_intact")), f"process {rank}: {res['after']}"
        # Process 0 made a call there that process 1 never made: that group is out of step for good.
        same = res["after_same_group"]
        assert same["raised"] == "TransferRejectedError" and same["unchanged"], (rank, same)
        assert "different calls on this group" in same["message"] and "dist.new_group" in same["message"], same


def test_a_call_refused_on_one_process_alone_never_pairs_later_calls_wrongly(two: dict[str, list[Any]]) -> None:
    """The race of the second call lost on process 0 only: there it was refused before touching
    the group, on process 1 it was a real call. Before, calls stayed paired one apart (same key,
    same digest) and returned normally with the other iteration's data; now every later call is
    refused on both processes, and nothing moves."""
    per_process = scenario(two, "concurrent")
    zero, one = (r["shifted"] for r in per_process)
    assert zero["second"]["raised"] == "TransferRejectedError", zero["second"]
    assert "another execute_transfers call on this process group" in zero["second"]["message"]
    assert zero["first"]["raised"] == one["first"]["raised"] == "TransferExecutionError", (zero, one)
    later = [one["second"], *one["later"]]
    assert len(later) == len(zero["later"]) == 3
    for a, b in zip(zero["later"], later):
        for res in (a, b):
            assert res["raised"] == "TransferRejectedError" and res["unchanged"], res
            assert "different calls on this group" in res["message"], res["message"]
        assert a["message"] == b["message"], (a, b)


def test_an_agreement_a_process_stopped_waiting_for_is_completed_by_nobody(two: dict[str, list[Any]]) -> None:
    """Process 0's verdict timed out (1 s) and it raised "no data moved"; process 1 arrived 3 s
    late and used to complete the agreement with process 0's stale record, move, and return
    normally. Now it raises "no data moved" at once, nothing moved, and a retry on both moves."""
    zero, one = (r for r in scenario(two, "abandoned"))
    for res in (zero, one):
        assert all(res["greeted"][k] for k in ("exact", "guards", "sources_intact")), res["greeted"]
        assert all(res["retry"][k] for k in ("exact", "guards", "sources_intact")), res["retry"]
        assert res["late"]["raised"] == "TransferExecutionError" and res["late"]["unchanged"], res["late"]
        assert "no data moved" in res["late"]["message"], res["late"]["message"]
    assert "timed out" in zero["late"]["message"], zero["late"]
    assert "stopped waiting for this agreement" in one["late"]["message"] and one["late"]["seconds"] < 2, one["late"]


@pytest.mark.parametrize("case", ["late", "last"])
def test_a_call_marked_after_its_outcome_went_out_still_does_not_return_normally(
    two: dict[str, list[Any]], case: str
) -> None:
    """The second call starts after the first's outcome agreement ("late"), or after the first's
    last check of the mark, while its staging goes back, before it leaves the group ("last": it
    returned normally there, an outside probe found, 2026-12-07): the second is refused as
    concurrent, so the first must not return normally either on the process that made both; its
    peer's call, whose outcome was clean, returns."""
    per_process = scenario(two, "concurrent")
    mine = per_process[0][case]
    assert mine["entered"] and mine["second"]["raised"] == "TransferRejectedError", mine
    assert mine["first"]["raised"] == "TransferExecutionError", mine
    assert "cannot count as done" in mine["first"]["message"] and mine["first"]["processes"] == (0,)
    assert per_process[1][case]["first"]["raised"] is None, per_process[1][case]


def test_a_call_marked_before_its_verdict_is_refused_everywhere(two: dict[str, list[Any]]) -> None:
    """The second call starts while the first is still being checked: the first refuses in its
    verdict, so both of its processes raise the same rejection and no byte moves."""
    per_process = scenario(two, "concurrent")
    assert per_process[0]["early"]["second"]["raised"] == "TransferRejectedError", per_process[0]["early"]
    firsts = [r["early"]["first"] for r in per_process]
    assert all(r["raised"] == "TransferRejectedError" for r in firsts), firsts
    assert firsts[0]["message"] == firsts[1]["message"] and firsts[0]["processes"] == (0,), firsts
    assert "process 0: another execute_transfers call on this process group" in firsts[0]["message"]


def test_a_group_whose_collective_failed_here_is_not_used_again(two: dict[str, list[Any]]) -> None:
    """On a group that agrees by its collectives, process 0's verdict timed out while process 1
    was late; nothing marks a collective abandoned, so the late process could complete it and its
    next collective meet process 0's next call (a retry), which left the processes of one call
    disagreeing, or the group out of step. Process 0 now refuses that group at once; the late
    process's call raises as well."""
    zero, one = (r for r in scenario(two, "broken"))
    for res in (zero, one):
        assert not res["linked"], "the group agreed through its store: the collective path was not tested"
        assert all(res["greeted"][k] for k in ("exact", "guards", "sources_intact")), res["greeted"]
        assert res["not_a_group"]["raised"] == "TransferRejectedError", res["not_a_group"]
        assert "group must be a torch.distributed ProcessGroup or None, got str" in res["not_a_group"]["message"]
    assert zero["late"]["raised"] == "TransferExecutionError" and "no data moved" in zero["late"]["message"]
    assert one["late"]["raised"] == "TransferExecutionError", one["late"]
    again = zero["again"]
    assert again["raised"] == "TransferRejectedError" and again["unchanged"] and again["seconds"] < 2, again
    assert "an earlier call's collective on this process group failed" in again["message"], again["message"]
    assert "dist.new_group" in again["message"]


def test_keys_refuse_same_shaped_syncs_issued_in_different_orders(two: dict[str, list[Any]]) -> None:
    per_process = scenario(two, "keys")
    for index in (0, 1):
        _same_rejection([r["crossed"][index] for r in per_process], "disagree about the transfer schedule")
    for rank, res in enumerate(per_process):
        assert all(res["same"][k] for k in ("exact", "guards", "sources_intact")), f"process {rank}: {res['same']}"


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        ("dtype", ("the dtypes differ ('w' is bfloat16 on processes [0], float16 on processes [1])",
                   "the plans, the endpoints, the budgets, the endpoint_ranks, the keys agree")),
        ("swapped", ("the dtypes differ ('v' is bfloat16 on processes [0], float16 on processes [1]; 'w' is "
                     "float16 on processes [0], bfloat16 on processes [1])",)),
        ("budget", ("the budgets differ (bytes_per_peer is 8388608 on processes [0], 1048576 on processes [1])",
                    "the plans, the endpoints, the dtypes, the endpoint_ranks, the keys agree")),
        ("key", ("the keys differ ('weights' (digest 0x", "no key on processes [1]",
                 "the plans, the endpoints, the budgets, the dtypes, the endpoint_ranks agree")),
        ("ranks", ("the endpoint_ranks differ ('global' on processes [0]; 'group' on processes [1])",)),
        ("plans", ("the plans differ (digest 0x", "the endpoints, the budgets, the dtypes, the endpoint_ranks, "
                   "the keys agree")),
    ],
)
def test_a_digest_disagreement_names_the_part_that_differs(
    two: dict[str, list[Any]], case: str, needles: tuple[str, ...]
) -> None:
    """Before, both processes raised "disagree about the transfer schedule (plans, endpoints,
    budget, dtypes, endpoint_ranks or key)" with two digests, whatever differed: a process that
    declared float16 where its peer declared bfloat16 (same width, so its own buffers pass) could
    only be found by diffing every argument by hand."""
    per_process = scenario(two, "named")
    message = _same_rejection([r[case] for r in per_process], "disagree about the transfer schedule: ", *needles)
    assert "schedule digests 0x" in message, message
    assert all(r[case]["processes"] == (0, 1) for r in per_process), case


def test_pool_releases_least_recently_used_sizes_first() -> None:
    from refplan.execute.schedule import _Pool

    pool = _Pool()
    cpu = torch.device("cpu")
    a, b, c = (torch.empty(n, dtype=torch.uint8) for n in (100, 200, 300))
    pool.give(a, 600)
    pool.give(b, 600)
    pool.give(torch.empty(100, dtype=torch.uint8), 600)  # size 100 used again: now the most recent
    assert pool.held == 400
    pool.give(c, 600)  # 700 > 600: the least recently used size (200) goes
    assert pool.held == 500 and pool.take(cpu, 200) is None
    assert pool.take(cpu, 300) is c and pool.held == 200
    pool.give(torch.empty(700, dtype=torch.uint8), 600)  # larger than the bound: never kept
    assert pool.held == 200
    pool.trim(100)  # both arenas of size 100 are one size class: the older one goes first
    assert pool.held == 100 and pool.take(cpu, 100) is not a
    pool.clear()
    assert pool.held == 0 and not pool.free


def test_targets_named_are_those_a_failed_process_writes_or_reads_for() -> None:
    """Every segment with a failed process on either side names its target location; a
    process with none of them named nothing; an unknown failed set names every target."""
    from refplan import TransferEndpoints, TransferSegment
    from refplan.execute.outcome import _written_by
    from refplan.execute.schedule import _Param, _Schedule
    from refplan.plan import TransferPlan

    def seg(source: int, target: int) -> TransferSegment:
        return TransferSegment(source, 0, (1,), target, 0, (1,), (1,))

    segments = (seg(0, 0), seg(1, 1), seg(2, 2))  # location l: source on process l, target on process (l+1) % 3
    plan = TransferPlan(segments, (3,), 3)
    ends = TransferEndpoints({0: 0, 1: 1, 2: 2}, {0: 1, 1: 2, 2: 0})
    sched = _Schedule(params={"w": _Param(plan, list(segments), torch.float32)}, endpoints=ends)
    assert _written_by(sched, {1}) == {"w": (0, 1)}  # receives location 0, sends location 1
    assert _written_by(sched, {5}) == {}
    assert _written_by(sched, None) == {"w": (0, 1, 2)}


def test_retained_bytes_counts_each_held_storage_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``retained_bytes`` reports the memory failed calls hold outside the pool's bound: every
    storage reached through the retained records (lists, tuples, dicts of slots, work handles
    beside them) once, however many views of it were posted."""
    from refplan.execute import common, retained_bytes

    arena = torch.zeros(1000, dtype=torch.uint8)
    shard = torch.zeros(25, dtype=torch.float32)
    held: list[object] = [
        [arena[:100], arena[100:300]],  # two wires of one arena
        [(["a work handle"], [arena[500:], shard[5:]])],  # a round in flight: works beside buffers
        {("send", 1): [arena[:10], arena[10:20]]},  # a schedule's slots
    ]
    monkeypatch.setattr(common, "_RETAINED", [])
    assert retained_bytes() == 0
    monkeypatch.setattr(common, "_RETAINED", held)
    assert retained_bytes() == 1000 + 100


def test_odd_arguments_on_one_process_are_refused_on_both_naming_what_is_wrong() -> None:
    outcomes = run_ranks(worker.odd_arguments, 2, timeout=timedelta(seconds=30), deadline_s=120, grace_s=30)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    results = [o.value for o in outcomes]
    for res in results:
        assert res["outcome"]["raised"] == "TransferRejectedError" and res["outcome"]["unchanged"], res
        assert "outcome must be a bool, got NoneType" in res["outcome"]["message"], res
        assert res["str_key"]["raised"] == "TransferRejectedError" and res["str_key"]["unchanged"], res
        assert "location '1' (a str key: locations are ints)" in res["str_key"]["message"], res
    assert [r["outcome"]["message"] for r in results] == [results[0]["outcome"]["message"]] * 2
    assert all(r["right"]["exact"] for r in results), results
