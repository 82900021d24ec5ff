"""Exact tests of refplan/plan.py that `make mutation` found missing (docs/mutation.md, "The planner's core").

Coalescing on hand-worked segment sets (a merge that needs a second pass, a merge that would wrap
a source row, segments whose offsets do not decode, the merge-check count and budget, on the
exact loop and on the screened path of >= ``limits.QUIET_SEGMENTS`` segments), the screen
``_quiet_groups`` itself with its exact answer, ``_decodable`` against ``_decode`` and hand values,
and the dict forms' refusals word for word.
"""

from __future__ import annotations

import numpy as np
import pytest

from refplan import limits, plan
from refplan.errors import AffineTransferError, InvalidMapError
from refplan.limits import PlanBudget
from refplan.plan import (
    PlanStatistics,
    TransferPlan,
    TransferSegment,
    _decodable,
    _decode,
    _fold_key,
    _quiet_groups,
    coalesce,
    encode_plan,
)


def seg(s_off: int, t_off: int, shape: tuple[int, ...], s_str: tuple[int, ...], t_str: tuple[int, ...],
        s_rank: int = 0, t_rank: int = 0) -> TransferSegment:
    return TransferSegment(s_rank, s_off, s_str, t_rank, t_off, t_str, shape)


# ---------------------------------------------------------------------------------------------
# Module attributes and the canonical encoding


def test_the_format_names_are_still_importable_from_plan() -> None:
    assert plan.MAPS_FORMAT == "refplan.maps/1"
    assert plan.PLANS_FORMAT == "refplan.plans/1"
    with pytest.raises(AttributeError) as info:
        _ = plan.NO_SUCH_NAME
    assert str(info.value) == "module 'refplan.plan' has no attribute 'NO_SUCH_NAME'"


def test_encode_plan_sorts_keys_and_drops_spaces() -> None:
    assert encode_plan({"segments": [], "logical_shape": [2, 3]}) == b'{"logical_shape":[2,3],"segments":[]}'


# ---------------------------------------------------------------------------------------------
# Dict forms


def test_segment_refusals_name_the_field() -> None:
    with pytest.raises(InvalidMapError) as info:
        TransferSegment.from_dict({"shape": [1], "source": [0, 0, [1]]})
    assert str(info.value) == "$: expected {shape, source, target}"
    with pytest.raises(InvalidMapError, match=r"^\$: expected \{shape, source, target\}$"):
        TransferSegment.from_dict({"source": [0, 0, [1]], "target": [0, 0, [1]]})
    with pytest.raises(InvalidMapError) as info:
        TransferSegment.from_dict({"shape": [1.5], "source": [0, 0, [1]], "target": [0, 0, [1]]}, "s")
    assert str(info.value) == "s.shape: expected a list of integers, got [1.5]"
    with pytest.raises(InvalidMapError) as info:
        TransferSegment.from_dict({"shape": [1], "source": [0, 0, [1]], "target": [0, "x", [1]]}, "s")
    assert str(info.value) == "s.target: expected [rank, offset, [strides...]], got [0, 'x', [1]]"
    with pytest.raises(InvalidMapError) as info:
        TransferSegment.from_dict({"shape": [1], "source": [0, 0], "target": [0, 0, [1]]}, "s")
    assert str(info.value) == "s.source: expected [rank, offset, [strides...]], got [0, 0]"


