"""The slab path's requests make their candidates on demand (``requests._UniformRequest``).

They must be indistinguishable from the ``ReplicaRequest`` the general path builds for the same
intersection: equal both ways and hashed alike, the same candidates (made once, then kept), the
same text, the same after pickling or ``dataclasses.replace``; a policy that is not refplan's own
gets plain requests; and the checker accepts exactly the same answers, naming the same holders
when it refuses one.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence

import pytest

from refplan import plan_transfers
from refplan.check import check_answers
from refplan.errors import InvalidReplicaPolicyError
from refplan.maps import contiguous_split_map, replicate
from refplan.planner import _renamed, collect_requests
from refplan.policies import balanced, first_holder, lpt
from refplan.requests import (
    ReplicaCandidate,
    ReplicaRequest,
    ReplicaSelectionRequest,
    TransferEndpoints,
    _make_request,
    _UniformRequest,
    holder_locations,
    uniform_read,
)

# TP2 x DP3 -> TP3: every target box is read from one source box held by three replicas.
_SOURCE = replicate(contiguous_split_map((6, 4), [3, 3], 0), 3)
_TARGET = contiguous_split_map((6, 4), [2, 2, 2], 0)
_BATCH = {"w": (_TARGET, _SOURCE)}
_ENDPOINTS = TransferEndpoints({s: s for s in range(6)}, {t: 10 + t for t in range(3)})


def _uniform() -> list[ReplicaRequest]:
    requests = collect_requests(_BATCH, endpoints=_ENDPOINTS, element_size=2)
    assert requests and all(type(r) is _UniformRequest for r in requests)
    return requests


def _plain(request: ReplicaRequest) -> ReplicaRequest:
    values = {f.name: getattr(request, f.name) for f in dataclasses.fields(ReplicaRequest)}
    return ReplicaRequest(**values)


def test_candidates_are_made_on_demand_once_and_equal_the_general_paths() -> None:
    requests = _uniform()
    first = requests[1]  # rows 2-3: the second half of source box 0 (locations 0, 2, 4), at row 2
    assert "candidates" not in first.__dict__
    assert holder_locations(first) == (0, 2, 4)
    assert uniform_read(first) == ((0, 2, 4), (8, (4, 1)))
    made = first.candidates
    assert made == (ReplicaCandidate(0, 8, (4, 1)), ReplicaCandidate(2, 8, (4, 1)), ReplicaCandidate(4, 8, (4, 1)))
    assert all(type(c) is ReplicaCandidate for c in made)
    assert first.candidates is made  # kept
    assert first.locations == (0, 2, 4)
    assert holder_locations(first) == (0, 2, 4)


def test_equal_and_hashed_as_the_plain_request() -> None:
    for request in _uniform():
        plain = _plain(request)
        assert type(plain) is ReplicaRequest
        assert plain == request and request == plain
        assert (plain != request) is False and (request != plain) is False
        assert hash(plain) == hash(request)
        assert repr(request) == repr(plain) and repr(request).startswith("ReplicaRequest(")
        other = dataclasses.replace(plain, target_offset=plain.target_offset + 1)
        assert other != request and request != other
    assert _uniform()[0] != _uniform()[1]


def test_pickle_replace_and_renamed_copies() -> None:
    request = _uniform()[2]
    again = pickle.loads(pickle.dumps(request))
    assert again == request and again.candidates == request.candidates
    moved = dataclasses.replace(request, parameter="v")
    assert moved.parameter == "v" and moved.candidates == request.candidates
    assert holder_locations(moved) == holder_locations(request)
    renamed = _renamed(request, "v")
    assert type(renamed) is ReplicaRequest  # a policy that is not refplan's own sees plain requests
    assert set(renamed.__dict__) == {f.name for f in dataclasses.fields(ReplicaRequest)}
    assert renamed == dataclasses.replace(_plain(request), parameter="v")


def test_checker_accepts_and_refuses_as_for_plain_requests() -> None:
    requests = _uniform()
    answers = [holder_locations(r)[-1] for r in requests]
    resolved = check_answers(requests, answers)
    assert all("candidates" not in r.__dict__ for r in requests)  # nothing made them
    plains = [_plain(r) for r in requests]
    assert resolved == check_answers(plains, answers)
    wrong: list[object] = [*answers]
    wrong[1] = 1  # location 1 holds the other source box
    with pytest.raises(InvalidReplicaPolicyError) as on_uniform:
        check_answers(requests, wrong)
    with pytest.raises(InvalidReplicaPolicyError) as on_plain:
        check_answers(plains, wrong)
    assert str(on_uniform.value) == str(on_plain.value)
    assert "location 1 is not one of its validated holders [0, 2, 4]" in str(on_uniform.value)
    for bad in (True, 2.0, -1, 6):
        wrong[1] = bad
        with pytest.raises(InvalidReplicaPolicyError) as on_uniform:
            check_answers(requests, wrong)
        with pytest.raises(InvalidReplicaPolicyError) as on_plain:
            check_answers(plains, wrong)
        assert str(on_uniform.value) == str(on_plain.value)


@pytest.mark.parametrize("policy", [balanced, lpt, first_holder])
def test_refplans_policies_answer_alike_on_both_kinds(policy: object) -> None:
    requests = _uniform()
    assert list(policy(requests)) == list(policy([_plain(r) for r in requests]))  # type: ignore[operator]


def test_a_foreign_policy_sees_plain_requests_and_plans_the_same() -> None:
    seen: list[ReplicaRequest] = []

    def last_holder(requests: Sequence[ReplicaRequest]) -> list[int]:
        seen.extend(requests)
        return [r.candidates[-1].source_rank for r in requests]

    plans = plan_transfers(_BATCH, endpoints=_ENDPOINTS, element_size=2, replica_policy=last_holder)
    assert seen and all(type(r) is ReplicaRequest for r in seen)
    mine = plan_transfers(_BATCH, endpoints=_ENDPOINTS, element_size=2,
                          replica_policy=lambda rs: [holder_locations(r)[-1] for r in rs])
    assert plans["w"].encode() == mine["w"].encode()


def test_selector_requests_carry_the_candidates() -> None:
    from refplan.policies import from_selector

    got: list[ReplicaSelectionRequest] = []

    def selector(request: ReplicaSelectionRequest) -> int:
        got.append(request)
        return request.candidates[0].source_rank

    requests = _uniform()
    from_selector(selector)(requests)
    assert [g.candidates for g in got] == [r.candidates for r in requests]


def test_make_request_of_the_same_fields_is_equal() -> None:
    request = _uniform()[0]
    made = _make_request(request.parameter, request.target_location, request.target_process, request.logical_origin,
                         request.shape, request.target_offset, request.target_strides, request.candidates,
                         request.candidate_processes, request.bytes, request.candidate_nodes, request.target_node)
    assert type(made) is ReplicaRequest and made == request and hash(made) == hash(request)


def test_the_general_path_makes_uniform_requests_too() -> None:
    """A region held by more locations than the slab path takes (40 replicas, beyond one k-d
    leaf): the general path's requests keep the holders' locations and one read address, and
    make their candidates on demand, equal to those it made eagerly before (a region held by k
    locations and read by k frames made k² candidates: 4 096 of each, 16.7 M and 5 s)."""
    from refplan.maps import replicated_map

    source = replicated_map((80, 4), 40)
    target = contiguous_split_map((80, 4), [2] * 40, 0)
    requests = collect_requests({"w": (target, source)}, element_size=2)
    assert len(requests) == 40 and all(type(r) is _UniformRequest for r in requests)
    for r in requests:
        assert "candidates" not in r.__dict__ and holder_locations(r) == tuple(range(40))
        offset = r.logical_origin[0] * 4
        assert r.candidates == tuple(ReplicaCandidate(h, offset, (4, 1)) for h in range(40))
        assert r == _plain(r) and hash(r) == hash(_plain(r))
    plans = plan_transfers({"w": (target, source)}, element_size=2)
    assert len(plans["w"].segments) == 40
