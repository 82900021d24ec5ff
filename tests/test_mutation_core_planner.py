"""Exact tests of refplan/planner.py that `make mutation` found missing (docs/mutation.md, "The planner's core").

The argument refusals of ``plan_transfers`` word for word, ``element_size`` in each of its forms
(one int, a dict, any other mapping), the pair-check statistic and budget against the pipeline's
own stages run by hand, the per-layout reuse (one request build per layout and element size, the
same plan object for twins with the same answers, a different plan for twins split differently),
and the policy's exception as reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import pytest

from refplan import planner
from refplan.box import WorkCounter
from refplan.errors import AffineTransferError, InvalidMapError, InvalidReplicaPolicyError, PolicyRaisedError
from refplan.frames import normalize
from refplan.limits import MAX_ELEMENT_SIZE, MEMO_MAX_PIECES, PlanBudget
from refplan.maps import AffinePiece, ParamAffineMap, contiguous_split_map, replicate, replicated_map
from refplan.plan import TransferSegment
from refplan.planner import collect_requests, plan_transfer, plan_transfers
from refplan.policies import first_holder
from refplan.regions import check_target_cover, intersections, source_regions
from refplan.requests import ReplicaPart, ReplicaRequest, TransferEndpoints


def _pair() -> tuple[ParamAffineMap, ParamAffineMap]:
    """F = (4,) at target location 0; the source holds it whole at locations 0 and 1."""
    return contiguous_split_map((4,), [4], 0), replicated_map((4,), 2)


# ---------------------------------------------------------------------------------------------
# Argument refusals


def test_pairs_must_be_a_mapping_of_pairs() -> None:
    with pytest.raises(InvalidMapError) as info:
        plan_transfers([_pair()])  # type: ignore[arg-type]
    assert str(info.value) == "pairs must map parameter name -> (target map, source map)"
    with pytest.raises(InvalidMapError) as info:
        plan_transfers({"w": list(_pair())})  # type: ignore[dict-item]
    assert str(info.value) == "parameter 'w': expected a (target map, source map) pair"
    target, _source = _pair()
    with pytest.raises(InvalidMapError) as info:
        plan_transfers({"w": (target, target.to_dict())})  # type: ignore[dict-item]
    assert str(info.value) == "parameter 'w': expected a (target ParamAffineMap, source ParamAffineMap) pair"


def test_parameter_names_must_be_strings() -> None:
    with pytest.raises(InvalidMapError) as info:
        plan_transfers({1: _pair()})  # type: ignore[dict-item]
    assert str(info.value) == "parameter names must be strings"

    class Name(str):
        pass

    plans = plan_transfers({Name("w"): _pair()}, replica_policy=first_holder)
    assert list(plans) == ["w"] and plans["w"].moved_elements == 4


def test_process_node_needs_endpoints() -> None:
    with pytest.raises(InvalidMapError) as info:
        plan_transfers({"w": _pair()}, process_node={0: 0})
    assert str(info.value) == "process_node needs endpoints: nodes are known per process, not per location"


def test_min_split_bytes_is_a_non_negative_int() -> None:
    with pytest.raises(TypeError) as info:
        plan_transfers({"w": _pair()}, min_split_bytes=True)
    assert str(info.value) == "min_split_bytes must be an int, got bool"
    with pytest.raises(ValueError) as info:
        plan_transfers({"w": _pair()}, min_split_bytes=-1)
    assert str(info.value) == "min_split_bytes must be non-negative, got -1"
    assert plan_transfers({"w": _pair()}, min_split_bytes=0)["w"].moved_elements == 4


def test_selector_and_policy_are_exclusive() -> None:
    with pytest.raises(InvalidReplicaPolicyError) as info:
        plan_transfer(*_pair(), replica_selector=lambda r: r.candidates[0].source_rank, replica_policy=first_holder)
    assert str(info.value) == "give replica_selector or replica_policy, not both"


# ---------------------------------------------------------------------------------------------
# element_size


def _bytes(element_size: Any) -> list[int | None]:
    pairs = {"a": _pair(), "b": (contiguous_split_map((6,), [2, 4], 0), replicated_map((6,), 1))}
    return [r.bytes for r in collect_requests(pairs, element_size=element_size)]


def test_element_size_as_one_int_dict_or_mapping() -> None:
    # a: one request of 4 elements; b: requests of 2 and 4 elements.
    assert _bytes(2) == [8, 4, 8]
    assert _bytes(1) == [4, 2, 4]
    assert _bytes({"a": 3, "b": 1}) == [12, 2, 4]
    assert _bytes(MappingProxyType({"a": 1, "b": 5})) == [4, 10, 20]
    assert _bytes(None) == [None, None, None]
    big = MAX_ELEMENT_SIZE  # the largest size is accepted in every form
    assert _bytes(big) == _bytes({"a": big, "b": big}) == _bytes(MappingProxyType({"a": big, "b": big})) == [
        4 * big, 2 * big, 4 * big,
    ]


@pytest.mark.parametrize(("element_size", "cls", "message"), [
    (0, ValueError, "element_size must be positive, got 0"),
    ("2", TypeError, "element_size must be an int (every parameter) or map parameter name -> bytes, got str"),
    ({"a": 2, "b": 0}, ValueError, "parameter 'b': element_size must be positive, got 0"),
    ({"a": -2, "b": 2}, ValueError, "parameter 'a': element_size must be positive, got -2"),
    ({"a": 2}, ValueError, "parameter 'b': element_size gives no size for it"),
    ({"a": 2, "b": True}, TypeError, "parameter 'b': element_size must be an int, got bool"),
    (MappingProxyType({"a": 2, "b": 0}), ValueError, "parameter 'b': element_size must be positive, got 0"),
    (MappingProxyType({"b": 2}), ValueError, "parameter 'a': element_size gives no size for it"),
    (MappingProxyType({"a": 2.0, "b": 2}), TypeError, "parameter 'a': element_size must be an int, got float"),
    (MAX_ELEMENT_SIZE + 1, ValueError,
     f"element_size must be at most {MAX_ELEMENT_SIZE} bytes, got {MAX_ELEMENT_SIZE + 1}"),
    (MappingProxyType({"a": 1, "b": MAX_ELEMENT_SIZE + 1}), ValueError,
     f"parameter 'b': element_size must be at most {MAX_ELEMENT_SIZE} bytes, got {MAX_ELEMENT_SIZE + 1}"),
])
def test_element_size_refusals(element_size: Any, cls: type[Exception], message: str) -> None:
    with pytest.raises(cls) as info:
        _bytes(element_size)
    assert str(info.value) == message


def test_split_parts_are_measured_in_bytes_of_their_parameter() -> None:
    # Two 2-element parts of 4-byte elements are 8 bytes each: exactly min_split_bytes=8.
    def halves(requests: Sequence[ReplicaRequest]) -> list[Any]:
        return [[ReplicaPart((0,), (2,), 0), ReplicaPart((2,), (2,), 1)] for _ in requests]

    plan = plan_transfers({"w": _pair()}, element_size={"w": 4}, min_split_bytes=8, replica_policy=halves)["w"]
    assert plan.segments == (
        TransferSegment(0, 0, (1,), 0, 0, (1,), (2,)), TransferSegment(1, 2, (1,), 0, 2, (1,), (2,)),
    )
    with pytest.raises(InvalidReplicaPolicyError, match="below min_split_bytes=9"):
        plan_transfers({"w": _pair()}, element_size={"w": 4}, min_split_bytes=9, replica_policy=halves)


# ---------------------------------------------------------------------------------------------
# Endpoints and nodes reach the requests


def test_collect_requests_binds_processes_and_nodes() -> None:
    endpoints = TransferEndpoints(source={0: 5, 1: 6}, target={0: 7})
    [request] = collect_requests({"w": _pair()}, endpoints=endpoints, process_node={5: 0, 6: 1, 7: 1})
    assert (request.target_process, request.candidate_processes) == (7, (5, 6))
    assert (request.target_node, request.candidate_nodes) == (1, (0, 1))


# ---------------------------------------------------------------------------------------------
# Pair checks: the statistic and the budget


def _layout() -> tuple[ParamAffineMap, ParamAffineMap]:
    """Target: 8 columns of F = (2, 8), one per location; source: two row halves, replicated."""
    return contiguous_split_map((2, 8), [1] * 8, 1), replicate(contiguous_split_map((2, 8), [1, 1], 0), 2)


def _stage_counts() -> list[tuple[str, int]]:
    """The comparisons charged by each stage, run by hand in the planner's order, with the side
    each counter is named for: validating the source, then the target, grouping the source
    regions (the source's counter), checking the target cover (the target's counter), and
    intersecting (a third counter, named for the target). Each counter has its own limit."""
    target_map, source_map = _layout()
    s, t, j = WorkCounter(), WorkCounter(), WorkCounter()
    source = normalize(source_map, "source", "w", work=s)
    s_alone = s.count
    target = normalize(target_map, "target", "w", work=t)
    t_alone = t.count
    regions = source_regions(source, s)
    check_target_cover(target, t)
    intersections(target, regions, j)
    return [("source", s_alone), ("target", t_alone), ("source", s.count), ("target", t.count), ("target", j.count)]


def test_pair_checks_count_every_stage() -> None:
    stages = _stage_counts()
    assert min(count for _side, count in stages) > 0
    plan = plan_transfer(*_layout())
    assert plan.statistics.pair_checks == stages[2][1] + stages[3][1] + stages[4][1]


def test_each_pair_budget_names_its_side() -> None:
    stages = _stage_counts()
    message = "parameter 'w', {} map: validation needs more than max_pair_checks={} box comparisons; the plan is " \
        "refused rather than truncated (raise the budget to plan it)"
    sides = set()
    for limit in sorted({count - 1 for _side, count in stages}):
        side = next(side for side, count in stages if count > limit)  # the first stage past the limit
        sides.add(side)
        with pytest.raises(AffineTransferError) as info:
            plan_transfers({"w": _layout()}, PlanBudget(max_pair_checks=limit))
        assert str(info.value) == message.format(side, limit)
    assert sides == {"source", "target"}
    top = max(count for _side, count in stages)
    assert plan_transfers({"w": _layout()}, PlanBudget(max_pair_checks=top))["w"].moved_elements == 16


# ---------------------------------------------------------------------------------------------
# Reuse per layout


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    built: list[str] = []
    real = planner.build_requests

    def counting(name: str, *args: Any, **kwargs: Any) -> list[ReplicaRequest]:
        built.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(planner, "build_requests", counting)
    return built


def test_twins_share_requests_per_element_size_and_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _count_builds(monkeypatch)
    pairs = {"a": _layout(), "b": _layout(), "c": _layout(), "d": _layout()}
    plans = plan_transfers(pairs, element_size={"a": 2, "b": 4, "c": 2, "d": 4}, replica_policy=first_holder)
    assert built == ["a", "b"]  # one build per element size of the one layout
    assert plans["a"] is plans["b"] is plans["c"] is plans["d"]


def test_a_map_of_a_subclass_is_never_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    class Sub(ParamAffineMap):
        pass

    target, source = _layout()
    odd = Sub(target.logical_shape, target.shard_shapes, target.pieces_by_rank)
    built = _count_builds(monkeypatch)
    plans = plan_transfers({"a": (odd, source), "b": (odd, source)}, replica_policy=first_holder)
    assert built == ["a", "b"] and plans["a"] is not plans["b"] and plans["a"] == plans["b"]


@pytest.mark.parametrize(("pieces", "shared"), [(MEMO_MAX_PIECES, True), (MEMO_MAX_PIECES + 1, False)])
def test_layouts_are_remembered_up_to_the_piece_bound(
    monkeypatch: pytest.MonkeyPatch, pieces: int, shared: bool
) -> None:
    target = contiguous_split_map((pieces,), [1] * pieces, 0)
    source = replicated_map((pieces,), 1)
    built = _count_builds(monkeypatch)
    plans = plan_transfers({"a": (target, source), "b": (target, source)}, replica_policy=first_holder)
    assert (built == ["a"]) is shared and (plans["a"] is plans["b"]) is shared


def test_twins_split_differently_get_their_own_plans() -> None:
    # Both split their one request in halves; "a" reads the second half from location 1, "b" from 0.
    def policy(requests: Sequence[ReplicaRequest]) -> list[Any]:
        return [[ReplicaPart((0,), (2,), 0), ReplicaPart((2,), (2,), 1 if r.parameter == "a" else 0)]
                for r in requests]

    plans = plan_transfers({"a": _pair(), "b": _pair()}, replica_policy=policy, min_split_bytes=0)
    assert plans["a"].segments == (
        TransferSegment(0, 0, (1,), 0, 0, (1,), (2,)), TransferSegment(1, 2, (1,), 0, 2, (1,), (2,)),
    )
    assert plans["b"].segments == (TransferSegment(0, 0, (1,), 0, 0, (1,), (4,)),)  # the halves coalesce
    assert plans["a"].statistics.split_requests == plans["b"].statistics.split_requests == 1


# ---------------------------------------------------------------------------------------------
# Budget refusals after emitting


def test_segment_and_byte_budgets_are_worded_with_their_blame() -> None:
    target, source = contiguous_split_map((4,), [2, 2], 0), contiguous_split_map((4,), [1, 3], 0)
    with pytest.raises(AffineTransferError) as info:
        plan_transfers({"w": (target, source)}, PlanBudget(max_segments=2))
    assert type(info.value) is AffineTransferError
    assert str(info.value) == "parameter 'w': 3 segments exceed max_segments=2; the plan is refused, not truncated"
    size = len(plan_transfer(target, source).encode())
    with pytest.raises(AffineTransferError) as info:
        plan_transfers({"w": (target, source)}, PlanBudget(max_plan_bytes=size - 1))
    assert type(info.value) is AffineTransferError
    assert str(info.value) == (
        f"parameter 'w': the plan encodes to {size} bytes, above max_plan_bytes={size - 1}; the plan is refused, "
        "not truncated"
    )

    def halves(requests: Sequence[ReplicaRequest]) -> list[Any]:
        return [[ReplicaPart((0,), (2,), 0), ReplicaPart((2,), (2,), 1)] for _ in requests]

    size = len(plan_transfers({"w": _pair()}, replica_policy=halves, min_split_bytes=0)["w"].encode())
    with pytest.raises(InvalidReplicaPolicyError) as info:
        plan_transfers({"w": _pair()}, PlanBudget(max_plan_bytes=size - 1), replica_policy=halves, min_split_bytes=0)
    assert str(info.value) == (
        f"parameter 'w': the plan after the policy split 1 request(s) encodes to {size} bytes, above "
        f"max_plan_bytes={size - 1}; the plan is refused, not truncated"
    )


# ---------------------------------------------------------------------------------------------
# A policy's exception


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize(("exc", "text"), [
    (ValueError("boom"), "replica policy raised ValueError: boom"),
    (ValueError(), "replica policy raised ValueError"),
    (_Unprintable(), "replica policy raised _Unprintable"),
])
def test_a_policy_exception_is_reported_by_class_and_text(exc: Exception, text: str) -> None:
    def policy(_requests: Sequence[ReplicaRequest]) -> list[Any]:
        raise exc

    with pytest.raises(PolicyRaisedError) as info:
        plan_transfers({"w": _pair()}, replica_policy=policy)
    assert str(info.value) == text and info.value.__cause__ is exc


def test_map_refusals_name_the_side() -> None:
    scaled = ParamAffineMap((4,), {0: (4,)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0], 2.0)]})
    plain = replicated_map((4,), 1)
    for target, source, side in ((plain, scaled, "source"), (scaled, plain, "target")):
        with pytest.raises(Exception) as info:
            plan_transfers({"w": (target, source)})
        assert str(info.value).startswith(f"parameter 'w', {side} map, location 0, piece 0: scale 2.0 is not 1")
