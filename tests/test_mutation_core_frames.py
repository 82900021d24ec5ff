"""Exact tests of refplan/frames.py that `make mutation` found missing (docs/mutation.md, "The planner's core").

Frames built by each of the three paths (the rule path, the per-piece common path and the array
path of >= ``limits.ARRAY_MIN_PIECES`` pieces per location) are compared field by field with
frames worked out by hand (location, piece index, boxes, shard shape, strides, and the address of
a sub-box); the refusals of R1-R7 and of Premise A and the holder rules are checked word for
word; the pair-check budget and its charge are checked against the box module's own counts.
"""

from __future__ import annotations

import pytest

from refplan import frames, limits
from refplan.box import Box, WorkCounter, box_arrays, overlapping_pairs, separated
from refplan.errors import AffineTransferError, InvalidMapError, UnsupportedLayoutError
from refplan.frames import Frame, _check_shape, check_holders, check_shards_tile, check_sizes, normalize
from refplan.limits import PlanBudget
from refplan.maps import AffinePiece, ParamAffineMap, contiguous_split_map

# ---------------------------------------------------------------------------------------------
# Frames, field by field, on every path


def _columns() -> ParamAffineMap:
    """F = (4, 6) split by columns [3, 3]: location 1 holds columns 3..5 as a (4, 3) shard."""
    return contiguous_split_map((4, 6), [3, 3], 1)


def test_common_path_frames_and_addresses() -> None:
    nmap = normalize(_columns(), "target", "w")
    assert nmap.frames == (
        Frame(0, 0, frozenset([0]), Box((0, 0), (4, 3)), Box((0, 0), (4, 3)), (4, 3), (3, 1), 0),
        Frame(1, 0, frozenset([1]), Box((0, 3), (4, 3)), Box((0, 0), (4, 3)), (4, 3), (3, 1), -3),
    )
    right = nmap.frames[1]
    # Element (2, 4) of F is row 2, column 1 of location 1's shard: address 2*3 + 1.
    assert right.address(Box((2, 4), (1, 1))) == 7
    assert right.address(Box((0, 3), (4, 3))) == 0
    assert nmap.piece_count == 2 and nmap.shard_shapes == {0: (4, 3), 1: (4, 3)}


def test_rule_path_frames_and_addresses() -> None:
    # Rows of F = (2, 3): a (1, 3) piece may carry any stride on its size-1 axis, which only the
    # rule path accepts; the pieces are listed in reverse logical order.
    pieces = {0: [AffinePiece((1, 3), 3, (99, 1), 3, (7, 1), [0]), AffinePiece((1, 3), 0, (3, 1), 0, (3, 1), [0])]}
    nmap = normalize(ParamAffineMap((2, 3), {0: (2, 3)}, pieces), "source", "w")
    assert nmap.frames == (
        Frame(0, 1, frozenset([0]), Box((0, 0), (1, 3)), Box((0, 0), (1, 3)), (2, 3), (3, 1), 0),
        Frame(0, 0, frozenset([0]), Box((1, 0), (1, 3)), Box((1, 0), (1, 3)), (2, 3), (3, 1), 0),
    )
    assert nmap.frames[1].address(Box((1, 2), (1, 1))) == 5


def test_frames_are_sorted_by_location_then_box() -> None:
    # Location 0 lists its pieces right to left; the frames come out left to right.
    pieces = {0: [AffinePiece((2,), 2, (1,), 0, (1,), [0]), AffinePiece((2,), 0, (1,), 2, (1,), [0])]}
    nmap = normalize(ParamAffineMap((4,), {0: (4,)}, pieces), "source", "w")
    assert [(f.piece_index, f.box, f.local) for f in nmap.frames] == [
        (1, Box((0,), (2,)), Box((2,), (2,))), (0, Box((2,), (2,)), Box((0,), (2,))),
    ]
    assert [f.shift for f in nmap.frames] == [2, -2]


