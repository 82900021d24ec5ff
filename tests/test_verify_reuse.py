"""``verify_plans`` reuses a verdict only for the very objects it judged, never across contents.

Within one batch, a parameter whose target map content, source map content and plan are the
same objects as an earlier parameter's (``MapContent`` is hash-consed, and a planner that
remembers layouts hands every layer one ``TransferPlan``) gets that parameter's verdict under its
own name (``oracle.judge.Same``). The tests hold both halves of that:

- it does hit: ten parameters with their own map objects of one content and one plan are judged
  once (a memo keyed on the map wrappers, or none, judges them ten times);
- it never answers for input it has not judged: one changed segment, a different map, the same
  plan met with other maps, or a plan whose parts could change under it, are each judged, and
  every verdict equals what ``verify_plan`` says of that parameter alone, field for field (a memo
  keyed on the maps alone, on the plan alone, or trusting a plan it has not found immutable fails
  one of them);
- switched off (``limits.fast_paths(False)``) every parameter is judged and the verdicts are the
  same; drawn batches of repeated and corrupted plans agree with the one-parameter answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import refplan.oracle.judge as judge
from refplan.limits import fast_paths
from refplan.maps import ParamAffineMap, block_gather_map, contiguous_split_map, replicate
from refplan.oracle import BatchVerdict, verify_plan, verify_plans
from refplan.plan import TransferPlan, TransferSegment
from refplan.planner import plan_transfer
from refplan.strategies import CORRUPTION_KINDS, corrupted_plans, map_pairs

SOURCE = replicate(contiguous_split_map((16, 8), [8, 8], 0), 2)
TARGET = contiguous_split_map((16, 8), [2, 2, 2, 2], 1)
PLAN = plan_transfer(TARGET, SOURCE)
NAMES = [f"layers.{i}.w" for i in range(10)]  # sorted order is this order
FIFTH = NAMES[4]


def own_copy(m: ParamAffineMap) -> ParamAffineMap:
    """A map object of its own with ``m``'s content (what a builder called per layer gives)."""
    copy = ParamAffineMap(m.logical_shape, dict(m.shard_shapes), {r: list(p) for r, p in m.pieces_by_rank.items()})
    assert copy is not m and copy.content is m.content  # the premise: one content, two maps
    return copy


def repeated(n: int = len(NAMES)) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
    return {name: (own_copy(TARGET), own_copy(SOURCE)) for name in NAMES[:n]}


@pytest.fixture
def judgements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The parameters ``verify_plans`` judges, in order: by its quick judgement (``_quick``, which
    gives a verdict or hands the parameter on) or by ``_verify_plan``."""
    seen: list[str] = []
    real, quick = judge._verify_plan, judge._quick

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["parameter"])
        return real(*args, **kwargs)

    def counted_quick(*args: Any) -> Any:
        verdict = quick(*args)
        if verdict is not None:
            seen.append(args[3])
        return verdict

    monkeypatch.setattr(judge, "_verify_plan", counted)
    monkeypatch.setattr(judge, "_quick", counted_quick)
    return seen


def alone(pairs: Mapping[str, tuple[Any, Any]], plans: Mapping[str, Any]) -> dict[str, Any]:
    """Each parameter's verdict from ``verify_plan`` on its own: no batch, no reuse."""
    return {name: verify_plan(*pairs[name], plans[name], parameter=name) for name in sorted(pairs)}


def assert_alone(result: BatchVerdict, pairs: Mapping[str, tuple[Any, Any]], plans: Mapping[str, Any]) -> None:
    expected = alone(pairs, plans)
    assert result.verdicts == expected
    assert list(result.verdicts) == list(expected)
    assert all(v.parameter == name for name, v in result.verdicts.items())


def shifted(plan: TransferPlan, index: int, field: str, by: int) -> TransferPlan:
    segments = list(plan.segments)
    segments[index] = dataclasses.replace(segments[index], **{field: getattr(segments[index], field) + by})
    return dataclasses.replace(plan, segments=tuple(segments))


# -- it hits ----------------------------------------------------------------------------------------


