"""The numpy ground truth: markers, extraction, guarded execution, write counts, budgets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from refplan.errors import AffineTransferError, InvalidMapError, UnsupportedLayoutError
from refplan.maps import (
    AffinePiece,
    ParamAffineMap,
    contiguous_split_map,
    replicate,
    replicated_map,
    segmented_map,
)
from refplan.plan import TransferPlan, TransferSegment
from refplan.simulate import (
    DEFAULT_MAX_ELEMENTS,
    extract_shards,
    logical_markers,
    simulate,
    simulate_transfer,
)

SOURCE = contiguous_split_map((8, 8), [4, 4], 0)
TARGET = contiguous_split_map((8, 8), [2, 2, 2, 2], 1)


def hand_segments() -> list[TransferSegment]:
    """The spec's worked example: rows a of the source, column pair b of the target."""
    return [
        TransferSegment(a, 2 * b, (8, 1), b, 8 * a, (2, 1), (4, 2)) for a in range(2) for b in range(4)
    ]


def hand_plan(segments: list[TransferSegment] | None = None, shape: tuple[int, ...] = (8, 8)) -> TransferPlan:
    segs = tuple(hand_segments() if segments is None else segments)
    return TransferPlan(segs, shape, sum(s.numel for s in segs))


# -- markers ----------------------------------------------------------------------------------


def test_markers_are_the_flat_index() -> None:
    m = logical_markers((3, 4))
    assert m.shape == (3, 4) and m.dtype == np.int64
    assert m[2, 1] == 9
    assert np.unique(m).size == 12


def test_markers_refuse_a_dtype_that_would_repeat_values() -> None:
    assert logical_markers((2049,), np.float16)[-1] == 2048  # 2048 is the last exact fp16 integer run
    with pytest.raises(ValueError, match="distinct"):
        logical_markers((2050,), np.float16)
    with pytest.raises(ValueError, match="distinct"):
        logical_markers((200,), np.int8)


def test_markers_respect_the_budget() -> None:
    with pytest.raises(AffineTransferError, match="max_elements=10"):
        logical_markers((4, 4), max_elements=10)
    assert DEFAULT_MAX_ELEMENTS == 1 << 24


# -- extraction ---------------------------------------------------------------------------------


def test_extract_matches_numpy_slicing() -> None:
    full = logical_markers((8, 8))
    shards = extract_shards(TARGET, full)
    assert sorted(shards) == [0, 1, 2, 3]
    for b in range(4):
        assert shards[b].ndim == 1
        np.testing.assert_array_equal(shards[b], full[:, 2 * b:2 * b + 2].reshape(-1))
    rows = extract_shards(SOURCE, full)
    np.testing.assert_array_equal(rows[1], full[4:].reshape(-1))


def test_extract_bigcode_replicated_rows_land_in_every_shard() -> None:
    m = segmented_map((48, 8), [(32, False), (16, True)], 0, 2, [[16, 16]])
    full = logical_markers((48, 8))
    shards = extract_shards(m, full)
    for r in (0, 1):
        np.testing.assert_array_equal(shards[r][:128], full[16 * r:16 * r + 16].reshape(-1))
        np.testing.assert_array_equal(shards[r][128:], full[32:].reshape(-1))


def test_extract_refuses_scale() -> None:
    with pytest.raises(UnsupportedLayoutError, match="scale"):
        extract_shards(replicated_map((4, 4), 2, scale=0.5), logical_markers((4, 4)))


def test_extract_checks_bounds_before_touching_memory() -> None:
    bad = ParamAffineMap((4, 4), {0: (4, 4)}, {0: [AffinePiece((4, 4), 4, (4, 1), 0, (4, 1), [0])]})
    with pytest.raises(InvalidMapError, match="outside"):
        extract_shards(bad, logical_markers((4, 4)))
    bad_dest = ParamAffineMap((4, 4), {0: (2, 4)}, {0: [AffinePiece((4, 4), 0, (4, 1), 0, (4, 1), [0])]})
    with pytest.raises(InvalidMapError, match="outside"):
        extract_shards(bad_dest, logical_markers((4, 4)))


