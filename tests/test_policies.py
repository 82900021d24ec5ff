"""The default ``balanced`` policy, ``first_holder`` and the per-request selector adapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refplan import InvalidMapError, ReplicaRequest, TransferEndpoints, contiguous_split_map, replicate
from refplan.analysis import sender_load
from refplan.cli.demo import demo_batch
from refplan.planner import plan_transfer, plan_transfers
from refplan.policies import balanced, first_holder, from_selector, lpt
from refplan.requests import ReplicaCandidate
from refplan.simulate import simulate_transfer


def _llama_tp4_dp4_to_tp8(layers: int = 4) -> tuple[Any, TransferEndpoints, dict[str, int]]:
    pairs, _ep, sizes = demo_batch(layers=layers, tp_source=4, dp_source=4, tp_target=8)
    endpoints = TransferEndpoints(source={i: i for i in range(16)}, target={i: 16 + i for i in range(8)})
    return pairs, endpoints, sizes


def test_balanced_default_keeps_every_sender_within_1_1x_of_even_share() -> None:
    pairs, endpoints, sizes = _llama_tp4_dp4_to_tp8()
    plans = plan_transfers(pairs, endpoints=endpoints, element_size=sizes)  # default policy
    load = sender_load(plans, endpoints=endpoints, element_size=sizes, senders=list(range(16)))
    assert load.imbalance(16) <= 1.1
    old = plan_transfers(pairs, endpoints=endpoints, element_size=sizes, replica_policy=first_holder)
    old_load = sender_load(old, endpoints=endpoints, element_size=sizes, senders=list(range(16)))
    assert old_load.imbalance(16) > 3.9  # lowest-holder puts everything on DP replica 0
    for name, plan in plans.items():
        assert simulate_transfer(pairs[name][0], pairs[name][1], plan).exact


def test_balanced_without_endpoints_balances_source_locations() -> None:
    pairs, _endpoints, _sizes = _llama_tp4_dp4_to_tp8()
    plans = plan_transfers(pairs)
    load = sender_load(plans, senders=list(range(16)))
    assert not load.by_process
    assert load.imbalance(16) <= 1.1


def test_balanced_prefers_a_local_holder() -> None:
    # Target location t runs on process t, which is also source location t's process.
    source = replicate(contiguous_split_map((16, 8), [8, 8], 0), 4)  # locations 0..7, slice = loc % 2
    target = contiguous_split_map((16, 8), [4, 4, 4, 4], 0)
    endpoints = TransferEndpoints(source={i: i for i in range(8)}, target={i: i for i in range(4)})
    seen: list[ReplicaRequest] = []

    def spy(requests: Sequence[ReplicaRequest]) -> list[Any]:
        seen.extend(requests)
        return balanced(requests)

    plan = plan_transfer(target, source, endpoints=endpoints, replica_policy=spy)
    local_targets = set()
    for req in seen:
        assert req.target_process == req.target_location
        assert req.candidate_processes == req.locations
        local = [c for c, p in zip(req.locations, req.candidate_processes) if p == req.target_process]
        if local:
            local_targets.add(req.target_location)
            assert any(
                s.target_rank == req.target_location and s.source_rank == min(local) for s in plan.segments
            )
    # Target t needs slice t // 2; location t holds slice t % 2: only t = 0 and t = 3 have a local holder.
    assert local_targets == {0, 3}
    assert simulate_transfer(target, source, plan).exact


def test_balanced_counts_single_holder_load_and_ties_to_lowest_location() -> None:
    # Parameter "a": single holder 0 (must be counted); parameter "b": holders {0, 1}.
    single = contiguous_split_map((4, 4), [4], 0)
    double = replicate(contiguous_split_map((4, 4), [4], 0), 2)
    target = contiguous_split_map((4, 4), [4], 0)
    plans = plan_transfers({"a": (target, single), "b": (target, double)})
    assert {s.source_rank for s in plans["b"].segments} == {1}
    tie = plan_transfers({"b": (target, double)})
    assert {s.source_rank for s in tie["b"].segments} == {0}


def test_balanced_process_nodes_are_reported_to_policies() -> None:
    source = replicate(contiguous_split_map((8, 4), [8], 0), 2)
    target = contiguous_split_map((8, 4), [8], 0)
    endpoints = TransferEndpoints(source={0: 0, 1: 1}, target={0: 2})
    seen: list[ReplicaRequest] = []

    def spy(requests: Sequence[ReplicaRequest]) -> list[Any]:
        seen.extend(requests)
        return first_holder(requests)

    plan_transfer(target, source, endpoints=endpoints, process_node={0: 0, 1: 1, 2: 1}, replica_policy=spy,
                  element_size=2)
    (req,) = seen
    assert req.candidate_nodes == (0, 1) and req.target_node == 1 and req.bytes == 64
    with pytest.raises(InvalidMapError, match="process_node names no node for process 2"):
        plan_transfer(target, source, endpoints=endpoints, process_node={0: 0, 1: 1})
    with pytest.raises(InvalidMapError, match="needs endpoints"):
        plan_transfer(target, source, process_node={0: 0})


def test_missing_endpoint_binding_is_refused() -> None:
    source = replicate(contiguous_split_map((8, 4), [8], 0), 2)
    target = contiguous_split_map((8, 4), [8], 0)
    with pytest.raises(InvalidMapError, match="source location 1"):
        plan_transfer(target, source, endpoints=TransferEndpoints(source={0: 0}, target={0: 2}))
    with pytest.raises(InvalidMapError, match="target location 0"):
        plan_transfer(target, source, endpoints=TransferEndpoints(source={0: 0, 1: 1}, target={}))


def test_first_holder_is_the_lowest_location() -> None:
    source = replicate(contiguous_split_map((8, 4), [4, 4], 0), 3)
    target = contiguous_split_map((8, 4), [8], 0)
    plan = plan_transfer(target, source, replica_policy=first_holder)
    assert sorted({s.source_rank for s in plan.segments}) == [0, 1]


def test_from_selector_is_called_only_for_replicated_requests() -> None:
    calls: list[Any] = []

    def selector(request: Any) -> int:
        calls.append(request)
        return int(max(c.source_rank for c in request.candidates))

    source = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
    single = contiguous_split_map((8, 4), [4, 4], 0)
    target = contiguous_split_map((8, 4), [2, 6], 0)
    plan = plan_transfer(target, source, replica_selector=selector)
    assert len(calls) == 3 and {s.source_rank for s in plan.segments} == {2, 3}
    calls.clear()
    plan_transfer(target, single, replica_policy=from_selector(selector))
    assert calls == []


def test_balanced_is_deterministic_and_order_independent() -> None:
    pairs, endpoints, sizes = _llama_tp4_dp4_to_tp8(layers=2)
    first = plan_transfers(pairs, endpoints=endpoints, element_size=sizes)
    reversed_pairs = dict(reversed(list(pairs.items())))
    second = plan_transfers(reversed_pairs, endpoints=endpoints, element_size=dict(reversed(list(sizes.items()))))
    assert {k: v.to_dict() for k, v in first.items()} == {k: v.to_dict() for k, v in second.items()}
    assert list(first) == sorted(pairs)


# -- the least-loaded rule against a plain statement of it ----------------------------------------


def _rule(requests: Sequence[ReplicaRequest], local_first: bool) -> list[int]:
    """The documented rule, stated plainly: no caching, no heaps. Loads count per process when
    every request knows its processes, else per location. ``local_first`` is ``balanced``: local
    copies and single-holder requests are counted first; then the movable requests, by (fewest
    distinct units, largest, request order), each go to the first holder (by location, then
    candidate order) whose unit has the least load."""
    by_process = bool(requests) and all(
        r.target_process is not None and None not in r.candidate_processes for r in requests
    )

    def units(r: ReplicaRequest) -> list[tuple[int, int, int]]:  # (location, candidate order, unit)
        return sorted(
            (c.source_rank, k, p if by_process and p is not None else c.source_rank)
            for k, (c, p) in enumerate(zip(r.candidates, r.candidate_processes))
        )

    def size(r: ReplicaRequest) -> int:
        return r.bytes if r.bytes is not None else r.elements

    load: dict[int, int] = {}
    answers: list[int | None] = [None] * len(requests)
    movable = []
    for i, r in enumerate(requests):
        held = units(r)
        local = [loc for loc, _, u in held if by_process and u == r.target_process]
        if local_first and local:
            answers[i] = min(local)
        elif local_first and len(held) == 1:
            answers[i] = held[0][0]
        else:
            movable.append(i)
            continue
        unit = next(u for loc, _, u in held if loc == answers[i])
        load[unit] = load.get(unit, 0) + size(requests[i])
    movable.sort(key=lambda i: (len({u for _, _, u in units(requests[i])}), -size(requests[i]), i))
    for i in movable:
        held = units(requests[i])
        best = min(range(len(held)), key=lambda j: (load.get(held[j][2], 0), j))
        answers[i] = held[best][0]
        load[held[best][2]] = load.get(held[best][2], 0) + size(requests[i])
    return [a for a in answers if a is not None]


@st.composite
def _request_batches(draw: st.DrawFn) -> list[ReplicaRequest]:
    """A pool of requests whose holder sets overlap (a process may serve several sets, and two
    locations of one set may share a process), repeated in a drawn order like a layout's twins."""
    processes = draw(st.integers(1, 5))
    known = draw(st.booleans())  # every process known, or none (loads per location)
    pool = []
    for n in range(draw(st.integers(1, 6))):
        locations = draw(st.lists(st.integers(0, 7), min_size=1, max_size=5, unique=True))
        procs = tuple(draw(st.integers(0, processes - 1)) if known else None for _ in locations)
        pool.append(ReplicaRequest(
            parameter=f"p{n}", target_location=0,
            target_process=draw(st.integers(0, processes + 1)) if known else None,
            logical_origin=(0,), shape=(draw(st.integers(1, 4)),), target_offset=0, target_strides=(1,),
            candidates=tuple(ReplicaCandidate(loc, 0, (1,)) for loc in locations),
            candidate_processes=procs, bytes=draw(st.sampled_from([None, 2, 4, 6])),
        ))
    return [pool[i] for i in draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=40))]