def test_repeated_layouts_are_judged_once(judgements: list[str], oracle_work: dict[str, int]) -> None:
    """Ten parameters, each with map objects of its own but one content, and one plan object:
    one judgement, two map validations, ten verdicts each under its own name."""
    pairs = repeated()
    plans = dict.fromkeys(NAMES, PLAN)
    result = verify_plans(pairs, plans)
    assert result.ok and list(result.verdicts) == NAMES
    assert judgements == [NAMES[0]]
    assert oracle_work == {"validate_map": 2, "check_plan": 1}
    assert_alone(result, pairs, plans)


def test_distinct_plans_read_each_shared_content_once_and_keep_no_other(
    monkeypatch: pytest.MonkeyPatch, oracle_work: dict[str, int]
) -> None:
    """Plans that are all distinct objects (no verdict is reused): a map content that several
    parameters hold is read once and its reading kept; one held by a single map is read once and
    not kept (``judge._shared_contents``, ``_reading``)."""
    kept: list[dict[Any, Any]] = []
    real = judge._shared_contents

    def spy(pairs: Any) -> Any:
        got = real(pairs)
        kept.append(got)
        return got

    monkeypatch.setattr(judge, "_shared_contents", spy)
    lone = contiguous_split_map((16, 8), [2, 2, 4], 1)  # held by one map of the batch only
    pairs = repeated()
    pairs["z.lone"] = (lone, own_copy(SOURCE))
    # Distinct plan objects around distinct segment tuples (around one tuple they would be twins:
    # ``Twins``, tested below).
    plans = {name: dataclasses.replace(PLAN, segments=tuple(list(PLAN.segments))) for name in NAMES}
    plans["z.lone"] = plan_transfer(lone, SOURCE)
    assert len({id(p) for p in plans.values()}) == len({id(p.segments) for p in plans.values()}) == len(plans)
    result = verify_plans(pairs, plans)
    assert result.ok
    assert oracle_work == {"validate_map": 3, "check_plan": len(plans)}
    assert len(kept) == 1 and set(kept[0]) == {TARGET.content, SOURCE.content}
    assert judge._UNREAD not in kept[0].values() and judge._DECLINED not in kept[0].values()
    assert_alone(result, pairs, plans)


def test_reuse_switched_off_judges_every_parameter_alike(judgements: list[str]) -> None:
    pairs = repeated()
    plans: dict[str, Any] = dict.fromkeys(NAMES, PLAN)
    plans[FIFTH] = shifted(PLAN, 1, "target_offset", 1)
    on = verify_plans(pairs, plans)
    assert judgements == [NAMES[0], FIFTH]
    with fast_paths(False):
        off = verify_plans(pairs, plans)
    assert judgements[2:] == NAMES
    assert on == off
    assert [v.status for v in on.verdicts.values()] == ["ok"] * 4 + ["invalid"] + ["ok"] * 5


# -- it never answers for what it has not judged ----------------------------------------------------


@pytest.mark.parametrize(("field", "by"), [("target_offset", 1), ("source_offset", 8), ("source_rank", 1)])
def test_one_changed_segment_in_a_repeated_layout_is_caught(judgements: list[str], field: str, by: int) -> None:
    """The fifth of ten same-layout parameters has one segment changed (its own plan object): it
    is judged, found invalid with the counterexample ``verify_plan`` gives it, and the sixth to
    tenth still get the first plan's verdict."""
    pairs = repeated()
    plans: dict[str, Any] = dict.fromkeys(NAMES, PLAN)
    plans[FIFTH] = shifted(PLAN, 3, field, by)
    result = verify_plans(pairs, plans)
    assert result.status == "invalid"
    assert [v.status for v in result.verdicts.values()] == ["ok"] * 4 + ["invalid"] + ["ok"] * 5
    assert judgements == [NAMES[0], FIFTH]
    assert_alone(result, pairs, plans)