def _many(counts: dict[int, int], width: dict[int, int]) -> ParamAffineMap:
    """1-d F cut into blocks: location ``loc`` holds ``counts[loc]`` blocks of ``width[loc]``,
    stored in its shard in reverse order; the blocks of lower locations come first in F."""
    shards: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    start = 0
    for loc in sorted(counts):
        n, w = counts[loc], width[loc]
        shards[loc] = (n * w,)
        pieces[loc] = [AffinePiece((w,), start + k * w, (1,), (n - 1 - k) * w, (1,), [loc]) for k in range(n)]
        start += n * w
    return ParamAffineMap((start,), shards, pieces)


def test_array_path_frames_on_several_locations() -> None:
    n = limits.ARRAY_MIN_PIECES
    counts, width = {0: n, 1: n, 2: n}, {0: 1, 1: 2, 2: 3}
    nmap = normalize(_many(counts, width), "source", "w")
    assert len(nmap.frames) == 3 * n and nmap.piece_count == 3 * n
    start = 0
    for loc in (0, 1, 2):
        w = width[loc]
        here = [f for f in nmap.frames if f.location == loc]
        assert here == [
            Frame(loc, k, frozenset([loc]), Box((start + k * w,), (w,)), Box(((n - 1 - k) * w,), (w,)), (n * w,),
                  (1,), (n - 1 - k) * w - (start + k * w))
            for k in range(n)
        ]
        # The address of a block's last element is its last shard address.
        assert [f.address(Box((f.box.origin[0] + w - 1,), (1,))) for f in here] == [
            (n - 1 - k) * w + w - 1 for k in range(n)
        ]
        start += n * w


def test_array_path_counts_each_location_on_its_own() -> None:
    # Location 1's shard is one element short of its blocks: refused for location 1 alone.
    n = limits.ARRAY_MIN_PIECES
    good = _many({0: n, 1: n, 2: n}, {0: 1, 1: 2, 2: 3})
    shards = {**good.shard_shapes, 1: (2 * n + 1,)}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap(good.logical_shape, shards, good.pieces_by_rank), "source", "w")
    assert str(info.value) == (
        f"parameter 'w', source map, location 1: the pieces account for {2 * n} elements but the shard "
        f"({2 * n + 1},) has {2 * n + 1}"
    )


# ---------------------------------------------------------------------------------------------
# Refusals, word for word


def test_check_shape_words_each_problem() -> None:
    with pytest.raises(InvalidMapError) as info:
        _check_shape((2, -1), "shard shape", "here")
    assert str(info.value) == "here: shard shape (2, -1) has a negative extent"
    with pytest.raises(InvalidMapError) as info:
        _check_shape((0, 1 << 62 | 1), "piece shape", lambda: "there")
    assert str(info.value) == f"there: piece shape (0, {1 << 62 | 1}) has an extent above 2**62"
    big = (1 << 31, 1 << 32)
    _check_shape(big, "shard shape", "here")  # each extent is fine; the volume is not asked
    with pytest.raises(InvalidMapError) as info:
        _check_shape(big, "shard shape", lambda: "there", whole=True)
    assert str(info.value) == (
        f"there: shard shape {big} has {1 << 63} elements, above 2**62: its addresses would not fit in int64"
    )
    with pytest.raises(InvalidMapError) as info:
        _check_shape(big, "logical shape", "here", whole=True)
    assert str(info.value).startswith(f"here: logical shape {big} has {1 << 63} elements")
    _check_shape((1 << 31, 1 << 31), "shard shape", "here", whole=True)  # exactly 2**62


