"""Exact tests of refplan/regions.py that `make mutation` found missing (docs/mutation.md, "The planner's core").

Each pins what the module answers on a small hand-worked layout: the slab join's pairs, its
refusals to decide (``None``) and the work it charges (the array path's charge is the reference),
the budget charge of region grouping and hole search, and the refusal messages of R25 and of
Premise C's per-frame count on both intersection paths.
"""

from __future__ import annotations

import pytest

from refplan import limits
from refplan.box import Box, WorkCounter, overlapping_pair_array, overlapping_pairs
from refplan.errors import InvalidMapError
from refplan.frames import normalize
from refplan.maps import AffinePiece, ParamAffineMap, contiguous_split_map, replicated_map
from refplan.regions import Region, _slab_join, check_target_cover, intersections, source_regions


class Budget(Exception):
    pass


def _refuse(_count: int) -> None:
    raise Budget


def _array_pairs_and_work(a: list[Box], b: list[Box]) -> tuple[list[tuple[int, int]], int]:
    """The array path's (a index, b index) pairs and charge for the same two lists."""
    work = WorkCounter()
    pairs = overlapping_pair_array(a + b, work, groups=[0] * len(a) + [1] * len(b))
    return sorted((int(i), int(j) - len(a)) for i, j in pairs.tolist()), work.count


def b1(lo: int, n: int) -> Box:
    return Box((lo,), (n,))


# ---------------------------------------------------------------------------------------------
# _slab_join


def test_slab_join_declines_when_one_side_has_no_non_empty_box() -> None:
    assert _slab_join([b1(0, 2)], [b1(0, 0)], WorkCounter()) is None
    assert _slab_join([b1(0, 0)], [b1(0, 2)], WorkCounter()) is None


def test_slab_join_orders_each_side_by_origin_not_by_index() -> None:
    # Slabs listed right to left on both sides: sorted by origin they are disjoint, so the join
    # decides; (a, b) pairs come out per a box in origin order.
    a = [b1(4, 4), b1(0, 4)]
    b = [b1(6, 2), b1(2, 4), b1(0, 2)]
    pairs = _slab_join(a, b, WorkCounter())
    assert pairs == [(1, 2), (1, 1), (0, 1), (0, 0)]
    assert sorted(pairs) == _array_pairs_and_work(a, b)[0]


@pytest.mark.parametrize("side", ["a", "b"])
def test_slab_join_declines_when_either_side_overlaps_itself(side: str) -> None:
    # The first two boxes of one side overlap (the third is far away): not slabs on the only axis.
    clash = [b1(0, 2), b1(1, 2), b1(8, 1)]
    slabs = [b1(0, 3), b1(3, 6)]
    a, b = (clash, slabs) if side == "a" else (slabs, clash)
    assert _slab_join(a, b, WorkCounter()) is None


def test_slab_join_tries_the_next_axis() -> None:
    # Columns of a 2x2 F: overlapping on axis 0, slabs on axis 1.
    a = [Box((0, 0), (2, 1)), Box((0, 1), (2, 1))]
    b = [Box((0, 0), (2, 2))]
    assert _slab_join(a, b, WorkCounter()) == [(0, 0), (1, 0)]


def test_slab_join_charges_what_the_array_path_charges() -> None:
    # An a box with no partner, an empty box on each side (they overlap nothing and are not
    # charged), and a box meeting two of b.
    a = [b1(0, 1), b1(1, 0), b1(3, 4), b1(20, 1)]
    b = [b1(0, 2), b1(2, 0), b1(2, 3), b1(5, 5)]
    work = WorkCounter()
    pairs = _slab_join(a, b, work)
    want_pairs, want_work = _array_pairs_and_work(a, b)
    assert pairs is not None and sorted(pairs) == want_pairs == [(0, 0), (2, 2), (2, 3)]
    assert work.count == want_work


# ---------------------------------------------------------------------------------------------
# source_regions and check_target_cover


def _hole_source() -> ParamAffineMap:
    """F = (8,); location 0 holds [2, 5) and location 1 holds [5, 8): [0, 2) is held by nobody."""
    pieces = {0: [AffinePiece((3,), 2, (1,), 0, (1,), [0])], 1: [AffinePiece((3,), 5, (1,), 0, (1,), [1])]}
    return ParamAffineMap((8,), {0: (3,), 1: (3,)}, pieces)


def test_a_source_hole_is_named_by_its_box() -> None:
    source = normalize(_hole_source(), "source", "w")
    with pytest.raises(InvalidMapError) as info:
        source_regions(source, WorkCounter())
    assert str(info.value) == (
        "parameter 'w', source map: source pieces cover only 6 of its 8 elements; box [0:2] is held by no "
        "source location"
    )


def test_grouping_and_hole_search_are_charged_to_the_budget() -> None:
    # Grouping a valid source charges exactly the overlap test of its region boxes ...
    source = normalize(contiguous_split_map((8,), [3, 5], 0), "source", "w")
    work = WorkCounter()
    regions = source_regions(source, work)
    alone = WorkCounter()
    assert overlapping_pairs([r.box for r in regions], alone) == set()
    assert alone.count > 0 and work.count == alone.count
    with pytest.raises(Budget):
        source_regions(source, WorkCounter(alone.count - 1, _refuse))
    # ... and with a hole, the hole search is charged on top: a counter with room for exactly the
    # overlap test refuses during the search.
    holey = normalize(_hole_source(), "source", "w")
    grouping = WorkCounter()
    overlapping_pairs(sorted({f.box for f in holey.frames}), grouping)
    with pytest.raises(Budget):
        source_regions(holey, WorkCounter(grouping.count, _refuse))


