"""Every answer form the checker must accept, and every wrong answer it must refuse.

Theorem 3: an answer whose parts use validated holders and tile the request copies identical
data whichever holders are chosen. The accepted answers below are executed and compared with the
target extract; every refused answer must raise ``InvalidReplicaPolicyError`` and return no plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from refplan import (
    AffineTransferError,
    InvalidReplicaPolicyError,
    PlanBudget,
    ReplicaPart,
    ReplicaRequest,
    contiguous_split_map,
    replicate,
)
from refplan.check import DEFAULT_MIN_SPLIT_BYTES, check_answers
from refplan.maps import ParamAffineMap
from refplan.planner import plan_transfer, plan_transfers
from refplan.simulate import simulate_transfer


def _maps() -> tuple[ParamAffineMap, ParamAffineMap]:
    """A (8,6) F, source TP=2 rows × DP=2 (two holders per region), target one location."""
    source = replicate(contiguous_split_map((8, 6), [4, 4], 0), 2)
    target = contiguous_split_map((8, 6), [8], 0)
    return target, source


def _requests() -> list[ReplicaRequest]:
    seen: list[ReplicaRequest] = []

    def record(requests: Sequence[ReplicaRequest]) -> list[Any]:
        seen.extend(requests)
        return [r.candidates[0].source_rank for r in requests]

    target, source = _maps()
    plan_transfer(target, source, replica_policy=record)
    return seen


def _plan_with(answer_for: Callable[[ReplicaRequest], Any], **kwargs: Any) -> Any:
    target, source = _maps()
    plan = plan_transfer(
        target, source, replica_policy=lambda reqs: [answer_for(r) for r in reqs], min_split_bytes=1, **kwargs
    )
    report = simulate_transfer(target, source, plan)
    assert report.exact, report.first_mismatch
    return plan


def test_requests_are_ordered_and_carry_every_holder() -> None:
    reqs = _requests()
    assert [r.logical_origin for r in reqs] == [(0, 0), (4, 0)]
    assert [r.locations for r in reqs] == [(0, 2), (1, 3)]
    assert all(r.shape == (4, 6) for r in reqs)
    assert reqs[1].candidates[0].source_offset == 0  # each holder addresses its own shard
    assert reqs[1].target_offset == 24


def test_whole_region_int_answers() -> None:
    plan = _plan_with(lambda r: max(r.locations))
    assert {s.source_rank for s in plan.segments} == {2, 3}


@pytest.mark.parametrize("axis", [0, 1])
def test_split_along_any_axis(axis: int) -> None:
    def split(r: ReplicaRequest) -> list[ReplicaPart]:
        o = r.logical_origin
        half = r.shape[axis] // 2
        first = list(r.shape)
        first[axis] = half
        second = list(r.shape)
        second[axis] = r.shape[axis] - half
        o2 = list(o)
        o2[axis] += half
        return [ReplicaPart(o, tuple(first), r.locations[0]), ReplicaPart(tuple(o2), tuple(second), r.locations[1])]

    plan = _plan_with(split)
    assert plan.statistics.split_requests == 2
    assert {s.source_rank for s in plan.segments} == {0, 1, 2, 3}


def test_mixed_int_and_split_answers_and_a_four_way_grid() -> None:
    def answer(r: ReplicaRequest) -> Any:
        if r.logical_origin == (0, 0):
            return r.locations[1]
        (a, b) = r.logical_origin
        return [
            ReplicaPart((a + i, b + j), (2, 3), r.locations[(i // 2 + j // 3) % 2]) for i in (0, 2) for j in (0, 3)
        ]

    plan = _plan_with(answer)
    assert plan.statistics.split_requests == 1


def test_single_part_equal_to_the_box_is_a_whole_answer() -> None:
    plan = _plan_with(lambda r: [ReplicaPart(r.logical_origin, r.shape, r.locations[1])])
    assert plan.statistics.split_requests == 0


def test_many_parts_use_the_partitioned_disjointness_check() -> None:
    # 24 one-row-by-one-column parts per request (above the pairwise limit), last two overlapping.
    def answer(r: ReplicaRequest) -> list[ReplicaPart]:
        a, b = r.logical_origin
        return [ReplicaPart((a + i, b + j), (1, 1), r.locations[(i + j) % 2]) for i in range(4) for j in range(6)]

    _plan_with(answer)
    reqs = _requests()
    bad = [ReplicaPart((i, j), (1, 1), 0) for i in range(4) for j in range(6)]
    bad[-1] = ReplicaPart((3, 4), (1, 1), 0)  # duplicate of an earlier part, (3,5) left uncovered
    with pytest.raises(InvalidReplicaPolicyError):
        check_answers(reqs, [bad, 1], min_split_bytes=1)


def _refuse(answers: Any, match: str, **kwargs: Any) -> None:
    reqs = _requests()
    with pytest.raises(InvalidReplicaPolicyError, match=match):
        check_answers(reqs, answers, **{"min_split_bytes": 1, **kwargs})
    target, source = _maps()
    options = {"min_split_bytes": 1, **kwargs}
    limits = options.pop("budget", None)
    options.pop("element_size", None)
    with pytest.raises(InvalidReplicaPolicyError, match=match):
        plan_transfer(target, source, limits, replica_policy=lambda _r: answers, **options)


def test_wrong_location_is_refused() -> None:
    _refuse([7, 1], "not one of its validated holders")


def test_location_of_another_request_is_refused() -> None:
    _refuse([1, 1], "not one of its validated holders")  # location 1 holds rows 4-7 only


@pytest.mark.parametrize("bad", [True, 1.0, None, "0", 2**0 * 1.0])
def test_non_int_answers_are_refused(bad: Any) -> None:
    _refuse([bad, 1], "answer 0")


def test_bool_location_inside_a_part_is_refused() -> None:
    _refuse([[ReplicaPart((0, 0), (4, 6), True)], 1], "not an int location")  # type: ignore[arg-type]


def test_gap_is_refused() -> None:
    _refuse([[ReplicaPart((0, 0), (2, 6), 0), ReplicaPart((2, 0), (1, 6), 2)], 1], "gap or overlap")


def test_overlap_with_equal_total_volume_is_refused() -> None:
    parts = [ReplicaPart((0, 0), (3, 6), 0), ReplicaPart((2, 0), (1, 6), 2)]  # rows 0-2 + row 2: 24 = 4*6
    _refuse([parts, 1], "overlap")


def test_part_outside_the_box_is_refused() -> None:
    parts = [ReplicaPart((0, 0), (2, 6), 0), ReplicaPart((2, 0), (2, 7), 2)]
    _refuse([parts, 1], "outside the request's box")


def test_part_touching_the_box_from_outside_is_refused() -> None:
    parts = [ReplicaPart((0, 0), (4, 5), 0), ReplicaPart((0, 6), (4, 1), 2)]
    _refuse([parts, 1], "outside the request's box")


def test_zero_extent_part_is_refused() -> None:
    parts = [ReplicaPart((0, 0), (4, 6), 0), ReplicaPart((0, 0), (0, 6), 2)]
    _refuse([parts, 1], "zero or negative extent")


def test_wrong_number_of_axes_is_refused() -> None:
    _refuse([[ReplicaPart((0,), (24,), 0)], 1], "axes")


def test_empty_split_is_refused() -> None:
    _refuse([[], 1], "empty split")


def test_too_few_and_too_many_answers_are_refused() -> None:
    _refuse([0], "1 answers for 2 requests")
    _refuse([0, 1, 1], "3 answers for 2 requests")
    _refuse(None, "expected a sequence")


def test_split_below_min_split_bytes_is_refused_and_default_is_8_mib() -> None:
    assert DEFAULT_MIN_SPLIT_BYTES == 8 * 2**20
    parts = [ReplicaPart((0, 0), (2, 6), 0), ReplicaPart((2, 0), (2, 6), 2)]
    _refuse([parts, 1], "min_split_bytes=13", min_split_bytes=13)  # 12 elements per part
    # With bytes: 12 elements × 4 bytes = 48 bytes per part passes a 48-byte floor, fails at 49.
    reqs = _requests()
    check_answers(reqs, [parts, 1], element_size={"param": 4}, min_split_bytes=48)
    with pytest.raises(InvalidReplicaPolicyError, match="48 bytes, below min_split_bytes=49"):
        check_answers(reqs, [parts, 1], element_size={"param": 4}, min_split_bytes=49)
    target, source = _maps()
    with pytest.raises(InvalidReplicaPolicyError, match="min_split_bytes=8388608"):
        plan_transfer(target, source, replica_policy=lambda _r: [parts, 1])


def test_split_budgets_refuse() -> None:
    parts = [ReplicaPart((0, 0), (2, 6), 0), ReplicaPart((2, 0), (2, 6), 2)]
    _refuse([parts, 1], "max_parts_per_request=1", budget=PlanBudget(max_parts_per_request=1))
    reqs = _requests()
    with pytest.raises(InvalidReplicaPolicyError, match="max_segments=2"):
        check_answers(reqs, [parts, 1], min_split_bytes=1, budget=PlanBudget(max_segments=2))
    target, source = _maps()
    with pytest.raises(AffineTransferError, match="max_plan_bytes"):
        plan_transfer(target, source, PlanBudget(max_plan_bytes=100), replica_policy=lambda _r: [parts, 1],
                      min_split_bytes=1)


def test_policy_exception_becomes_a_policy_error_and_no_plan() -> None:
    def broken(_requests: Sequence[ReplicaRequest]) -> list[Any]:
        raise KeyError("boom")

    target, source = _maps()
    with pytest.raises(InvalidReplicaPolicyError, match="KeyError"):
        plan_transfers({"a": (target, source), "b": (target, source)}, replica_policy=broken)


def test_selector_and_policy_together_are_refused() -> None:
    target, source = _maps()
    with pytest.raises(InvalidReplicaPolicyError, match="not both"):
        plan_transfer(target, source, replica_selector=lambda r: 0, replica_policy=lambda r: [0, 1])


def test_parameter_names_given_beside_the_requests_are_the_ones_used() -> None:
    """The planner checks twins against their layout's one set of requests and passes each
    request's parameter beside it: element sizes, the per-parameter segment count and every
    message go by that name, not by the shared request's."""
    reqs = _requests()  # two requests of parameter "param"
    holder = reqs[1].candidates[0].source_rank
    with pytest.raises(InvalidReplicaPolicyError, match=r"answer 1 \(parameter 'twin'.*not one of its validated"):
        check_answers(reqs, [reqs[0].candidates[0].source_rank, 99], parameters=["param", "twin"])
    half = ReplicaPart(reqs[1].logical_origin, (2, 6), holder)
    rest = ReplicaPart((reqs[1].logical_origin[0] + 2, 0), (2, 6), holder)
    split = [reqs[0].candidates[0].source_rank, [half, rest]]
    # The element size is looked up by the given name (a KeyError for "param" would mean the
    # request's own name was used; every given name needs a size, as in ``plan_transfers``) ...
    sizes = {"x": 1, "twin": 4}
    check_answers(reqs, split, element_size=sizes, min_split_bytes=48, parameters=["x", "twin"])
    with pytest.raises(InvalidReplicaPolicyError, match=r"parameter 'twin'.*below min_split_bytes=49"):
        check_answers(reqs, split, element_size=sizes, min_split_bytes=49, parameters=["x", "twin"])
    with pytest.raises(ValueError, match="parameter 'x': element_size gives no size for it"):
        check_answers(reqs, split, element_size={"twin": 4}, min_split_bytes=48, parameters=["x", "twin"])
    # ... and segments are counted per given name: 1 + 2 parts for one name exceed 2 segments,
    # 1 and 2 for two names do not.
    tight = PlanBudget(max_segments=2)
    with pytest.raises(InvalidReplicaPolicyError, match=r"parameter 'same'.*max_segments=2"):
        check_answers(reqs, split, min_split_bytes=1, budget=tight, parameters=["same", "same"])
    check_answers(reqs, split, min_split_bytes=1, budget=tight, parameters=["a", "b"])
    with pytest.raises(ValueError, match="1 parameter names for 2 requests"):
        check_answers(reqs, split, parameters=["a"])