@settings(max_examples=300, deadline=None)
@given(_request_batches())
def test_balanced_and_lpt_answer_exactly_what_the_plain_rule_answers(requests: list[ReplicaRequest]) -> None:
    """``balanced``/``lpt`` keep one heap per holder set, refreshed lazily when a shared process's
    load grew through another set; this holds them to the rule itself on overlapping sets,
    shared processes within a set, local copies, single holders, equal sizes and repeated
    request objects (and on a tuple and a list alike)."""
    assert balanced(requests) == _rule(requests, local_first=True)
    assert lpt(tuple(requests)) == _rule(requests, local_first=False)


@settings(max_examples=150, deadline=None)
@given(_request_batches())
def test_balanced_on_fresh_request_objects_answers_the_plain_rule(requests: list[ReplicaRequest]) -> None:
    """A batch of distinct layouts hands over distinct request objects, several with equal
    holders: ``balanced`` then shares its holder work by content (not identity) and must still
    answer exactly the rule, as on the shared objects."""
    fresh = [dataclasses.replace(r) for r in requests]
    assert len({id(r) for r in fresh}) == len(fresh)
    assert balanced(fresh) == _rule(fresh, local_first=True) == balanced(requests)
    assert lpt(fresh) == _rule(fresh, local_first=False)


def test_balanced_shares_holder_work_only_between_requests_with_the_same_target_process() -> None:
    """Equal holders but different target processes: each request's local copy is its own."""

    def request(target_process: int) -> ReplicaRequest:
        return ReplicaRequest(
            parameter="w", target_location=0, target_process=target_process, logical_origin=(0,), shape=(4,),
            target_offset=0, target_strides=(1,), bytes=4,
            candidates=(ReplicaCandidate(0, 0, (1,)), ReplicaCandidate(1, 0, (1,))), candidate_processes=(0, 1),
        )

    requests = [request(1), request(0), request(1)]
    assert balanced(requests) == _rule(requests, local_first=True) == [1, 0, 1]
