"""Exact tests of refplan/requests.py that `make mutation` found missing (docs/mutation.md, "The planner's core").

``build_requests`` on a hand-worked layout: the parameter name it is given, the fields left
``None`` when no endpoints or nodes are bound, and the exact refusals for an unbound location or
process (the parameter, the side and the location named).
"""

from __future__ import annotations

import pytest

from refplan.box import WorkCounter
from refplan.errors import InvalidMapError
from refplan.frames import normalize
from refplan.maps import contiguous_split_map, replicate
from refplan.regions import Intersection, intersections, source_regions
from refplan.requests import ReplicaCandidate, TransferEndpoints, build_requests


def _inters() -> list[Intersection]:
    """F = (4, 2): target rows [0, 2) at location 0 and [2, 4) at location 1; the source splits
    rows [0, 1) / [1, 4) over locations 0 and 1, replicated to 2 and 3."""
    target = normalize(contiguous_split_map((4, 2), [2, 2], 0), "target", "w")
    source = normalize(replicate(contiguous_split_map((4, 2), [1, 3], 0), 2), "source", "w")
    return intersections(target, source_regions(source, WorkCounter()), WorkCounter())


ENDPOINTS = TransferEndpoints(source={0: 10, 1: 11, 2: 12, 3: 13}, target={0: 20, 1: 21})


def test_requests_carry_the_parameter_and_exact_addresses() -> None:
    got = build_requests("w", _inters(), element_size=2)
    assert [r.parameter for r in got] == ["w", "w", "w"]
    assert [(r.target_location, r.logical_origin, r.shape, r.target_offset) for r in got] == [
        (0, (0, 0), (1, 2), 0), (0, (1, 0), (1, 2), 2), (1, (2, 0), (2, 2), 0),
    ]
    # Row 1 lies at row 0 of the shard of locations 1 and 3 (rows [1, 4)); row 2 at its row 1.
    assert got[1].candidates == (ReplicaCandidate(1, 0, (2, 1)), ReplicaCandidate(3, 0, (2, 1)))
    assert got[2].candidates == (ReplicaCandidate(1, 2, (2, 1)), ReplicaCandidate(3, 2, (2, 1)))
    assert [r.bytes for r in got] == [4, 4, 8]


def test_without_endpoints_processes_and_nodes_are_none() -> None:
    for r in build_requests("w", _inters()):
        assert r.target_process is None and r.target_node is None and r.candidate_nodes is None
        assert r.candidate_processes == (None, None)
        assert r.bytes is None


def test_with_endpoints_but_no_nodes_only_processes_are_bound() -> None:
    got = build_requests("w", _inters(), endpoints=ENDPOINTS)
    assert [(r.target_process, r.candidate_processes) for r in got] == [
        (20, (10, 12)), (20, (11, 13)), (21, (11, 13)),
    ]
    for r in got:
        assert r.target_node is None and r.candidate_nodes is None


def test_with_nodes_every_process_is_placed() -> None:
    nodes = {10: 0, 11: 0, 12: 1, 13: 1, 20: 0, 21: 1}
    got = build_requests("w", _inters(), endpoints=ENDPOINTS, process_node=nodes)
    assert [(r.target_node, r.candidate_nodes) for r in got] == [(0, (0, 1)), (0, (0, 1)), (1, (0, 1))]


def test_an_unbound_target_location_is_named() -> None:
    endpoints = TransferEndpoints(source=ENDPOINTS.source, target={0: 20})
    with pytest.raises(InvalidMapError) as info:
        build_requests("w", _inters(), endpoints=endpoints)
    assert str(info.value) == (
        "parameter 'w': endpoints bind no process to target location 1, which holds data of this parameter"
    )


def test_an_unbound_source_location_is_named() -> None:
    endpoints = TransferEndpoints(source={0: 10, 1: 11, 2: 12}, target=ENDPOINTS.target)
    with pytest.raises(InvalidMapError) as info:
        build_requests("w", _inters(), endpoints=endpoints)
    assert str(info.value) == (
        "parameter 'w': endpoints bind no process to source location 3, which holds data of this parameter"
    )


@pytest.mark.parametrize(("missing", "process"), [(21, 21), (13, 13)], ids=["target process", "source process"])
def test_an_unplaced_process_is_named(missing: int, process: int) -> None:
    nodes = {p: 0 for p in (10, 11, 12, 13, 20, 21) if p != missing}
    with pytest.raises(InvalidMapError) as info:
        build_requests("w", _inters(), endpoints=ENDPOINTS, process_node=nodes)
    assert str(info.value) == f"parameter 'w': process_node names no node for process {process}"