def test_target_cover_is_charged_to_the_budget() -> None:
    target = normalize(contiguous_split_map((8,), [4, 4], 0), "target", "w")
    work = WorkCounter()
    check_target_cover(target, work)
    assert work.count > 0
    with pytest.raises(Budget):
        check_target_cover(target, WorkCounter(0, _refuse))


# ---------------------------------------------------------------------------------------------
# intersections: a target frame that the regions do not tile (unreachable through the planner,
# whose regions tile F; the check is Premise C's, so it is tested on regions given directly).


def _partial_regions(target_pieces: int) -> tuple[object, tuple[Region, ...]]:
    n = target_pieces
    target = normalize(contiguous_split_map((n, 4), [1] * n, 0), "target", "w")
    full = normalize(replicated_map((n, 4), 1), "source", "w")
    holder = full.frames[0]
    # Regions tile every row but the last, whose frame (location n-1) gets 2 of its 4 elements.
    regions = tuple(Region(Box((r, 0), (1, 4 if r < n - 1 else 2)), (holder,)) for r in range(n))
    return target, regions


@pytest.mark.parametrize("pieces", [2, limits.ARRAY_MIN_PIECES], ids=["small path", "array path"])
def test_a_frame_the_regions_do_not_tile_is_refused_with_its_count(pieces: int) -> None:
    target, regions = _partial_regions(pieces)
    with pytest.raises(InvalidMapError) as info:
        intersections(target, regions, WorkCounter())  # type: ignore[arg-type]
    last = pieces - 1
    assert str(info.value) == (
        f"parameter 'w', target map, location {last}, piece 0: box [{last}:{pieces}, 0:4] would receive 2 of "
        "its 4 elements"
    )


def test_the_first_short_frame_is_named_on_the_array_path() -> None:
    n = limits.ARRAY_MIN_PIECES
    target = normalize(contiguous_split_map((n, 4), [1] * n, 0), "target", "w")
    holder = normalize(replicated_map((n, 4), 1), "source", "w").frames[0]
    # Rows 1 and 2 get half their elements; row 1's frame (location 1) is the first short one.
    regions = tuple(
        Region(Box((r, 0), (1, 2 if r in (1, 2) else 4)), (holder,)) for r in range(n)
    )
    with pytest.raises(InvalidMapError, match=r"location 1, piece 0: box \[1:2, 0:4\] would receive 2 of its 4"):
        intersections(target, regions, WorkCounter())


def test_array_path_intersections_are_ordered_by_location_then_origin() -> None:
    # 32 target rows held by locations in reverse row order: location order is not row order.
    n = limits.ARRAY_MIN_PIECES
    pieces = {loc: [AffinePiece((1, 4), 4 * (n - 1 - loc), (4, 1), 0, (4, 1), [loc])] for loc in range(n)}
    target = normalize(ParamAffineMap((n, 4), {loc: (1, 4) for loc in range(n)}, pieces), "target", "w")
    source = normalize(contiguous_split_map((n, 4), [n // 2, n // 2], 0), "source", "w")
    regions = source_regions(source, WorkCounter())
    got = intersections(target, regions, WorkCounter())
    assert [(x.target.location, x.box.origin) for x in got] == [(loc, (n - 1 - loc, 0)) for loc in range(n)]
    assert [x.region.holders[0].location for x in got] == [1] * (n // 2) + [0] * (n // 2)


def test_volumes_past_2_53_are_counted_exactly_on_the_array_path() -> None:
    # Target location 0 holds [0, 2**53 + 2), received from three regions of 2**53, 1 and 1
    # elements (a float count would round 2**53 + 1 down, twice); 30 one-element target
    # locations follow, so frames and regions number 35: the array path.
    big = 1 << 53
    n = big + 2 + 30
    tail = {loc: [AffinePiece((1,), big + 1 + loc, (1,), 0, (1,), [loc])] for loc in range(1, 31)}
    target = ParamAffineMap((n,), {0: (big + 2,), **{loc: (1,) for loc in tail}},
                            {0: [AffinePiece((big + 2,), 0, (1,), 0, (1,), [0])], **tail})
    cuts = [(0, big), (big, 1), (big + 1, 1), (big + 2, 30)]
    source = ParamAffineMap((n,), {loc: (size,) for loc, (_, size) in enumerate(cuts)},
                            {loc: [AffinePiece((size,), start, (1,), 0, (1,), [loc])]
                             for loc, (start, size) in enumerate(cuts)})
    t = normalize(target, "target", "w")
    regions = source_regions(normalize(source, "source", "w"), WorkCounter())
    got = intersections(t, regions, WorkCounter())
    assert len(t.frames) + len(regions) >= limits.ARRAY_MIN_PIECES
    assert [(x.target.location, x.box.origin[0], x.box.extent[0]) for x in got[:4]] == [
        (0, 0, big), (0, big, 1), (0, big + 1, 1), (1, big + 2, 1),
    ]
    assert len(got) == 33