def test_the_segment_count_includes_int_answers_after_a_split() -> None:
    """Whole (int) answers count one segment each towards ``max_segments`` once their parameter
    has a split: 2 parts + 1 fit 3 exactly, not 2, and the refusal names the int answer that
    crossed the bound, with its index and parameter."""
    reqs = _requests()
    parts = [ReplicaPart((0, 0), (2, 6), 0), ReplicaPart((2, 0), (2, 6), 2)]
    holder = reqs[1].candidates[0].source_rank
    resolved = check_answers(reqs, [parts, holder], min_split_bytes=1, budget=PlanBudget(max_segments=3))
    assert [len(r) for r in resolved] == [2, 1]
    crossed = r"^replica policy answer 1 \(parameter 'param', .*max_segments=2"
    with pytest.raises(InvalidReplicaPolicyError, match=crossed):
        check_answers(reqs, [parts, holder], min_split_bytes=1, budget=PlanBudget(max_segments=2))


def test_a_one_part_answer_is_not_a_split() -> None:
    """A list holding one part for the whole box is the policy naming a holder, not splitting:
    too many segments is then the layout's budget problem (refused later as a plain
    ``AffineTransferError``), not the policy's."""
    reqs = _requests()
    whole = [[ReplicaPart(r.logical_origin, r.shape, r.candidates[0].source_rank)] for r in reqs]
    resolved = check_answers(reqs, whole, budget=PlanBudget(max_segments=1))
    assert [len(r) for r in resolved] == [1, 1]