def test_a_logical_shape_above_2_62_elements_is_refused() -> None:
    big = (1 << 31, 1 << 32)
    pieces = {0: [AffinePiece((1, 1), 0, (1 << 32, 1), 0, (1, 1), [0])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap(big, {0: (1, 1)}, pieces), "source", "w")
    assert str(info.value) == (
        f"parameter 'w', source map: logical shape {big} has {1 << 63} elements, above 2**62: its addresses "
        "would not fit in int64"
    )


def test_a_shard_above_2_62_elements_is_refused() -> None:
    big = (1 << 31, 1 << 32)
    pieces = {3: [AffinePiece((1, 1), 0, (1, 1), 0, (1 << 32, 1), [3])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((1, 1), {3: big}, pieces), "target", "w")
    assert str(info.value) == (
        f"parameter 'w', target map, location 3: shard shape {big} has {1 << 63} elements, above 2**62: its "
        "addresses would not fit in int64"
    )


def test_too_many_axes() -> None:
    with pytest.raises(UnsupportedLayoutError) as info:
        normalize(_columns(), "target", "w", PlanBudget(max_ndim=1))
    assert str(info.value) == "parameter 'w', target map: 2 axes exceed max_ndim=1"


def test_a_scaled_piece_is_refused() -> None:
    pieces = {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0], 2.0)]}
    with pytest.raises(UnsupportedLayoutError) as info:
        normalize(ParamAffineMap((2,), {0: (2,)}, pieces), "source", "w")
    assert str(info.value) == (
        "parameter 'w', source map, location 0, piece 0: scale 2.0 is not 1; a scaled piece cannot be copied "
        "as-is (a resumed optimizer would stay in the source coordinate)"
    )


def test_a_piece_of_another_rank_is_refused_with_its_shape() -> None:
    pieces = {0: [AffinePiece((2, 1), 0, (1, 1), 0, (1, 1), [0])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((2,), {0: (2,)}, pieces), "source", "w")
    assert str(info.value) == (
        "parameter 'w', source map, location 0, piece 0: piece shape (2, 1) has a different number of axes than (2,)"
    )


def test_a_one_element_shard_without_a_non_empty_piece() -> None:
    pieces = {0: [AffinePiece((1,), 0, (1,), 0, (1,), [0])], 1: [AffinePiece((0,), 0, (1,), 0, (1,), [1])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((1,), {0: (1,), 1: (1,)}, pieces), "source", "w")
    assert str(info.value) == (
        "parameter 'w', source map, location 1: a nonempty shard (1,) must hold at least one non-empty piece"
    )


def test_an_empty_shard_refuses_a_one_element_piece() -> None:
    pieces = {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])], 1: [AffinePiece((1,), 0, (1,), 0, (1,), [1])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((2,), {0: (2,), 1: (0,)}, pieces), "source", "w")
    assert str(info.value) == (
        "parameter 'w', source map, location 1, piece 0: the empty shard (0,) cannot hold a non-empty piece of "
        "shape (1,)"
    )


def test_an_empty_shard_refuses_a_piece_of_another_rank() -> None:
    pieces = {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])], 1: [AffinePiece((0, 0), 0, (1, 1), 0, (1, 1), [1])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((2,), {0: (2,), 1: (0,)}, pieces), "target", "w")
    assert str(info.value) == (
        "parameter 'w', target map, location 1, piece 0: piece shape (0, 0) has a different number of axes than (2,)"
    )


def test_a_plain_tuple_where_a_piece_belongs_is_named() -> None:
    real = AffinePiece((1,), 0, (1,), 0, (1,), [0])
    other = AffinePiece((1,), 1, (1,), 1, (1,), [0])
    forged = ParamAffineMap((2,), {0: (2,)}, {0: [real, tuple(other)]})  # type: ignore[list-item]
    with pytest.raises(InvalidMapError) as info:
        normalize(forged, "source", "w")
    assert str(info.value) == "parameter 'w', source map, location 0, piece 1: expected an AffinePiece, got tuple"


def test_two_pieces_writing_the_same_shard_addresses() -> None:
    pieces = {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0]), AffinePiece((2,), 2, (1,), 1, (1,), [0])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((4,), {0: (4,)}, pieces), "source", "w")
    assert str(info.value) == (
        "parameter 'w', source map, location 0: pieces 0 and 1 write the same shard addresses (shard box [1:2]); "
        "one would silently overwrite the other"
    )