def test_extract_refuses_a_double_write_and_a_hole() -> None:
    # The #8624 counterexample: numels add up, yet two pieces write the same shard addresses.
    double = ParamAffineMap(
        (4,), {0: (4,)},
        {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0]), AffinePiece((2,), 2, (1,), 0, (1,), [0])]},
    )
    with pytest.raises(InvalidMapError, match="written 2 times"):
        extract_shards(double, logical_markers((4,)))
    hole = ParamAffineMap((4,), {0: (4,)}, {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])]})
    with pytest.raises(InvalidMapError, match="written 0 times"):
        extract_shards(hole, logical_markers((4,)))


def test_extract_skips_empty_pieces_with_out_of_range_offsets() -> None:
    m = ParamAffineMap(
        (4,), {0: (4,)},
        {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0]), AffinePiece((0,), 99, (1,), 99, (1,), [0])]},
    )
    np.testing.assert_array_equal(extract_shards(m, logical_markers((4,)))[0], [0, 1, 2, 3])


def test_extract_budget() -> None:
    with pytest.raises(AffineTransferError, match="max_elements"):
        extract_shards(TARGET, logical_markers((8, 8)), max_elements=100)


# -- execution ----------------------------------------------------------------------------------


def _sources() -> dict[int, np.ndarray]:
    return extract_shards(SOURCE, logical_markers((8, 8)))


def test_hand_plan_is_exact() -> None:
    report = simulate_transfer(TARGET, SOURCE, hand_plan())
    assert report.exact and report.first_mismatch is None
    for b in range(4):
        assert np.all(report.result.write_counts[b] == 1)
        np.testing.assert_array_equal(report.result.targets[b], report.expected[b])
    assert report.result.guards_intact and report.result.out_of_bounds == []


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_hand_plan_is_exact_in_other_dtypes(dtype: type) -> None:
    assert simulate_transfer(TARGET, SOURCE, hand_plan(), dtype=dtype).exact


def test_a_dropped_segment_leaves_sentinels_and_zero_counts() -> None:
    segs = hand_segments()[1:]
    result = simulate(hand_plan(segs), _sources(), TARGET.shard_shapes)
    assert result.write_counts[0].tolist()[:8] == [0] * 8
    assert np.all(result.targets[0][:8] == np.iinfo(np.int64).min)
    report = simulate_transfer(TARGET, SOURCE, hand_plan(segs))
    assert not report.exact
    assert report.first_mismatch is not None and "target location 0, offset 0" in report.first_mismatch
    assert "written 0 time(s)" in report.first_mismatch


def test_a_duplicated_segment_counts_two_even_though_values_agree() -> None:
    segs = [*hand_segments(), hand_segments()[2]]
    report = simulate_transfer(TARGET, SOURCE, hand_plan(segs))
    counts = report.result.write_counts[2]
    assert counts.max() == 2 and int((counts == 2).sum()) == 8
    np.testing.assert_array_equal(report.result.targets[2], report.expected[2])
    assert not report.exact and report.first_mismatch is not None and "written 2" in report.first_mismatch


def test_out_of_bounds_segments_are_refused_not_run() -> None:
    segs = hand_segments()
    segs[0] = dataclasses.replace(segs[0], target_offset=10)  # 10 + 3*2 + 1 = 17 >= 16
    result = simulate(hand_plan(segs), _sources(), TARGET.shard_shapes, guard=3)
    assert len(result.out_of_bounds) == 1 and "segment 0" in result.out_of_bounds[0]
    assert result.guards_intact
    assert int(result.write_counts[0].sum()) == 8  # only segment 4 (a=1, b=0) wrote location 0
    src_oob = hand_segments()
    src_oob[3] = dataclasses.replace(src_oob[3], source_offset=40)
    result = simulate(hand_plan(src_oob), _sources(), TARGET.shard_shapes)
    assert result.out_of_bounds and "source location 0" in result.out_of_bounds[0]
    assert not simulate_transfer(TARGET, SOURCE, hand_plan(src_oob)).exact


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"source_rank": 7}, "no shard"),
        ({"target_rank": 9}, "no shard"),
        ({"shape": (4, 0)}, "positive"),
        ({"source_strides": (8,)}, "stride vector length"),
        ({"target_strides": (-2, 1)}, "negative"),
    ],
)
def test_unexecutable_segments_are_refused(change: dict[str, object], fragment: str) -> None:
    segs = hand_segments()
    segs[1] = dataclasses.replace(segs[1], **change)  # type: ignore[arg-type]
    result = simulate(hand_plan(segs), _sources(), TARGET.shard_shapes)
    assert len(result.out_of_bounds) == 1 and fragment in result.out_of_bounds[0]
    assert not simulate_transfer(TARGET, SOURCE, hand_plan(segs)).exact