def test_plan_refusals_name_the_field() -> None:
    with pytest.raises(InvalidMapError) as info:
        TransferPlan.from_dict({"segments": []})
    assert str(info.value) == "$: expected {logical_shape, segments}"
    with pytest.raises(InvalidMapError, match=r"^\$: expected \{logical_shape, segments\}$"):
        TransferPlan.from_dict({"logical_shape": [2]})
    with pytest.raises(InvalidMapError) as info:
        TransferPlan.from_dict({"logical_shape": [2.5], "segments": []}, "p")
    assert str(info.value) == "p.logical_shape: expected a list of integers, got [2.5]"
    with pytest.raises(InvalidMapError) as info:
        TransferPlan.from_dict({"logical_shape": [2], "segments": {}}, "p")
    assert str(info.value) == "p.segments: expected a list, got dict"
    good = {"shape": [1], "source": [0, 0, [1]], "target": [0, 0, [1]]}
    with pytest.raises(InvalidMapError) as info:
        TransferPlan.from_dict({"logical_shape": [2], "segments": [good, {"shape": "1"}]}, "p")
    assert str(info.value) == "p.segments[1]: expected {shape, source, target}"


def test_numbers_past_2_62_are_refused_where_the_plan_enters() -> None:
    cap = 1 << 62
    ok = {"shape": [1, cap], "source": [0, cap, [cap, 1]], "target": [1, -cap, [1, -cap]]}
    assert TransferSegment.from_dict(ok, "s") == TransferSegment(0, cap, (cap, 1), 1, -cap, (1, -cap), (1, cap))
    for field, value, message in [
        ("source", [0, cap + 1, [1, 1]], f"s.source[1]: offset {cap + 1} is above 2**62 in magnitude"),
        ("target", [0, 0, [1, -cap - 1]], f"s.target[2][1]: stride {-cap - 1} is above 2**62 in magnitude"),
        ("shape", [1, cap + 1], f"s.shape[1]: extent {cap + 1} is above 2**62 in magnitude"),
    ]:
        with pytest.raises(InvalidMapError) as info:
            TransferSegment.from_dict({**ok, field: value}, "s")
        assert str(info.value) == message


def test_a_parsed_plan_counts_its_segments_and_elements() -> None:
    doc = {"logical_shape": [4, 2], "segments": [
        {"shape": [2, 2], "source": [0, 0, [2, 1]], "target": [1, 0, [2, 1]]},
        {"shape": [1, 2], "source": [1, 2, [2, 1]], "target": [1, 4, [2, 1]]},
    ]}
    parsed = TransferPlan.from_dict(doc)
    assert parsed.logical_shape == (4, 2)
    assert parsed.moved_elements == 6
    assert parsed.statistics == PlanStatistics(segments=2, segments_before_merge=2)


# ---------------------------------------------------------------------------------------------
# _decode, _fold_key, _decodable


@pytest.mark.parametrize(("offset", "strides", "shape", "want"), [
    (5, (0, 1), (1, 8), (0, 5)),  # a stride-0 axis is coordinate 0
    (3, (1,), (4,), (3,)),
    (4, (1,), (4,), None),  # coordinate 4 is past the shard
    (5, (2,), (4,), None),  # 5 is not a multiple of the stride: something is left over
    (7, (3, 1), (2, 3), None),  # row 2 of a 2-row shard
    (7, (3, 1), (3, 3), (2, 1)),
])
def test_decode(offset: int, strides: tuple[int, ...], shape: tuple[int, ...], want: object) -> None:
    assert _decode(offset, strides, shape) == want


def test_fold_key_drops_the_axis_extent() -> None:
    assert _fold_key(10, 20, [3, 4, 5], 1) == (10, 20, 3, 5)
    assert _fold_key(10, 20, [3, 4, 5], 0) == (10, 20, 4, 5)


def test_decodable_is_decode_row_by_row() -> None:
    rows = [
        (5, (0, 1), (1, 8)), (3, (4, 1), (1, 4)), (4, (4, 1), (1, 4)), (5, (2, 1), (4, 1)), (7, (3, 1), (2, 3)),
        (7, (3, 1), (3, 3)), (0, (0, 0), (1, 1)), (9, (3, 1), (3, 3)), (8, (3, 1), (3, 3)), (2, (1, 1), (3, 1)),
    ]
    want = [_decode(o, s, h) is not None for o, s, h in rows]
    assert want == [True, True, False, False, False, True, True, False, True, True]
    got = _decodable(
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int64),
        np.array([r[2] for r in rows], dtype=np.int64),
    )
    assert got.dtype == bool and got.tolist() == want


