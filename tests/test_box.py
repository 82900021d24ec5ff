"""Box algebra and the k-d overlap/cover queries, held against brute force on small grids."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refplan.box import (
    Box,
    WorkCounter,
    box_arrays,
    covers,
    first_overlap,
    overlapping_pair_array,
    overlapping_pairs,
    row_major_strides,
    separated,
    volume,
)


def points(box: Box) -> set[tuple[int, ...]]:
    return set(itertools.product(*[range(o, o + e) for o, e in zip(box.origin, box.extent)]))


boxes_2d = st.builds(
    Box,
    st.tuples(st.integers(0, 8), st.integers(0, 8)),
    st.tuples(st.integers(0, 4), st.integers(0, 4)),
)


@given(boxes_2d, boxes_2d)
def test_intersect_overlaps_contains_match_points(a: Box, b: Box) -> None:
    common = points(a) & points(b)
    got = a.intersect(b)
    assert (got is None) == (not common)
    if got is not None:
        assert points(got) == common
    assert a.overlaps(b) == bool(common)
    assert a.contains(b) == (points(b) <= points(a))


@given(boxes_2d, boxes_2d)
def test_subtract_is_exact_and_disjoint(a: Box, b: Box) -> None:
    parts = a.subtract(b)
    covered: set[tuple[int, ...]] = set()
    for p in parts:
        pts = points(p)
        assert not (pts & covered), "subtract produced overlapping pieces"
        covered |= pts
    assert covered == points(a) - points(b)
    assert len(parts) <= 4


def test_split_refuses_cut_outside() -> None:
    box = Box((0, 0), (4, 4))
    left, right = box.split(1, 1)
    assert left == Box((0, 0), (4, 1)) and right == Box((0, 1), (4, 3))
    with pytest.raises(ValueError):
        box.split(0, 4)


def test_row_major_strides_and_volume() -> None:
    assert row_major_strides((3, 4, 5)) == (20, 5, 1)
    assert row_major_strides(()) == ()
    assert volume(()) == 1
    assert volume((3, 0)) == 0


@given(st.lists(st.builds(Box, st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 3)),
                          st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 3))), max_size=60),
       st.lists(st.integers(0, 1), min_size=60, max_size=60))
def test_overlapping_pairs_matches_brute_force(boxes: list[Box], groups: list[int]) -> None:
    expected = {
        (i, j) for i, j in itertools.combinations(range(len(boxes)), 2) if boxes[i].overlaps(boxes[j])
    }
    assert overlapping_pairs(boxes) == expected
    g = groups[: len(boxes)]
    assert overlapping_pairs(boxes, groups=g) == {(i, j) for i, j in expected if g[i] != g[j]}
    pairs = overlapping_pair_array(boxes)
    assert pairs.tolist() == [list(p) for p in sorted(expected)]  # sorted (i < j) rows, each pair once


@st.composite
def slab_layouts(draw: st.DrawFn) -> tuple[list[Box], int, int]:
    """(boxes, axis, i): slabs along ``axis`` in a shuffled order, each ending where (or before)
    the next starts, all sharing one cross-section on the other axes, so ``axis`` is the only
    axis that can separate them; box ``i`` is one of two neighbours that touch."""
    ndim = draw(st.integers(1, 3))
    axis = draw(st.integers(0, ndim - 1))
    widths = draw(st.lists(st.integers(1, 4), min_size=2, max_size=8))
    gaps = draw(st.lists(st.integers(0, 2), min_size=len(widths), max_size=len(widths)))
    touching = draw(st.integers(0, len(widths) - 2))
    gaps[touching + 1] = 0  # slabs ``touching`` and ``touching + 1`` share a face
    cross_origin = [draw(st.integers(-3, 3)) for _ in range(ndim)]
    cross_extent = [draw(st.integers(1, 3)) for _ in range(ndim)]
    boxes: list[Box] = []
    at = draw(st.integers(-5, 5))
    for width, gap in zip(widths, gaps):
        at += gap
        origin, extent = list(cross_origin), list(cross_extent)
        origin[axis], extent[axis] = at, width
        boxes.append(Box(tuple(origin), tuple(extent)))
        at += width
    order = draw(st.permutations(range(len(boxes))))
    return [boxes[k] for k in order], axis, order.index(touching)


@given(slab_layouts())
def test_separated_decides_slab_layouts_both_ways(layout: tuple[list[Box], int, int]) -> None:
    """``separated`` is ``True`` on slabs that only touch (an end equal to the next start is
    separation: half-open boxes), and ``False`` once one slab reaches a single coordinate into its
    neighbour. Both directions run on every example, so an off-by-one either way fails here."""
    boxes, axis, i = layout
    lo, ext = box_arrays(boxes)
    assert separated(lo, lo + ext)
    assert not overlapping_pairs(boxes)
    grown = list(boxes)
    origin, extent = list(boxes[i].origin), list(boxes[i].extent)
    extent[axis] += 1
    grown[i] = Box(tuple(origin), tuple(extent))
    lo, ext = box_arrays(grown)
    assert not separated(lo, lo + ext)
    neighbour = next(j for j, b in enumerate(boxes) if b.origin[axis] == boxes[i].origin[axis] + boxes[i].extent[axis])
    assert overlapping_pairs(grown) == {(min(i, neighbour), max(i, neighbour))}


@given(st.lists(st.builds(Box, st.tuples(st.integers(0, 6), st.integers(0, 6)),
                          st.tuples(st.integers(0, 6), st.integers(0, 6))), max_size=40))
def test_covers_matches_brute_force_and_gives_a_real_hole(boxes: list[Box]) -> None:
    cell = Box((0, 0), (6, 6))
    covered = set().union(*(points(b) for b in boxes)) if boxes else set()
    hole = covers(cell, boxes)
    assert (hole is None) == (points(cell) <= covered)
    if hole is not None:
        assert cell.contains(hole) and not (points(hole) & covered)


_SMALL_BOXES = st.lists(st.builds(Box, st.tuples(st.integers(-1, 6), st.integers(-1, 6)),
                                  st.tuples(st.integers(0, 4), st.integers(0, 4))), max_size=6)


@given(st.data())
def test_covers_finds_full_coverage_and_every_single_missing_part(data: st.DataObject) -> None:
    """The direction R26 relies on: a cell tiled (guillotine or pinwheel) and overlaid with drawn
    boxes, some reaching outside it, is covered (``None``); with one tile taken out and no extra box
    reaching into it, ``covers`` gives a hole inside that tile that no box touches. The previous
    property drew random boxes only, which almost never cover a whole cell."""
    from refplan.strategies import box_partitions

    cell = Box((0, 0), (6, 6))
    tiles = data.draw(box_partitions(cell, max_parts=8))
    extras = data.draw(_SMALL_BOXES)
    order = data.draw(st.permutations(range(len(tiles) + len(extras))))
    everything = [*tiles, *extras]
    assert covers(cell, [everything[k] for k in order]) is None
    gone = data.draw(st.integers(0, len(tiles) - 1))
    rest = [b for k, b in enumerate(everything) if k != gone]
    missing = points(tiles[gone]) - set().union(*(points(b) for b in rest))
    hole = covers(cell, rest)
    assert (hole is None) == (not missing)
    if hole is not None:
        assert cell.contains(hole) and points(hole) <= missing


def test_pinwheel_non_guillotine_tiling_is_disjoint_and_covers() -> None:
    # Five boxes tiling a 3x3 square that no single cut separates.
    pinwheel = [Box((0, 0), (2, 1)), Box((0, 1), (1, 2)), Box((1, 1), (1, 1)), Box((2, 0), (1, 2)),
                Box((1, 2), (2, 1))]
    assert overlapping_pairs(pinwheel) == set()
    assert covers(Box((0, 0), (3, 3)), pinwheel) is None
    assert covers(Box((0, 0), (3, 3)), pinwheel[:4]) == Box((1, 2), (1, 1))


def test_work_is_counted_and_budget_refuses() -> None:
    boxes = [Box((i, 0), (1, 4)) for i in range(1000)] + [Box((0, 0), (1000, 1))]

    def refuse(count: int) -> None:
        raise RuntimeError(f"budget {count}")

    with pytest.raises(RuntimeError, match="budget"):
        overlapping_pairs(boxes, WorkCounter(50, refuse))
    counter = WorkCounter()
    assert len(overlapping_pairs(boxes, counter)) == 1000
    assert 0 < counter.count < 1001 * 1000 // 2, "k-d partition must not compare all pairs"


def test_large_slab_sets_need_no_pair_loop() -> None:
    counter = WorkCounter()
    rows = [Box((i, 0), (1, 8)) for i in range(20000)]
    assert overlapping_pairs(rows, counter) == set()
    assert counter.count <= 2 * len(rows)
    assert covers(Box((0, 0), (20000, 8)), rows) is None
    assert covers(Box((0, 0), (20001, 8)), rows) == Box((20000, 0), (1, 8))


def test_box_arrays_refuse_boxes_of_different_dimensions() -> None:
    lo, ext = box_arrays([Box((1, 2), (3, 4)), Box((5, 6), (7, 8))])
    assert lo.tolist() == [[1, 2], [5, 6]] and ext.tolist() == [[3, 4], [7, 8]]
    assert box_arrays([])[0].shape == (0, 0)
    # 1 + 3 + 2 coordinates would fill three rows of two: still refused.
    with pytest.raises(ValueError, match="different dimensions"):
        box_arrays([Box((0,), (1,)), Box((0, 0, 0), (1, 1, 1)), Box((0, 0), (1, 1))])
    with pytest.raises(ValueError, match="different dimensions"):
        box_arrays([Box((0, 0), (1,))])


_SMALL_BOXES = st.lists(
    st.integers(1, 3).flatmap(lambda d: st.tuples(st.tuples(*[st.integers(0, 3)] * d),
                                                   st.tuples(*[st.integers(0, 3)] * d))),
    max_size=8,
).map(lambda raw: [Box(o, e) for o, e in raw] if len({len(o) for o, _ in raw}) <= 1 else [])


@given(_SMALL_BOXES, st.lists(st.integers(0, 7), max_size=6))
def test_overlap_witnesses_hold_the_least_pairs(boxes: list[Box], repeats: list[int]) -> None:
    """``overlap_witnesses`` are overlapping pairs, found whenever any exists, and they hold both
    minima its callers take: the least index pair, and the pair whose intersection starts first
    (ties by indices). Copies of drawn boxes are appended so that repeated boxes are common."""
    from refplan.box import overlap_witnesses

    boxes = boxes + [boxes[r % len(boxes)] for r in repeats] if boxes else boxes
    every = overlapping_pairs(boxes)
    found = set(map(tuple, overlap_witnesses(boxes).tolist()))
    assert found <= every and bool(found) == bool(every)
    if every:
        assert min(found) == min(every)

        def first(pair: tuple[int, int]) -> tuple[tuple[int, ...], int, int]:
            common = boxes[pair[0]].intersect(boxes[pair[1]])
            assert common is not None
            return common.origin, pair[0], pair[1]

        assert min(found, key=first) == min(every, key=first)


def test_copies_of_one_box_reach_the_k_d_walk_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 000 copies of one box are 4.5 million overlapping pairs; the witnesses are the first two
    copies, and the k-d walk sees one box (the verdict that needed one pair spent 22 s on 2 000)."""
    import refplan.box as box_module

    seen: list[int] = []
    real = box_module.overlapping_pair_array

    def spy(boxes: list[Box], *args: object, **kwargs: object) -> object:
        seen.append(len(boxes))
        return real(boxes, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(box_module, "overlapping_pair_array", spy)
    found = box_module.overlap_witnesses([Box((0, 0), (4, 4))] * 3000 + [Box((9, 9), (1, 1))])
    assert found.tolist() == [[0, 1]] and seen == [2], (found, seen)


nonempty_3d = st.builds(
    Box,
    st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6)),
    st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
)