def test_a_later_box_with_wrong_holders_is_still_found() -> None:
    # Box [0, 2) is fine (one holder, naming itself); box [2, 4) is held by locations 0 and 1 but
    # location 0's piece names only 0.
    pieces = {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0]), AffinePiece((2,), 2, (1,), 2, (1,), [0])],
              1: [AffinePiece((2,), 2, (1,), 0, (1,), [0, 1])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((4,), {0: (4,), 1: (2,)}, pieces), "source", "w")
    assert str(info.value) == (
        "parameter 'w', source map, location 0, piece 1: box [2:4] declares locations [0] but is held by "
        "different locations [0, 1]"
    )


def test_a_declared_holder_that_holds_only_part() -> None:
    # Location 1 holds [0, 2) only, yet location 0's piece [0, 4) names it a holder.
    pieces = {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0, 1])], 1: [AffinePiece((2,), 0, (1,), 0, (1,), [0, 1])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((4,), {0: (4,), 1: (2,)}, pieces), "target", "w")
    assert str(info.value) == (
        "parameter 'w', target map, location 0, piece 0: location 1 is declared a holder but does not hold all "
        "of box [0:4] (2 of 4 elements)"
    )


def test_replicas_of_a_box_share_one_holder_set_so_checking_them_is_linear() -> None:
    """``check_holders`` compares each distinct holder-set object once (``_distinct_sets``); a
    tensor replicated over a mesh of k ranks gives k frames of one box whose sets are one shared
    object, so the check costs k, not k² (before: 29 s for ``from_dtensor`` over 65 536 ranks,
    506 s over 262 144). Checked here by structure, not by time: one object for 4096 replicas."""
    from refplan.frames import _distinct_sets
    from refplan.interop import from_dtensor

    torch_tensor = pytest.importorskip("torch.distributed.tensor")
    nmap = normalize(from_dtensor((8, 8), (4096,), [torch_tensor.Replicate()]), "target", "w")
    frames = [f for f in nmap.frames if f.box == nmap.frames[0].box]
    assert len(frames) == 4096 and len(_distinct_sets(frames)) == 1
    check_holders(nmap, WorkCounter())  # and the holders are right


def test_a_replica_declaring_other_holders_is_found_among_shared_sets() -> None:
    # Three replicas of [0, 4): locations 0 and 2 share one declared set {0, 1, 2}, location 1
    # declares {0, 1} (its own object): the one that differs is named.
    shared = [0, 1, 2]
    pieces = {0: [AffinePiece((4,), 0, (1,), 0, (1,), shared)], 1: [AffinePiece((4,), 0, (1,), 0, (1,), [0, 1])],
              2: [AffinePiece((4,), 0, (1,), 0, (1,), shared)]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((4,), {0: (4,), 1: (4,), 2: (4,)}, pieces), "source", "w")
    assert str(info.value) == (
        "parameter 'w', source map, location 1, piece 0: box [0:4] declares locations [0, 1] but is held by "
        "different locations [0, 1, 2]"
    )


# ---------------------------------------------------------------------------------------------
# The pair-check budget


def _two_by_two() -> ParamAffineMap:
    """Two pieces at one location (rows of a 2x2 F), so validation compares boxes."""
    return ParamAffineMap(
        (2, 2), {0: (2, 2)},
        {0: [AffinePiece((1, 2), 0, (2, 1), 0, (2, 1), [0]), AffinePiece((1, 2), 2, (2, 1), 2, (2, 1), [0])]},
    )


def test_the_budget_refusal_names_the_side_and_the_limit() -> None:
    with pytest.raises(AffineTransferError) as info:
        normalize(_two_by_two(), "target", "w", PlanBudget(max_pair_checks=0))
    assert str(info.value) == (
        "parameter 'w', target map: validation needs more than max_pair_checks=0 box comparisons; the plan is "
        "refused rather than truncated (raise the budget to plan it)"
    )