# ---------------------------------------------------------------------------------------------
# coalesce (the exact loop)


ROW = {0: (2, 3)}  # a 2x3 shard, strides (3, 1)
WIDE = {0: (1, 6)}  # a 1x6 shard, strides (6, 1)


def test_a_merge_never_wraps_a_source_row() -> None:
    # Adjacent in memory on both sides along axis 1, but the source part crosses from row 0 to row 1.
    a = seg(1, 0, (1, 2), (3, 1), (6, 1))
    b = seg(3, 2, (1, 1), (3, 1), (6, 1))
    out, _checks = coalesce([a, b], ROW, WIDE, PlanBudget())
    assert out == [a, b]
    # The same two in the other direction wrap a target row instead.
    a2 = seg(0, 1, (1, 2), (6, 1), (3, 1))
    b2 = seg(2, 3, (1, 1), (6, 1), (3, 1))
    assert coalesce([a2, b2], WIDE, ROW, PlanBudget())[0] == [a2, b2]


def test_a_merge_that_needs_a_second_pass() -> None:
    # A and B (row 0) join along axis 1 in pass 1; only then does AB meet C (row 1) along axis 0.
    a = seg(0, 0, (1, 1), (2, 1), (2, 1))
    b = seg(1, 1, (1, 1), (2, 1), (2, 1))
    c = seg(2, 2, (1, 2), (2, 1), (2, 1))
    out, _checks = coalesce([c, b, a], {0: (2, 2)}, {0: (2, 2)}, PlanBudget())
    assert out == [seg(0, 0, (2, 2), (2, 1), (2, 1))]
    # With one pass the second merge is not made.
    assert coalesce([c, b, a], {0: (2, 2)}, {0: (2, 2)}, PlanBudget(max_merge_passes=1))[0] == [
        seg(0, 0, (1, 2), (2, 1), (2, 1)), c,
    ]


def test_segments_after_a_merged_one_still_merge() -> None:
    one = [seg(0, 0, (1,), (1,), (1,)), seg(1, 1, (1,), (1,), (1,))]
    two = [seg(5, 5, (1,), (1,), (1,)), seg(6, 6, (1,), (1,), (1,))]
    out, _checks = coalesce(one + two, {0: (8,)}, {0: (8,)}, PlanBudget())
    assert out == [seg(0, 0, (2,), (1,), (1,)), seg(5, 5, (2,), (1,), (1,))]


def test_segments_whose_offsets_do_not_decode_are_left_alone() -> None:
    # The first two lie past the 2-element target shard (they do not decode there); the next two
    # decode on both sides and merge.
    odd = [seg(0, 4, (1,), (1,), (1,)), seg(1, 5, (1,), (1,), (1,))]
    fine = [seg(2, 0, (1,), (1,), (1,), t_rank=1), seg(3, 1, (1,), (1,), (1,), t_rank=1)]
    out, _checks = coalesce(odd + fine, {0: (4,)}, {0: (2,), 1: (2,)}, PlanBudget())
    assert out == [*odd, seg(2, 0, (2,), (1,), (1,), t_rank=1)]
    # In one group: the first segment in target order does not decode in the 4-element source
    # shard; the two after it still merge.
    x, y, z = seg(10, 0, (1,), (1,), (1,)), seg(0, 1, (1,), (1,), (1,)), seg(1, 2, (1,), (1,), (1,))
    assert coalesce([z, y, x], {0: (4,)}, {0: (4,)}, PlanBudget())[0] == [x, seg(0, 1, (2,), (1,), (1,))]
    # Source side: past the 2-element source shard, in a group of its own.
    odd_s = [seg(4, 0, (1,), (1,), (1,)), seg(5, 1, (1,), (1,), (1,)), seg(6, 2, (1,), (1,), (1,))]
    assert coalesce(odd_s, {0: (2,)}, {0: (4,)}, PlanBudget())[0] == odd_s


