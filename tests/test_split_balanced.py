"""``split_balanced`` at large replication: its shared candidate groups and its ordered search
must choose exactly what pricing every candidate of every request chooses, without k² work."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refplan import contiguous_split_map, replicated_map
from refplan.planner import _for_policy, collect_requests, plan_transfers
from refplan.policies import balanced, split_balanced, split_balanced_policy
from refplan.requests import ReplicaCandidate, ReplicaRequest

module: Any = sys.modules["refplan.policies.split_balanced"]  # the package's name is the policy's


def _request(
    locations: list[int], size: int, *, processes: list[int] | None = None, target: int | None = None,
    nodes: list[int] | None = None, target_node: int | None = None, length: int = 1, location: int = 0,
) -> ReplicaRequest:
    return ReplicaRequest(
        parameter="w", target_location=location, target_process=target, logical_origin=(0,), shape=(length,),
        target_offset=0, target_strides=(1,),
        candidates=tuple(ReplicaCandidate(loc, 0, (1,)) for loc in locations),
        candidate_processes=tuple(processes) if processes is not None else (None,) * len(locations),
        bytes=size, candidate_nodes=tuple(nodes) if nodes is not None else None, target_node=target_node,
    )


@st.composite
def _batches(draw: st.DrawFn) -> list[ReplicaRequest]:
    """Overlapping holder sets (a process may hold several locations of one set), shared and
    repeated request objects, local copies, nodes, single holders and splittable lengths."""
    known = draw(st.booleans())
    processes = draw(st.integers(1, 6))
    with_nodes = known and draw(st.booleans())
    pool = []
    for _ in range(draw(st.integers(1, 6))):
        locations = draw(st.lists(st.integers(0, 11), min_size=1, max_size=8, unique=True))
        procs = [draw(st.integers(0, processes - 1)) for _ in locations] if known else None
        nodes = [p % 2 for p in procs] if with_nodes and procs is not None else None
        target = draw(st.integers(0, processes + 1)) if known else None
        length = draw(st.sampled_from([1, 4, 64, 1000]))
        pool.append(_request(locations, length * draw(st.sampled_from([1, 2, 8])), processes=procs, target=target,
                             nodes=nodes, target_node=None if nodes is None or target is None else target % 2,
                             length=length))
    picked = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=40))
    fresh = draw(st.booleans())  # distinct objects with equal holders: groups found by value
    return [dataclasses.replace(pool[i]) if fresh else pool[i] for i in picked]


_POLICIES = [split_balanced_policy(min_split_bytes=m, alpha=a, beta=b)
             for m, a, b in [(8, 1.0, 64.0), (8, 0.0, 64.0), (1, 0.0, 3.0), (1 << 20, 30e-6, 25e9)]]


@settings(deadline=None, max_examples=1000)
@given(_batches(), st.sampled_from(_POLICIES))
def test_the_ordered_search_and_the_shared_groups_choose_what_pricing_each_candidate_chooses(
    requests: list[ReplicaRequest], policy: Any
) -> None:
    """The plain reading is one group per request (``_SHARE_GROUPS`` off: every edge of the
    levelling is a request's own) and a scan of every candidate in step 2 (``_HEAP_FROM`` above
    any group). With ``_HEAP_FROM`` at 1 every group's step 2 goes through ``_Cheapest``; with
    groups shared, the levelling reads its edges through them. Every combination must give the
    plain reading's answers (splits included), and so must the same batch as fresh request
    objects (groups found by value, not identity)."""
    saved = module._HEAP_FROM, module._SHARE_GROUPS
    try:
        module._HEAP_FROM, module._SHARE_GROUPS = 1 << 30, False
        plain = policy(requests)
        for heap_from, share in ((1, False), (1 << 30, True), (1, True)):
            module._HEAP_FROM, module._SHARE_GROUPS = heap_from, share
            assert policy(requests) == plain, (heap_from, share)
    finally:
        module._HEAP_FROM, module._SHARE_GROUPS = saved
    assert policy([dataclasses.replace(r) for r in requests]) == plain


def test_sums_that_round_alike_are_a_tie_broken_by_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """Location 5 carries 1/3 + 2/3 + 4/3 seconds, location 1 carries 2/3 + 4/3 + 1/3: one ulp
    more (2.333…33 against 2.333…35). After 5/3 more the two sums are the same float, so the
    scan's key (sum, path, location) ties on the sum and takes location 1. An ordered search
    by sender time alone would take location 5; ``_Cheapest`` looks past the least time while
    the sums are equal."""
    assert (1 / 3 + 2 / 3) + 4 / 3 < (2 / 3 + 4 / 3) + 1 / 3
    assert ((1 / 3 + 2 / 3) + 4 / 3) + 5 / 3 == ((2 / 3 + 4 / 3) + 1 / 3) + 5 / 3
    fixed = [_request([loc], size) for loc, size in [(5, 1), (1, 2), (5, 2), (1, 4), (5, 4), (1, 1)]]
    requests = [*fixed, _request([5, 1], 5)]
    policy = split_balanced_policy(min_split_bytes=1 << 20, alpha=0.0, beta=3.0)
    for heap_from in (1, 1 << 30):
        monkeypatch.setattr(module, "_HEAP_FROM", heap_from)
        assert policy(requests)[-1] == 1


def test_a_region_held_by_many_locations_is_priced_once_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """512 row shards read a tensor replicated on 512 locations: every request has the same 512
    holders. Their candidates are priced once (512, not 512²), the planner hands the policy its
    shared requests (no copy makes their candidates), and the plan is each target's rows from
    a distinct replica."""
    made = [0]
    real = module._Candidate

    class Counted(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            made[0] += 1
            super().__init__(*args)

    monkeypatch.setattr(module, "_Candidate", Counted)
    k = 512
    pairs = {"w": (contiguous_split_map((4 * k, 8), [4] * k, 0), replicated_map((4 * k, 8), k))}
    plans = plan_transfers(pairs, replica_policy=split_balanced, element_size=2)
    assert made[0] == k
    assert sorted(s.source_rank for s in plans["w"].segments) == list(range(k))
    requests = collect_requests(pairs, element_size=2)
    assert all("candidates" not in r.__dict__ for r in requests)  # made on demand, and never asked for
    split_balanced(requests)
    assert all("candidates" not in r.__dict__ for r in requests)


def test_every_split_balanced_policy_gets_the_shared_requests_and_nothing_else_does() -> None:
    requests = collect_requests({"w": (contiguous_split_map((8, 8), [4, 4], 0), replicated_map((8, 8), 2))})
    names = ["w"] * len(requests)
    made = split_balanced_policy(min_split_bytes=4)
    for policy in (split_balanced, made, balanced):
        assert all(a is b for a, b in zip(_for_policy(policy, requests, names), requests))

    class Hostile:
        """A policy whose ``==`` and hash raise: it is told apart by identity alone."""

        def __call__(self, requests: Any) -> list[int]:
            return [min(c.source_rank for c in r.candidates) for r in requests]

        def __eq__(self, other: object) -> bool:
            raise AssertionError("compared")

        __hash__ = None  # type: ignore[assignment]

    for other in (Hostile(), lambda rs: [0] * len(rs)):
        assert not any(a is b for a, b in zip(_for_policy(other, requests, names), requests))
    assert not module.made_by_split_balanced(Hostile())
    del made  # its entry goes with it
    assert all(ref() is not None for ref in module._MADE.values())


def _served(answer: Any) -> set[int]:
    return {answer} if isinstance(answer, int) else {part.source_location for part in answer}


def test_levelling_reaches_every_holder_of_a_group_and_moves_onto_its_nearest_location() -> None:
    """Two equal requests held by three processes, for two target processes: step 2 leaves the
    third holder idle, and levelling
    moves part of the busiest one's request there (a holder found through the group's units,
    past the first two). Process 2 holds locations 4 and 2: the moved part is served by 2,
    the nearest (lowest path rank, then location) of that process."""
    holders, processes = [0, 1, 4, 2], [0, 1, 2, 2]
    requests = [_request(holders, 8000, processes=processes, target=t, length=1000) for t in (8, 9)]
    answers = split_balanced_policy(min_split_bytes=8, alpha=0.0, beta=64.0)(requests)
    served = set().union(*map(_served, answers))
    assert 2 in served and 4 not in served, answers
    without = split_balanced_policy(min_split_bytes=8, alpha=0.0, beta=64.0)(
        [_request([0, 1, 4], 8000, processes=[0, 1, 2], target=t, length=1000) for t in (8, 9)]
    )
    assert 4 in set().union(*map(_served, without)), without  # the third process is used at all


def test_levelling_carries_load_along_a_chain_of_groups() -> None:
    """Holders {0, 1} and {1, 2}, and a fixed load on 2: after step 2 sender 0 is the busiest (125
    s), 1 carries 110 and 2 carries 90. The lightest, 2, shares no request with 0, so levelling
    carries load along 0 → 1 → 2 (edges read through two groups): part of the first request
    moves to 1, and part of the second on to 2."""
    first = _request([0, 1], 8000, length=1000, location=10)
    second = _request([1, 2], 7040, length=880, location=11)
    fixed = _request([2], 5760, length=720, location=12)
    answers = split_balanced_policy(min_split_bytes=8, alpha=0.0, beta=64.0)([fixed, first, second])
    assert _served(answers[1]) == {0, 1} and _served(answers[2]) == {1, 2}, answers