def test_normalize_charges_what_its_two_checks_charge() -> None:
    work = WorkCounter()
    nmap = normalize(_two_by_two(), "source", "w", work=work)
    tiles, holders = WorkCounter(), WorkCounter()
    check_shards_tile(nmap, tiles)
    check_holders(nmap, holders)
    assert tiles.count > 0 and work.count == tiles.count + holders.count


def test_check_holders_charges_each_frame_once_and_each_overlap_twice() -> None:
    # Location 0 holds [0, 4) whole; location 1 holds it as [0, 2) and [2, 4): two overlaps.
    pieces = {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0, 1])],
              1: [AffinePiece((2,), 0, (1,), 0, (1,), [0, 1]), AffinePiece((2,), 2, (1,), 2, (1,), [0, 1])]}
    nmap = normalize(ParamAffineMap((4,), {0: (4,), 1: (4,)}, pieces), "target", "w")
    pairs = WorkCounter()
    assert len(overlapping_pairs(sorted({f.box for f in nmap.frames}), pairs)) == 2
    work = WorkCounter()
    check_holders(nmap, work)
    assert work.count == pairs.count + 3 + 2 * 2


# ---------------------------------------------------------------------------------------------
# check_sizes: normalize's size rules alone, in the planner's order

BIG = (1 << 31, 1 << 32)  # 2**63 elements


def _sized(logical: tuple[int, ...], shards: dict[int, tuple[int, ...]]) -> ParamAffineMap:
    """A map with these shapes and one piece of one element per shard (only sizes are read)."""
    one = (1,) * len(logical)
    return ParamAffineMap(logical, shards, {loc: [AffinePiece(one, 0, one, 0, one, [loc])] for loc in shards})


def _too_big(where: str, what: str, shape: tuple[int, ...]) -> str:
    return (
        f"{where}: {what} {shape} has {1 << 63} elements, above 2**62: its addresses would not fit in int64"
    )


def test_check_sizes_passes_what_normalize_passes() -> None:
    fine = _sized((4, 4), {0: (4, 4), 1: (2, 4)})
    assert check_sizes({"w": (fine, fine), "v": (fine, fine)}) is None


def test_check_sizes_reports_the_first_refusal_in_planning_order() -> None:
    small = (2, 2)
    source_bad = _sized(small, {0: small, 5: BIG, 2: BIG})  # shards by location: 2 before 5
    target_bad = _sized(small, {0: small, 1: BIG})
    with pytest.raises(InvalidMapError) as info:
        check_sizes({"w": (target_bad, source_bad)})
    assert str(info.value) == _too_big("parameter 'w', source map, location 2", "shard shape", BIG)
    fine = _sized(small, {0: small})
    with pytest.raises(InvalidMapError) as info:
        check_sizes({"w": (target_bad, fine)})
    assert str(info.value) == _too_big("parameter 'w', target map, location 1", "shard shape", BIG)
    with pytest.raises(InvalidMapError) as info:  # parameters by name: "v" before "w"
        check_sizes({"w": (fine, source_bad), "v": (target_bad, fine)})
    assert str(info.value) == _too_big("parameter 'v', target map, location 1", "shard shape", BIG)
    huge = _sized(BIG, {0: (1, 1)})
    with pytest.raises(InvalidMapError) as info:  # the logical shape before any shard
        check_sizes({"w": (huge, _sized(BIG, {0: BIG}))})
    assert str(info.value) == _too_big("parameter 'w', source map", "logical shape", BIG)