@pytest.mark.parametrize("shared", [True, False])
def test_a_wrong_twin_answer_is_refused_with_or_without_shared_request_objects(shared: bool) -> None:
    """The checker remembers accepted int answers per request object only when objects repeat;
    either way the second (wrong) answer to the same content is checked and refused."""
    import dataclasses

    request = _requests()[0]
    twin = request if shared else dataclasses.replace(request)
    good = request.candidates[0].source_rank
    resolved = check_answers([request, twin], [good, good])
    assert [[(box, cand) for box, cand in one] for one in resolved] == [[(request.box, request.candidates[0])]] * 2
    with pytest.raises(InvalidReplicaPolicyError, match=r"answer 1 .*not one of its validated holders"):
        check_answers([request, twin], [good, 99])


def test_each_part_is_read_with_the_layout_of_the_holder_it_names() -> None:
    """Theorem 3's premise "A: layout of the chosen candidate", on the real checker: a part served
    by the second holder resolves to that holder's offset and strides, never the first's (no
    proof or contract drew two holders at distinct layouts until an outside audit, 2026-12-06)."""
    from refplan.box import row_major_strides
    from refplan.requests import ReplicaCandidate, ReplicaRequest

    strides = row_major_strides((4, 6))
    first, second = ReplicaCandidate(3, 0, strides), ReplicaCandidate(5, 17, (12, 2))
    request = ReplicaRequest("w", 0, None, (0, 0), (4, 6), 0, strides, (first, second), (None, None), None)
    answer = [ReplicaPart((0, 0), (2, 6), 5), ReplicaPart((2, 0), (2, 6), 3)]
    (resolved,) = check_answers([request], [answer], min_split_bytes=1)
    assert [(box.origin, cand) for box, cand in resolved] == [((0, 0), second), ((2, 0), first)]
    (whole,) = check_answers([request], [5], min_split_bytes=1)
    assert [cand for _box, cand in whole] == [second]