def test_an_unmerged_segment_is_the_same_object() -> None:
    a = seg(0, 0, (1,), (1,), (1,))
    b = seg(4, 2, (1,), (1,), (1,))
    out, _checks = coalesce([b, a], {0: (8,)}, {0: (8,)}, PlanBudget())
    assert out == [a, b] and out[0] is a and out[1] is b


def test_merge_checks_count_every_lookup() -> None:
    # Two segments with no partner, 2-d: one lookup per segment and axis, one pass.
    a = seg(0, 0, (1, 1), (3, 1), (3, 1))
    b = seg(4, 4, (1, 1), (3, 1), (3, 1))
    assert coalesce([a, b], {0: (3, 3)}, {0: (3, 3)}, PlanBudget()) == ([a, b], 4)
    with pytest.raises(AffineTransferError) as info:
        coalesce([a, b], {0: (3, 3)}, {0: (3, 3)}, PlanBudget(max_merge_checks=3))
    assert str(info.value) == (
        "parameter '': coalescing needs more than max_merge_checks=3 comparisons; the plan is refused, not truncated"
    )


# ---------------------------------------------------------------------------------------------
# The screen of >= QUIET_SEGMENTS segments


N = limits.QUIET_SEGMENTS


def _scattered(count: int, s_rank: int = 0) -> list[TransferSegment]:
    """``count`` one-element segments two apart on both sides: none can merge."""
    return [seg(2 * i, 2 * i, (1,), (1,), (1,), s_rank=s_rank) for i in range(count)]


def test_a_large_set_without_partners_is_screened_and_counted() -> None:
    segments = _scattered(N)
    shards = {0: (2 * N,)}
    out, checks = coalesce(segments[::-1], shards, shards, PlanBudget())
    assert out == segments and checks == N
    assert all(x is y for x, y in zip(out, segments))
    assert coalesce(segments, shards, shards, PlanBudget(max_merge_checks=N))[1] == N
    with pytest.raises(AffineTransferError) as info:
        coalesce(segments, shards, shards, PlanBudget(max_merge_checks=N - 1), "w")
    assert str(info.value) == (
        f"parameter 'w': coalescing needs more than max_merge_checks={N - 1} comparisons; the plan is refused, "
        "not truncated"
    )