def test_guards_use_the_given_sentinel_and_are_checked() -> None:
    sources = {r: a.astype(np.float64) for r, a in _sources().items()}
    result = simulate(hand_plan(hand_segments()[:4]), sources, TARGET.shard_shapes, guard=11, sentinel=-5.0)
    assert result.guards_intact
    assert np.all(result.targets[0][8:] == -5.0)  # rows 4-7 of location 0 were never written
    nan_result = simulate(hand_plan(hand_segments()[:4]), sources, TARGET.shard_shapes)
    assert np.isnan(nan_result.targets[0][8:]).all() and nan_result.guards_intact


def test_simulation_budget_counts_buffers_and_segments() -> None:
    with pytest.raises(AffineTransferError, match="max_elements=100"):
        simulate(hand_plan(), _sources(), TARGET.shard_shapes, max_elements=100)
    # 64 source + 64 target elements, 6 guarded buffers of 2*guard, 64 segment elements.
    needed = 64 + 64 + 6 * 2 * 7 + 64
    simulate(hand_plan(), _sources(), TARGET.shard_shapes, max_elements=needed)
    with pytest.raises(AffineTransferError):
        simulate(hand_plan(), _sources(), TARGET.shard_shapes, max_elements=needed - 1)


def test_later_segments_overwrite_earlier_ones_in_plan_order() -> None:
    segs = hand_segments()
    wrong = dataclasses.replace(segs[0], source_offset=0, source_rank=1)  # rows 4-7 into rows 0-3 of t0
    result = simulate(hand_plan([wrong, segs[0]]), _sources(), {0: (8, 2)})
    full = logical_markers((8, 8))
    np.testing.assert_array_equal(result.targets[0][:8], full[:4, 0:2].reshape(-1))
    result = simulate(hand_plan([segs[0], wrong]), _sources(), {0: (8, 2)})
    np.testing.assert_array_equal(result.targets[0][:8], full[4:, 0:2].reshape(-1))


def test_simulate_accepts_dicts_and_segment_lists() -> None:
    assert simulate_transfer(TARGET, SOURCE, hand_plan().to_dict()).exact
    assert simulate_transfer(TARGET, SOURCE, [s.to_dict() for s in hand_segments()]).exact
    assert simulate_transfer(TARGET, SOURCE, hand_segments()).exact


def test_wrong_logical_shape_is_not_exact_and_map_mismatch_is_refused() -> None:
    report = simulate_transfer(TARGET, SOURCE, hand_plan(shape=(8, 9)))
    assert not report.exact and report.first_mismatch is not None and "logical shape" in report.first_mismatch
    with pytest.raises(InvalidMapError, match="no common F"):
        simulate_transfer(TARGET, contiguous_split_map((64,), [64], 0), hand_plan())


def test_replicated_source_any_holder_is_exact_and_wrong_slice_is_not() -> None:
    src = replicate(SOURCE, 2)  # locations 0, 2 hold rows 0-3; 1, 3 hold rows 4-7
    segs = hand_segments()
    from_replicas = [dataclasses.replace(s, source_rank=s.source_rank + 2 * (i % 2)) for i, s in enumerate(segs)]
    assert simulate_transfer(TARGET, src, hand_plan(from_replicas)).exact
    wrong = [*segs]
    wrong[0] = dataclasses.replace(wrong[0], source_rank=3)  # rows 4-7 instead of 0-3
    report = simulate_transfer(TARGET, src, hand_plan(wrong))
    assert not report.exact and report.first_mismatch is not None
    assert "expected logical (0, 0)" in report.first_mismatch and "got logical (4, 0)" in report.first_mismatch


def test_strided_views_that_wrap_rows_are_executed_literally() -> None:
    m = replicated_map((4, 4), 1)
    flat_copy = TransferSegment(0, 0, (1,), 0, 0, (1,), (16,))  # one 1-D run over a 2-D shard
    assert simulate_transfer(m, m, [flat_copy]).exact
    transposed = TransferSegment(0, 0, (4, 1), 0, 0, (1, 4), (4, 4))
    report = simulate_transfer(m, m, [transposed])
    assert not report.exact
    np.testing.assert_array_equal(report.result.targets[0].reshape(4, 4), logical_markers((4, 4)).T)