def test_check_sizes_leaves_r0_r1_r2_to_the_planner() -> None:
    small = (2, 2)
    bad = _sized(small, {0: small, 1: BIG})
    other = _sized((2, 3), {0: (2, 3)})
    # Maps that are no maps, and maps of different logical shapes, are skipped: the next
    # parameter is still checked.
    with pytest.raises(InvalidMapError, match="parameter 'z', target map, location 1"):
        check_sizes({"a": (bad, other), "b": (bad, bad.to_dict()), "z": (bad, _sized(small, {0: small}))})
    # More axes than max_ndim (8), or a shard of another rank: the planner stops there, so
    # nothing after it is reported.
    nine = (1,) * 9
    assert check_sizes({"a": (_sized(nine, {0: nine}), _sized(nine, {0: nine})), "z": (bad, bad)}) is None
    ragged = ParamAffineMap(small, {0: (2,), 1: BIG}, {})
    assert check_sizes({"a": (bad, ragged), "z": (bad, bad)}) is None
    eight = (1,) * 8
    with pytest.raises(InvalidMapError, match="parameter 'z', source map, location 1"):
        check_sizes({"a": (_sized(eight, {0: eight}), _sized(eight, {0: eight})), "z": (bad, bad)})


# ---------------------------------------------------------------------------------------------
# Empty pieces: skipped when they pass their rules, refused with the rule when they do not


def test_a_piece_extent_above_2_62_is_refused() -> None:
    pieces = {0: [AffinePiece(((1 << 62) + 1,), 0, (1,), 0, (1,), [0])]}
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((4,), {0: (4,)}, pieces), "source", "w")
    assert str(info.value) == (
        f"parameter 'w', source map, location 0, piece 0: piece shape ({(1 << 62) + 1},) has an extent above 2**62"
    )


def _with_empty(empty: AffinePiece) -> ParamAffineMap:
    """F = (4,) held by location 0 as two pieces, with ``empty`` listed between them."""
    pieces = [AffinePiece((2,), 0, (1,), 0, (1,), [0]), empty, AffinePiece((2,), 2, (1,), 2, (1,), [0])]
    return ParamAffineMap((4,), {0: (4,)}, {0: pieces})


def test_empty_pieces_that_pass_their_rules_are_skipped() -> None:
    nmap = normalize(_with_empty(AffinePiece((0,), 99, (7,), 5, (3,), [0])), "source", "w")
    assert [(f.piece_index, f.box) for f in nmap.frames] == [(0, Box((0,), (2,))), (2, Box((2,), (2,)))]
    assert nmap.piece_count == 3


WHERE = "parameter 'w', source map, location 0, piece 1"


@pytest.mark.parametrize(("empty", "cls", "message"), [
    (AffinePiece((0, 1), 0, (1, 1), 0, (1, 1), [0]), InvalidMapError,
     f"{WHERE}: piece shape (0, 1) has a different number of axes than (4,)"),
    (AffinePiece((0,), 0, (1,), 0, (1,), [0], 2.0), UnsupportedLayoutError,
     f"{WHERE}: scale 2.0 is not 1; a scaled piece cannot be copied as-is (a resumed optimizer would stay in the "
     "source coordinate)"),
    (AffinePiece((0, 1), 0, (1,), 0, (1,), [0]), InvalidMapError,
     f"{WHERE}: piece shape (0, 1) has a different number of axes than (4,)"),
    (AffinePiece((0,), 0, (1,), 0, (1,), []), InvalidMapError,
     f"{WHERE}: the piece names no holder (empty locations)"),
    (AffinePiece((0,), 0, (1, 1), 0, (1,), [0]), InvalidMapError,
     f"{WHERE}: stride vector length 2/1 does not match the piece's 1 axes"),
    (AffinePiece((0,), 0, (1,), 0, (1, 1), [0]), InvalidMapError,
     f"{WHERE}: stride vector length 1/2 does not match the piece's 1 axes"),
])
def test_empty_pieces_that_break_a_rule_are_refused_by_it(
    empty: AffinePiece, cls: type[Exception], message: str
) -> None:
    with pytest.raises(cls) as info:
        normalize(_with_empty(empty), "source", "w")
    assert str(info.value) == message