def test_an_equal_plan_object_with_one_segment_forced_is_judged_on_its_content(judgements: list[str]) -> None:
    """Two plan objects that were equal, one then changed in place past the frozen dataclass
    before the call: each is judged on what it holds at the call."""
    twin = TransferPlan(tuple(dataclasses.replace(s) for s in PLAN.segments), PLAN.logical_shape, PLAN.moved_elements)
    object.__setattr__(twin.segments[2], "target_offset", twin.segments[2].target_offset + 1)
    pairs = repeated()
    plans: dict[str, Any] = dict.fromkeys(NAMES, PLAN)
    plans[FIFTH] = twin
    result = verify_plans(pairs, plans)
    assert [v.status for v in result.verdicts.values()] == ["ok"] * 4 + ["invalid"] + ["ok"] * 5
    assert judgements == [NAMES[0], FIFTH]
    assert_alone(result, pairs, plans)


@pytest.mark.parametrize("side", ["target", "source"])
def test_a_different_map_in_a_repeated_layout_is_caught(judgements: list[str], side: str) -> None:
    """The fifth parameter's map is another layout of the same shape, given the same plan object:
    the plan is wrong for it, and the parameters after it, back on the shared layout, are ok."""
    other = (
        contiguous_split_map((16, 8), [4, 4], 1) if side == "target"
        else replicate(contiguous_split_map((16, 8), [4, 12], 0), 2)
    )
    pairs = repeated()
    pairs[FIFTH] = (other, SOURCE) if side == "target" else (TARGET, other)
    plans = dict.fromkeys(NAMES, PLAN)
    result = verify_plans(pairs, plans)
    assert [v.status for v in result.verdicts.values()] == ["ok"] * 4 + ["invalid"] + ["ok"] * 5
    assert judgements == [NAMES[0], FIFTH]
    assert_alone(result, pairs, plans)


def test_one_plan_met_with_several_map_pairs_is_judged_once_per_pair(judgements: list[str]) -> None:
    """One plan object given with three map pairs, alternating: one judgement per pair (the
    plan's first pair, then each other one under its own key), each answer the right one."""
    wide = contiguous_split_map((16, 8), [4, 4], 1)
    narrow = replicate(contiguous_split_map((16, 8), [4, 12], 0), 2)
    cycle = [(TARGET, SOURCE), (wide, SOURCE), (TARGET, narrow)]
    pairs = {name: cycle[i % 3] for i, name in enumerate(NAMES)}
    plans = dict.fromkeys(NAMES, PLAN)
    result = verify_plans(pairs, plans)
    assert [v.status for v in result.verdicts.values()] == ["ok", "invalid", "invalid"] * 3 + ["ok"]
    assert judgements == NAMES[:3]
    assert_alone(result, pairs, plans)