@given(st.lists(nonempty_3d, max_size=60))
def test_first_overlap_is_the_least_overlapping_pair(boxes: list[Box]) -> None:
    """Against every pair compared by hand: the least (a, b) whose boxes share an element, or None.
    Enough boxes reach the k-d walk's leaves (more than ``LEAF``) and its early stop."""
    pairs = [(a, b) for a in range(len(boxes)) for b in range(a + 1, len(boxes)) if boxes[a].overlaps(boxes[b])]
    assert first_overlap(boxes) == (min(pairs) if pairs else None)


def test_first_overlap_of_boxes_sharing_one_point_is_one_leaf_comparison() -> None:
    """Parts that all contain the origin: no cut separates them, and ``covers`` subtracting them
    in one leaf multiplied pieces beyond count (an outside probe: 128 parts of an 8-d box, 276 s).
    The pair is found in the leaf's first block, and the least one after it."""
    staircase = [Box((0,) * 8, tuple(1 + (k + axis) % 7 for axis in range(8))) for k in range(1024)]
    assert first_overlap(staircase) == (0, 1)
    tiles = [Box((r, c), (1, 1)) for r in range(40) for c in range(40)]  # disjoint: the walk alone
    assert first_overlap(tiles) is None
    assert first_overlap([*tiles, Box((39, 39), (1, 1))]) == (1599, 1600)


def test_first_overlap_past_its_work_names_the_pair_it_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a split far beyond the default budget the least pair could cost a comparison of every
    later box per index: past ``_LEAST_PAIR_WORK`` the pair the walk found is named, still a pair
    that overlaps, in order."""
    import refplan.box

    tiles = [Box((r, c), (1, 1)) for r in range(30) for c in range(30)]
    boxes = [*tiles, Box((29, 28), (1, 2))]  # overlaps tiles 898 and 899 only
    assert first_overlap(boxes) == (898, 900)
    monkeypatch.setattr(refplan.box, "_LEAST_PAIR_WORK", 0)  # 898 * 901 comparisons are too many now
    found = first_overlap(boxes)
    assert found in ((898, 900), (899, 900))