def test_an_empty_piece_with_an_extent_above_2_62_is_refused() -> None:
    big = (1 << 62) + 1
    with pytest.raises(InvalidMapError) as info:
        normalize(ParamAffineMap((4, 1), {0: (4, 1)}, {0: [
            AffinePiece((4, 1), 0, (1, 1), 0, (1, 1), [0]), AffinePiece((0, big), 0, (1, 1), 0, (1, 1), [0]),
        ]}), "source", "w")
    assert str(info.value) == f"{WHERE}: piece shape (0, {big}) has an extent above 2**62"


def test_array_path_frames_keep_their_index_after_an_empty_piece() -> None:
    n = limits.ARRAY_MIN_PIECES
    empty = AffinePiece((0,), 0, (1,), 0, (1,), [0])
    pieces = [empty] + [AffinePiece((1,), k, (1,), k, (1,), [0]) for k in range(n)]
    nmap = normalize(ParamAffineMap((n,), {0: (n,)}, {0: pieces}), "source", "w")
    assert [(f.piece_index, f.box.origin) for f in nmap.frames] == [(k + 1, (k,)) for k in range(n)]


# ---------------------------------------------------------------------------------------------
# The tiling check's charge


def test_tiling_slabs_costs_one_look_per_frame_and_side() -> None:
    nmap = normalize(_two_by_two(), "source", "w")
    work = WorkCounter()
    check_shards_tile(nmap, work)
    assert work.count == 2 + 2


def test_tiling_boxes_no_axis_separates_charges_the_k_d_query() -> None:
    # An L: row 0 whole, then row 1 as two cells; no single axis separates the three.
    pieces = {0: [AffinePiece((1, 2), 0, (2, 1), 0, (2, 1), [0]), AffinePiece((1, 1), 2, (2, 1), 2, (2, 1), [0]),
                  AffinePiece((1, 1), 3, (2, 1), 3, (2, 1), [0])]}
    nmap = normalize(ParamAffineMap((2, 2), {0: (2, 2)}, pieces), "source", "w")
    boxes = [f.local for f in nmap.frames]
    lo, ext = box_arrays(boxes)
    assert not separated(lo, lo + ext)
    query = WorkCounter()
    assert overlapping_pairs(boxes, query) == set()
    work = WorkCounter()
    check_shards_tile(nmap, work)
    # One look per frame for the sort, then the query, on the shard boxes and on the logical
    # boxes (here the same boxes).
    assert query.count > 0 and work.count == 2 * (3 + query.count)


# ---------------------------------------------------------------------------------------------
# Which path plain pieces take (the rule path is for the unusual and the invalid)


def _never(*_args: object) -> None:
    raise AssertionError("a plainly valid piece took a slower path")


def test_plain_pieces_take_the_common_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frames, "_piece_frame", _never)
    # Offsets 0, extents of 1, boxes that end at the end of F and of the shard, on both sides.
    nmap = normalize(contiguous_split_map((4, 6), [1, 5], 1), "source", "w")
    assert [(f.box, f.local) for f in nmap.frames] == [
        (Box((0, 0), (4, 1)), Box((0, 0), (4, 1))), (Box((0, 1), (4, 5)), Box((0, 0), (4, 5))),
    ]
    assert normalize(contiguous_split_map((1,), [1], 0), "source", "w").frames[0].box == Box((0,), (1,))


def test_many_plain_pieces_take_the_array_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frames, "_piece_frame", _never)
    monkeypatch.setattr(frames, "_common_frame", _never)
    n = limits.ARRAY_MIN_PIECES
    nmap = normalize(_many({0: n, 1: n}, {0: 1, 1: 2}), "source", "w")
    assert len(nmap.frames) == 2 * n
    # Block 0 of location 0 is F's element 0, stored last in its shard.
    assert nmap.frames[0] == Frame(0, 0, frozenset([0]), Box((0,), (1,)), Box((n - 1,), (1,)), (n,), (1,), n - 1)