@pytest.mark.parametrize("listed", ["segments", "strides"])
def test_a_plan_with_mutable_parts_is_judged_each_time(
    judgements: list[str], listed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan holding a list (its segment tuple as a list, or one segment's source strides,
    forced past the frozen dataclasses) is never answered from memory: when the list changes
    mid-batch (here just before the fifth parameter is judged, as another thread could), the
    parameters from then on are found invalid."""
    first = dataclasses.replace(PLAN.segments[0])
    strides = list(first.source_strides)
    object.__setattr__(first, "source_strides", strides)
    plan = TransferPlan((first, *PLAN.segments[1:]), PLAN.logical_shape, PLAN.moved_elements)
    if listed == "segments":
        object.__setattr__(plan, "segments", list(plan.segments))
    counted, counted_quick = judge._verify_plan, judge._quick

    def changing(*args: Any, **kwargs: Any) -> Any:
        if kwargs["parameter"] == FIFTH:
            strides[1] = 2  # segment 0 now reads every other column of its source rows
        return counted(*args, **kwargs)

    def changing_quick(*args: Any) -> Any:
        if args[3] == FIFTH:
            strides[1] = 2
        return counted_quick(*args)

    monkeypatch.setattr(judge, "_verify_plan", changing)
    monkeypatch.setattr(judge, "_quick", changing_quick)
    pairs = repeated()
    result = verify_plans(pairs, dict.fromkeys(NAMES, plan))
    assert [v.status for v in result.verdicts.values()] == ["ok"] * 4 + ["invalid"] * 6
    assert judgements == NAMES
    assert result.verdicts[FIFTH] == verify_plan(TARGET, SOURCE, plan, parameter=FIFTH)


def test_maps_given_as_dicts_and_plans_as_segment_lists_are_judged_alike(judgements: list[str]) -> None:
    """Other input forms are not remembered by identity (``_judge`` compares their content)."""
    pairs: dict[str, Any] = {name: (TARGET.to_dict(), SOURCE.to_dict()) for name in NAMES}
    plans: dict[str, Any] = {name: list(PLAN.segments) for name in NAMES}
    plans[FIFTH] = list(shifted(PLAN, 0, "target_offset", 1).segments)
    result = verify_plans(pairs, plans)
    assert [v.status for v in result.verdicts.values()] == ["ok"] * 4 + ["invalid"] + ["ok"] * 5
    assert judgements == NAMES
    assert_alone(result, pairs, plans)


def test_names_only_one_side_gives_are_still_answered() -> None:
    pairs = repeated(3)
    plans: dict[str, Any] = {NAMES[0]: PLAN, NAMES[1]: PLAN, "extra": PLAN}
    result = verify_plans(pairs, plans)
    assert list(result.verdicts) == sorted({*pairs, *plans})
    assert result.verdicts[NAMES[0]].ok and result.verdicts[NAMES[1]].ok
    assert result.verdicts[NAMES[2]].reason == "the maps describe this parameter but no plan does"
    assert result.verdicts["extra"].reason == "a plan for a parameter the maps do not describe"
    assert result.status == "invalid"


@given(map_pairs(max_parts=4), map_pairs(max_parts=4), st.data())
def test_drawn_batches_of_repeated_and_corrupted_plans_agree_with_one_parameter_verdicts(
    one: tuple[ParamAffineMap, ParamAffineMap], two: tuple[ParamAffineMap, ParamAffineMap], data: st.DataObject,
) -> None:
    """Six parameters over two drawn layouts, each given its layout's plan object or a corrupted
    copy, in a drawn order: the batch says of each what ``verify_plan`` says of it alone."""
    good = [plan_transfer(*one), plan_transfer(*two)]
    bad = [
        data.draw(corrupted_plans(plan, pair[1], pair[0], kinds=CORRUPTION_KINDS)).plan
        if any(s.numel for s in plan.segments) else plan
        for plan, pair in zip(good, (one, two))
    ]
    layout = data.draw(st.lists(st.sampled_from([0, 1]), min_size=6, max_size=6), label="layouts")
    broken = data.draw(st.lists(st.booleans(), min_size=6, max_size=6), label="corrupted")
    pairs = {f"p{i}": (one, two)[k] for i, k in enumerate(layout)}
    plans = {f"p{i}": (bad if b else good)[k] for i, (k, b) in enumerate(zip(layout, broken))}
    assert_alone(verify_plans(pairs, plans), pairs, plans)


def test_a_segment_list_verdict_is_reused_only_for_its_own_pair_of_layouts_and_content() -> None:
    """Segment lists are remembered by content (``_judge``'s memo): the same list against another
    source layout, and other lists on the same pair of layouts, are each judged on their own (a
    memo keyed without the source layout, or under one key for every content, answered the second
    parameter with the first one's verdict: "ok" for a plan that reads the wrong source halves)."""
    whole = contiguous_split_map((4,), [4], 0)
    halves_swapped = block_gather_map((4,), {0: [2, 3, 0, 1]}, 1, 0)
    copy = [TransferSegment(0, 0, (1,), 0, 0, (1,), (4,))]
    pairs = {"a": (whole, whole), "b": (whole, halves_swapped)}
    result = verify_plans(pairs, {"a": copy, "b": copy})
    assert result.verdicts["a"].ok and result.verdicts["b"].status == "invalid", result.verdicts
    assert_alone(result, pairs, {"a": copy, "b": copy})
    halves = [TransferSegment(0, 0, (1,), 0, 0, (1,), (2,)), TransferSegment(0, 2, (1,), 0, 2, (1,), (2,))]
    twice = [TransferSegment(0, 0, (1,), 0, 0, (1,), (2,)), TransferSegment(0, 0, (1,), 0, 2, (1,), (2,))]
    pairs = dict.fromkeys("abc", (whole, whole))
    plans = {"a": copy, "b": halves, "c": twice}
    result = verify_plans(pairs, plans)
    assert [v.status for v in result.verdicts.values()] == ["ok", "ok", "invalid"], result.verdicts
    assert_alone(result, pairs, plans)


# -- plans of their own around one segments tuple (``oracle.judge.Twins``) ----------------------------

LONG_TARGET = contiguous_split_map((96, 8), [1] * 96, 0)
LONG_SOURCE = replicate(contiguous_split_map((96, 8), [48, 48], 0), 2)
LONG_PLAN = plan_transfer(LONG_TARGET, LONG_SOURCE)  # 96 segments: past REMEMBER_SEGMENTS, no content key


def twins_of(plan: TransferPlan, n: int = len(NAMES)) -> dict[str, TransferPlan]:
    """A plan object per parameter around ``plan``'s one segments tuple (what a planner that
    remembers layouts hands a model's layers)."""
    out = {name: TransferPlan(plan.segments, plan.logical_shape, plan.moved_elements) for name in NAMES[:n]}
    assert len({*map(id, out.values())}) == n and len({id(p.segments) for p in out.values()}) == 1
    return out


def long_pairs() -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
    return {name: (own_copy(LONG_TARGET), own_copy(LONG_SOURCE)) for name in NAMES}


def test_plans_of_their_own_around_one_long_segments_tuple_are_judged_once(
    judgements: list[str], oracle_work: dict[str, int]
) -> None:
    """Ten plan objects sharing one tuple of 96 segments (more than a content key is built for):
    judged once, each verdict under its own name and equal to ``verify_plan``'s alone (before,
    each of the ten was judged: 1.8x the planning on the ``rl-broadcast`` bench scenario)."""
    assert len(LONG_PLAN.segments) > 64
    pairs, plans = long_pairs(), twins_of(LONG_PLAN)
    result = verify_plans(pairs, plans)
    assert result.ok and judgements == [NAMES[0]]
    assert oracle_work["check_plan"] == 1
    with fast_paths(False):  # switched off with every other reuse: each judged
        assert verify_plans(pairs, plans) == result
    assert judgements[1:] == NAMES
    assert_alone(result, pairs, plans)


def test_a_twin_with_another_logical_shape_or_other_maps_is_judged(judgements: list[str]) -> None:
    """The very same segments tuple does not make the same plan: the fifth twin's logical shape
    is another (forced past the frozen dataclass), the seventh is met with another source map;
    each is judged and refused as alone, the rest take the first verdict."""
    pairs, plans = long_pairs(), twins_of(LONG_PLAN)
    object.__setattr__(plans[FIFTH], "logical_shape", (8, 96))
    seventh = NAMES[6]
    pairs[seventh] = (LONG_TARGET, replicate(contiguous_split_map((96, 8), [40, 56], 0), 2))
    result = verify_plans(pairs, plans)
    assert [v.status for v in result.verdicts.values()] == ["ok"] * 4 + ["invalid", "ok", "invalid"] + ["ok"] * 3
    assert judgements == [NAMES[0], FIFTH, seventh]
    assert_alone(result, pairs, plans)


def test_twins_around_a_segment_with_mutable_parts_are_judged_each_time(
    judgements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One segment's source strides forced to a list: the first twin is not immutable, so no
    twin takes its verdict; when the list changes before the fifth is judged, the fifth on are
    found invalid."""
    first = dataclasses.replace(LONG_PLAN.segments[0])
    strides = list(first.source_strides)
    object.__setattr__(first, "source_strides", strides)
    plans = twins_of(TransferPlan((first, *LONG_PLAN.segments[1:]), LONG_PLAN.logical_shape,
                                  LONG_PLAN.moved_elements))
    counted = judge._verify_plan

    def changing(*args: Any, **kwargs: Any) -> Any:
        if kwargs["parameter"] == FIFTH:
            strides[1] = 2  # segment 0 now reads every other column of its source row
        return counted(*args, **kwargs)

    monkeypatch.setattr(judge, "_verify_plan", changing)
    pairs = long_pairs()
    result = verify_plans(pairs, plans)
    assert [v.status for v in result.verdicts.values()] == ["ok"] * 4 + ["invalid"] * 6
    assert judgements == NAMES