def test_a_large_set_with_partners_still_merges() -> None:
    # N segments: pairs (2i, 2i+1) adjacent on both sides, pairs apart from each other by a gap.
    segments = [seg(3 * i + k, 3 * i + k, (1,), (1,), (1,)) for i in range(N // 2) for k in (0, 1)]
    shards = {0: (3 * N,)}
    out, _checks = coalesce(segments, shards, shards, PlanBudget())
    assert out == [seg(3 * i, 3 * i, (2,), (1,), (1,)) for i in range(N // 2)]


def _groups(*members: list[TransferSegment]) -> dict[tuple[object, ...], list[TransferSegment]]:
    out: dict[tuple[object, ...], list[TransferSegment]] = {}
    for group in members:
        s = group[0]
        out[(s.source_rank, s.target_rank, s.source_strides, s.target_strides, len(s.shape))] = group
    return out


# Source shards are 4x5 (strides (5, 1)) at location 0 and 3x4 (strides (4, 1)) at location 1;
# target shards are 4x5 at 0 and 5x4 (strides (4, 1)) at 1. Each group's answer is worked by hand.
S_SHARDS = {0: (4, 5), 1: (3, 4)}
T_SHARDS = {0: (4, 5), 1: (5, 4)}
QUIET = [seg(0, 0, (1, 2), (5, 1), (5, 1)), seg(11, 13, (2, 1), (5, 1), (5, 1))]  # no partner: 2 decode
LOUD_1 = [seg(0, 4, (2, 1), (5, 1), (4, 1), t_rank=1), seg(1, 5, (2, 2), (5, 1), (4, 1), t_rank=1)]  # axis 1
LOUD_0 = [seg(0, 0, (1, 2), (4, 1), (5, 1), s_rank=1), seg(4, 5, (2, 2), (4, 1), (5, 1), s_rank=1)]  # axis 0
QUIET_ODD = [  # the second decodes in neither shard (offset 40 is past both): 1 counted
    seg(1, 1, (1, 1), (4, 1), (4, 1), s_rank=1, t_rank=1), seg(40, 40, (1, 1), (4, 1), (4, 1), s_rank=1, t_rank=1),
    seg(6, 9, (1, 1), (4, 1), (4, 1), s_rank=1, t_rank=1),
]


def test_quiet_groups_answers_exactly_the_groups_without_partners() -> None:
    groups = _groups(QUIET, LOUD_1, LOUD_0, QUIET_ODD)
    assert _quiet_groups(groups, S_SHARDS, T_SHARDS) == {
        (0, 0, (5, 1), (5, 1), 2): 2,
        (1, 1, (4, 1), (4, 1), 2): 2,
    }
    # Each loud group alone is loud; each quiet group alone is quiet.
    assert _quiet_groups(_groups(LOUD_1), S_SHARDS, T_SHARDS) == {}
    assert _quiet_groups(_groups(LOUD_0), S_SHARDS, T_SHARDS) == {}
    assert _quiet_groups(_groups(QUIET), S_SHARDS, T_SHARDS) == {(0, 0, (5, 1), (5, 1), 2): 2}


def test_quiet_groups_counts_only_segments_that_decode_on_both_sides() -> None:
    # Target offset 19 decodes in the 4x5 target shard (3, 4) but the same offset on the source
    # side of the 3x4 shard does not (19 >= 12): not counted. Offset 11 decodes on both.
    # Source offset 12 is row 3 of the 3x4 shard of location 1 (it would decode in location 0's 4x5).
    mixed = [seg(19, 19, (1, 1), (4, 1), (5, 1), s_rank=1), seg(11, 11, (1, 1), (4, 1), (5, 1), s_rank=1),
             seg(12, 0, (1, 1), (4, 1), (5, 1), s_rank=1)]
    assert _quiet_groups(_groups(mixed), S_SHARDS, T_SHARDS) == {(1, 0, (4, 1), (5, 1), 2): 1}
    mixed_t = [seg(0, 19, (1, 1), (5, 1), (4, 1), t_rank=1), seg(2, 30, (1, 1), (5, 1), (4, 1), t_rank=1)]
    assert _quiet_groups(_groups(mixed_t), S_SHARDS, T_SHARDS) == {(0, 1, (5, 1), (4, 1), 2): 1}


def test_quiet_groups_leaves_out_what_it_cannot_screen() -> None:
    flat = [seg(0, 0, (), (), ())]
    assert _quiet_groups(_groups(flat), {0: ()}, {0: ()}) == {}  # 0-d segments
    one_d = [seg(0, 0, (1,), (1,), (1,), s_rank=1)]
    assert _quiet_groups(_groups(QUIET, one_d), {0: (4, 5), 1: (4,)}, T_SHARDS) == {}  # mixed ranks
    assert _quiet_groups({}, S_SHARDS, T_SHARDS) == {}
    huge = [seg(1 << 63, 0, (1, 1), (5, 1), (5, 1))]  # past int64
    assert _quiet_groups(_groups(huge), S_SHARDS, T_SHARDS) == {}


def test_a_quiet_group_where_nothing_decodes_counts_zero() -> None:
    lost = [seg(40, 40, (1, 1), (4, 1), (4, 1), s_rank=1, t_rank=1)]
    assert _quiet_groups(_groups(QUIET, lost), S_SHARDS, T_SHARDS) == {
        (0, 0, (5, 1), (5, 1), 2): 2,
        (1, 1, (4, 1), (4, 1), 2): 0,
    }