def test_guards_catch_a_stray_write_if_the_bounds_check_were_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guards are the second line of defence: with the refusal check disabled, a segment that
    runs one element past its shard lands in the guard, and the result says so."""
    import refplan.simulate as sim

    monkeypatch.setattr(sim, "_refusal", lambda *args: None)
    segs = hand_segments()
    segs[3] = dataclasses.replace(segs[3], target_offset=9)  # last element lands at 9+6+1 = 16
    result = simulate(hand_plan(segs), _sources(), TARGET.shard_shapes, guard=2)
    assert not result.guards_intact
    with pytest.raises(AssertionError, match="leave its buffer"):  # without guards: refused, not run
        simulate(hand_plan(segs), _sources(), TARGET.shard_shapes, guard=0)


# ---------------------------------------------------------------------------------------------
# Shapes are checked before the budget is summed or anything is allocated (an outside audit).

_BIG = 10**6
_ONE = ParamAffineMap((4,), {0: (4,)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])]})
# location 0 declares a 1e6-element shard, location 1 a shard whose negative extent cancels it
_CANCELLING = ParamAffineMap(
    (4,), {0: (_BIG,), 1: (-1, _BIG - 8)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])]}
)


def _peak_bytes(fn: object) -> tuple[BaseException | None, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()  # type: ignore[operator]
        caught: BaseException | None = None
    except Exception as exc:
        caught = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return caught, peak


def test_extract_shards_checks_every_shape_before_the_budget() -> None:
    """A negative extent in one location's shape made its volume negative, cancelling a huge shard
    elsewhere in the budget sum: 8 MB were allocated under ``max_elements=1000`` and the error was
    an unrelated "written 0 times". Now the bad location is named before anything is allocated."""
    caught, peak = _peak_bytes(lambda: extract_shards(_CANCELLING, logical_markers((4,)), max_elements=1000))
    assert isinstance(caught, InvalidMapError) and "location 1" in str(caught), caught
    assert peak < 100_000


def test_simulate_transfer_checks_target_shapes_before_allocating() -> None:
    caught, peak = _peak_bytes(lambda: simulate_transfer(_CANCELLING, _ONE, [], max_elements=1000))
    assert isinstance(caught, InvalidMapError) and "location 1" in str(caught), caught
    assert peak < 100_000


def test_simulate_refuses_a_negative_target_extent_before_allocating() -> None:
    """``simulate`` allocated 8 MB, then failed with numpy's bare "negative dimensions"."""
    caught, peak = _peak_bytes(
        lambda: simulate([], {0: np.arange(4)}, {0: (_BIG,), 1: (-_BIG + 8,)}, max_elements=1000)
    )
    assert isinstance(caught, InvalidMapError) and "location 1" in str(caught), caught
    assert peak < 100_000


def test_simulate_refuses_two_negative_extents() -> None:
    """(-2, -3) has volume 6 and was taken as a 6-element target."""
    with pytest.raises(InvalidMapError, match="location 0"):
        simulate([], {0: np.arange(4)}, {0: (-2, -3)})


def test_simulate_still_refuses_an_honest_budget_overrun() -> None:
    with pytest.raises(AffineTransferError, match="max_elements"):
        simulate([], {0: np.arange(4)}, {0: (_BIG,)}, max_elements=1000)


@pytest.mark.parametrize("shape", [(3.7,), (True,), (2, "3")])
def test_simulate_refuses_non_integer_target_extents(shape: tuple[object, ...]) -> None:
    """``int()`` truncated 3.7 to a 3-element target; the integer rule refuses it instead."""
    with pytest.raises(InvalidMapError, match="location 0"):
        simulate([], {0: np.arange(4)}, {0: shape})  # type: ignore[dict-item]


@pytest.mark.parametrize("shape", [(2.9,), (True, 2), (np.float64(2.0),)])
def test_logical_markers_refuses_non_integer_extents(shape: tuple[object, ...]) -> None:
    """``logical_markers((2.9,))`` returned shape (2,): a truncated F."""
    with pytest.raises(TypeError, match="integer"):
        logical_markers(shape)  # type: ignore[arg-type]


def test_logical_markers_takes_numpy_integer_extents() -> None:
    assert logical_markers((np.int64(2), 3)).shape == (2, 3)
