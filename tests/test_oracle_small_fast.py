"""The oracle's small-layout path (``refplan.oracle.small``) answers exactly as the general path.

``small.read_map`` and ``small.judge`` either return what ``validate_map`` and ``check_plan``
return (a layout value for value, the ``ok`` verdict) or ``None``, and then the general path
decides and words the answer. Two kinds of test hold that:

- properties: on drawn map pairs (general ones and plain TP×DP ones), with correct plans and
  plans corrupted by every ``CORRUPTION_KINDS`` (a dropped, duplicated, shifted, re-sourced,
  re-targeted, reshaped or re-strided segment), the verdict with the small path and with only
  the general path (``small._general_only``) are equal field for field; so are batches, the
  swapped-maps note and ``segment_errors``;
- exact cases: the small path does engage on the plain layouts it is for (a regression that
  made it decline everything would pass the properties), and declines each thing it does not
  check itself, one condition at a time, at the exact boundary.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refplan import plan_transfer
from refplan.box import row_major_strides, volume
from refplan.errors import AffineTransferError
from refplan.limits import MAX_COORDINATE
from refplan.maps import AffinePiece, ParamAffineMap, contiguous_split_map, replicate
from refplan.oracle import small, verify_plan, verify_plans
from refplan.oracle.judge import check_plan, segment_errors
from refplan.oracle.layout import Layout, validate_map
from refplan.oracle.verdict import Verdict, ok_verdict
from refplan.plan import TransferPlan, TransferSegment
from refplan.strategies import CORRUPTION_KINDS, corrupted_plans, map_pairs, param_maps

# -- helpers ---------------------------------------------------------------------------------------


def rp(extent: tuple[int, ...], origin: tuple[int, ...], local: tuple[int, ...], logical: tuple[int, ...],
       shard: tuple[int, ...], locations: list[int], **fields: Any) -> AffinePiece:
    """A row-major piece from its logical and local origins (fields override any stored field)."""
    f_str, s_str = row_major_strides(logical), row_major_strides(shard)
    values: dict[str, Any] = {
        "shape": extent,
        "source_offset": sum(o * s for o, s in zip(origin, f_str)),
        "source_strides": f_str,
        "dest_offset": sum(o * s for o, s in zip(local, s_str)),
        "dest_strides": s_str,
        "locations": locations,
    }
    values.update(fields)
    return AffinePiece(**values)


def rows(logical: tuple[int, int], cuts: list[int], holders: int = 1, **fields: Any) -> ParamAffineMap:
    """``logical`` cut into row blocks of ``cuts`` rows, block ``i`` held whole by locations
    ``i, i + n, ...`` (``holders`` copies); ``fields`` override piece 0 of location 0."""
    n = len(cuts)
    shards: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    start = 0
    for i, size in enumerate(cuts):
        shard = (size, logical[1])
        owners = [i + k * n for k in range(holders)]
        for loc in owners:
            extra = fields if loc == 0 else {}
            shards[loc] = shard
            pieces[loc] = [rp(shard, (start, 0), (0, 0), logical, shard, **{"locations": owners, **extra})]
        start += size
    return ParamAffineMap(logical, shards, pieces)


def same_layout(a: Layout, b: Layout) -> bool:
    return (
        (a.side, a.logical_shape) == (b.side, b.logical_shape)
        and list(a.shards.items()) == list(b.shards.items())
        and list(a.held.items()) == list(b.held.items())
    )


def both_ways(target: Any, source: Any, plan: Any) -> tuple[Verdict, Verdict]:
    fast = verify_plan(target, source, plan, parameter="w")
    with small._general_only():
        general = verify_plan(target, source, plan, parameter="w")
    return fast, general


def seg(s_loc: int, s_off: int, s_str: tuple[int, ...], t_loc: int, t_off: int, t_str: tuple[int, ...],
        shape: tuple[int, ...]) -> TransferSegment:
    return TransferSegment(s_loc, s_off, s_str, t_loc, t_off, t_str, shape)


SRC = rows((8, 4), [4, 4], holders=2)  # locations 0, 2 hold rows 0:4; 1, 3 rows 4:8
TGT = rows((8, 4), [2, 2, 2, 2])
GOOD = [seg(0, 0, (4, 1), 0, 0, (4, 1), (2, 4)), seg(2, 8, (4, 1), 1, 0, (4, 1), (2, 4)),
        seg(1, 0, (4, 1), 2, 0, (4, 1), (2, 4)), seg(3, 8, (4, 1), 3, 0, (4, 1), (2, 4))]


def fast(m: ParamAffineMap, side: str) -> Layout | None:
    """``validate_map``'s layout when ``small.read_map`` read the map, else ``None``."""
    layout = validate_map(m, side)
    return layout if layout.plain is not None else None


def general(m: ParamAffineMap, side: str) -> Layout:
    with small._general_only():
        layout = validate_map(m, side)
    assert layout.plain is None
    return layout


def general_layout(m: ParamAffineMap, side: str = "target") -> Layout:
    with small._general_only():
        return validate_map(m, side)


def layouts(target: ParamAffineMap = TGT, source: ParamAffineMap = SRC) -> tuple[Layout, Layout]:
    src, tgt = fast(source, "source"), fast(target, "target")
    assert src is not None and tgt is not None
    assert same_layout(src, general(source, "source")) and same_layout(tgt, general(target, "target"))
    return src, tgt


# -- properties: the two paths give the same verdict ---------------------------------------------------


@st.composite
def plain_pairs(draw: st.DrawFn) -> tuple[ParamAffineMap, ParamAffineMap]:
    """TP×DP layouts as users build them: contiguous splits along one axis, replicated."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))

    def side() -> ParamAffineMap:
        axis = draw(st.integers(0, ndim - 1))
        parts = draw(st.integers(1, shape[axis]))
        cuts = sorted(draw(st.sets(st.integers(1, shape[axis] - 1), max_size=parts - 1))) if shape[axis] > 1 else []
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, shape[axis]])]
        m = contiguous_split_map(shape, sizes, axis)
        copies = draw(st.integers(1, 3))
        return replicate(m, copies) if copies > 1 else m

    return side(), side()


def _judge_drawn(target: ParamAffineMap, source: ParamAffineMap, data: st.DataObject) -> None:
    plan = plan_transfer(target, source)
    fast, general = both_ways(target, source, plan)
    assert fast == general and fast.ok
    assert both_ways(source, target, plan)[0] == both_ways(source, target, plan)[1]  # swapped maps
    if plan.segments and any(s.numel for s in plan.segments):
        bad = data.draw(corrupted_plans(plan, source, target, kinds=CORRUPTION_KINDS), label="corrupted")
        fast, general = both_ways(target, source, bad.plan)
        assert fast == general and not fast.ok, bad.note
        fast, general = both_ways(source, target, bad.plan)
        assert fast == general


@given(plain_pairs(), st.data())
def test_plain_layouts_judged_alike_by_both_paths(
    pair: tuple[ParamAffineMap, ParamAffineMap], data: st.DataObject,
) -> None:
    target, source = pair
    # The builders' maps are what the small path is for: it reads every one of them itself.
    layouts(target, source)
    _judge_drawn(target, source, data)


@given(map_pairs(max_parts=5), st.data())
def test_drawn_layouts_judged_alike_by_both_paths(
    pair: tuple[ParamAffineMap, ParamAffineMap], data: st.DataObject,
) -> None:
    target, source = pair
    for m, side in ((target, "target"), (source, "source")):
        read = fast(m, side)
        assert read is None or same_layout(read, general(m, side))
    _judge_drawn(target, source, data)


@given(param_maps(max_parts=4, unit_strides=False, empty_pieces=False, pinwheels=False, max_holders=2), st.data())
def test_multi_piece_locations_judged_alike_by_both_paths(m: ParamAffineMap, data: st.DataObject) -> None:
    """Locations holding several pieces (``_right``'s cuts), planned onto a plain target."""
    shape = tuple(m.logical_shape)
    target = contiguous_split_map(shape, [shape[0]], 0) if shape and shape[0] else m
    _judge_drawn(target, m, data)
    _judge_drawn(m, target, data)


@given(plain_pairs(), plain_pairs(), st.data())
def test_batches_and_segment_errors_alike_by_both_paths(
    one: tuple[ParamAffineMap, ParamAffineMap], two: tuple[ParamAffineMap, ParamAffineMap], data: st.DataObject,
) -> None:
    pairs = {"a": one, "b": two, "c": one}
    plans: dict[str, Any] = {name: plan_transfer(*pair) for name, pair in pairs.items()}
    if any(s.numel for s in plans["c"].segments):
        plans["c"] = data.draw(corrupted_plans(plans["c"], one[1], one[0])).plan
    fast = verify_plans(pairs, plans)
    with small._general_only():
        general = verify_plans(pairs, plans)
    assert fast == general
    target, source = one
    found = segment_errors(target, source, plans["c"], limit=5, scan=100)
    with small._general_only():
        assert found == segment_errors(target, source, plans["c"], limit=5, scan=100)


# -- exact cases: the small path engages, and declines at each boundary ---------------------------------


def test_the_llama_like_layout_is_read_and_judged_on_the_small_path() -> None:
    shape = (96, 20)
    target = contiguous_split_map(shape, [12] * 8, 0)
    source = replicate(contiguous_split_map(shape, [24] * 4, 0), 4)
    src, tgt = layouts(target, source)
    plan = plan_transfer(target, source)
    verdict = small.judge(plan.segments, src, tgt)
    assert verdict == ok_verdict(len(plan.segments)) == check_plan(plan.segments, src, tgt, 0)
    assert verdict is not None and verdict.checked_segments == 8 and verdict.fallback_elements == 0
    with small._general_only():
        assert small.read_map(target) is None and small.judge(plan.segments, src, tgt) is None
    assert small._enabled


def test_general_only_is_restored_after_an_error() -> None:
    with pytest.raises(RuntimeError), small._general_only():
        assert not small._enabled
        raise RuntimeError
    assert small._enabled


def test_read_map_equals_validate_map_on_plain_maps() -> None:
    cases = [
        (SRC, "source"), (TGT, "target"),
        (contiguous_split_map((3, 4, 5), [2, 3], 2), "target"),  # slabs along the last axis
        (contiguous_split_map((7,), [7], 0), "source"),  # one location holds all of F
        (rows((4, 2), [1, 1, 1, 1], holders=3), "source"),  # size-1 axes in shards
    ]
    for m, side in cases:
        read = fast(m, side)
        assert read is not None and read.plain is not None and same_layout(read, general(m, side))
        assert list(read.plain) == list(read.shards)


def test_several_pieces_in_one_location() -> None:
    """Location 0 holds rows 0:2 and 4:6 of F (stored swapped), location 1 the rest."""
    logical, shard = (8, 3), (4, 3)
    m = ParamAffineMap(logical, {0: shard, 1: shard}, {
        0: [rp((2, 3), (4, 0), (0, 0), logical, shard, [0]), rp((2, 3), (0, 0), (2, 0), logical, shard, [0])],
        1: [rp((2, 3), (2, 0), (0, 0), logical, shard, [1]), rp((2, 3), (6, 0), (2, 0), logical, shard, [1])],
    })
    for side in ("source", "target"):
        read = fast(m, side)
        assert read is not None and same_layout(read, general(m, side))
    src, tgt = layouts(m, m)
    identity = [seg(loc, 0, (3, 1), loc, 0, (3, 1), shard) for loc in (0, 1)]
    assert small.judge(identity, src, tgt) == ok_verdict(2)
    whole = contiguous_split_map(logical, [8], 0)
    w_src, w_tgt = layouts(whole, whole)
    # F's rows 0:8 gathered into location 0 of ``whole``: four segments, one per piece.
    gather = [seg(0, 0, (3, 1), 0, 12, (3, 1), (2, 3)), seg(0, 6, (3, 1), 0, 0, (3, 1), (2, 3)),
              seg(1, 0, (3, 1), 0, 6, (3, 1), (2, 3)), seg(1, 6, (3, 1), 0, 18, (3, 1), (2, 3))]
    m_src, _ = layouts(whole, m)
    assert small.judge(gather, m_src, w_tgt) == ok_verdict(4)
    wrong = [seg(0, 0, (3, 1), 0, 0, (3, 1), (2, 3)), seg(0, 6, (3, 1), 0, 12, (3, 1), (2, 3)), *gather[2:]]
    assert small.judge(wrong, m_src, w_tgt) is None and not verify_plan(whole, m, wrong).ok
    # One segment spanning both pieces of location 0 (rows 0:4 of its shard): F rows 4:6 then 0:2.
    spanning = [seg(0, 0, (3, 1), 0, 0, (3, 1), (4, 3))]
    assert small.judge(spanning, m_src, w_tgt, gaps=False) is None  # rows 0:2 of F need F's 0:2, get 4:6
    twice = ParamAffineMap(logical, {0: (8, 3)}, {0: [
        rp((2, 3), (4, 0), (0, 0), logical, (8, 3), [0]), rp((2, 3), (0, 0), (2, 0), logical, (8, 3), [0]),
        rp((4, 3), (4, 0), (4, 0), logical, (8, 3), [0]),
    ]})
    assert small.read_map(twice) is None  # F rows 4:6 held twice in one location
    assert small.judge(identity, w_src, w_tgt) is None  # location 1 is not in ``whole``


def test_a_segment_across_two_target_pieces_is_cut_exactly() -> None:
    logical = (4, 2)
    two = ParamAffineMap(logical, {0: (4, 2)}, {0: [
        rp((2, 2), (0, 0), (0, 0), logical, (4, 2), [0]), rp((2, 2), (2, 0), (2, 0), logical, (4, 2), [0]),
    ]})
    one = contiguous_split_map(logical, [4], 0)
    src, tgt = layouts(two, one)
    whole = [seg(0, 0, (2, 1), 0, 0, (2, 1), (4, 2))]
    assert small.judge(whole, src, tgt) == ok_verdict(1)
    src2, tgt2 = layouts(one, two)
    assert small.judge(whole, src2, tgt2) == ok_verdict(1)
    swapped = ParamAffineMap(logical, {0: (4, 2)}, {0: [
        rp((2, 2), (2, 0), (0, 0), logical, (4, 2), [0]), rp((2, 2), (0, 0), (2, 0), logical, (4, 2), [0]),
    ]})
    src3, tgt3 = layouts(swapped, two)
    assert small.judge(whole, src3, tgt3) is None  # the halves arrive swapped
    halves = [seg(0, 4, (2, 1), 0, 0, (2, 1), (2, 2)), seg(0, 0, (2, 1), 0, 4, (2, 1), (2, 2))]
    assert small.judge(halves, src3, tgt3) == ok_verdict(2)


# Each change to the first piece of location 0 of ``rows((8, 4), [4, 4], holders)`` that the small
# path must refuse to read itself (the general path then refuses the map), with the holder counts
# for which this change is the map's only fault (so that skipping the check would accept it).
PIECE_CHANGES: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "F strides differ": ({"source_strides": (5, 1)}, (1, 2)),
    "shard strides differ": ({"dest_strides": (5, 1)}, (1, 2)),
    "scale": ({"scale": 2.0}, (1, 2)),
    "local offset is not 0": ({"dest_offset": 4}, (1, 2)),
    "logical offset past F": ({"source_offset": 32}, (1,)),
    "negative logical offset": ({"source_offset": -4}, (1,)),
    "declares a location that does not hold it": ({"locations": [0, 1]}, (1,)),
    "declares another location only": ({"locations": [1]}, (1,)),
    "declares one more replica": ({"locations": [0, 2, 1]}, (2,)),
    "declares too few": ({"locations": [0]}, (2,)),
}
CASES = [(name, holders) for name, (_, counts) in PIECE_CHANGES.items() for holders in counts]


@pytest.mark.parametrize(("change", "holders"), CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_read_map_declines_a_piece_it_does_not_read_itself(change: str, holders: int) -> None:
    m = rows((8, 4), [4, 4], holders=holders, **PIECE_CHANGES[change][0])
    assert small.read_map(m) is None
    with pytest.raises(AffineTransferError), small._general_only():
        validate_map(m, "source")
    assert small.read_map(rows((8, 4), [4, 4], holders=holders)) is not None


def two_pieces(**fields: Any) -> ParamAffineMap:
    """F (8, 4) on two locations of two pieces each (rows 4:6 and 0:2, then 2:4 and 6:8);
    ``fields`` change the first piece of location 0."""
    logical, shard = (8, 4), (4, 4)
    return ParamAffineMap(logical, {0: shard, 1: shard}, {
        0: [rp((2, 4), (4, 0), (0, 0), logical, shard, **{"locations": [0], **fields}),
            rp((2, 4), (0, 0), (2, 0), logical, shard, [0])],
        1: [rp((2, 4), (2, 0), (0, 0), logical, shard, [1]), rp((2, 4), (6, 0), (2, 0), logical, shard, [1])],
    })


MULTI_CHANGES: dict[str, dict[str, Any]] = {
    "F strides differ": {"source_strides": (5, 1)},
    "shard strides differ": {"dest_strides": (5, 1)},
    "scale": {"scale": 2.0},
    "shape has another axis": {"shape": (2, 4, 1)},
    "local box outside the shard": {"dest_offset": 16},
    "logical box outside F": {"source_offset": 40},
}


@pytest.mark.parametrize("change", list(MULTI_CHANGES), ids=list(MULTI_CHANGES))
def test_read_map_declines_a_piece_of_a_location_with_several(change: str) -> None:
    assert small.read_map(two_pieces()) is not None
    m = two_pieces(**MULTI_CHANGES[change])
    assert small.read_map(m) is None
    with pytest.raises(AffineTransferError), small._general_only():
        validate_map(m, "target")


def test_read_map_declines_isolated_faults() -> None:
    """Maps with exactly one fault each, which the later checks would not catch either."""
    logical = (8,)
    inside = ParamAffineMap(logical, {0: (4,), 1: (4,)}, {
        0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])], 1: [AffinePiece((4,), 4, (1,), 0, (1,), [1])]})
    assert small.read_map(inside) is not None
    leaves = ParamAffineMap(logical, {0: (4,), 1: (4,)}, {
        0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])], 1: [AffinePiece((4,), 6, (1,), 0, (1,), [1])]})
    assert small.read_map(leaves) is None  # F elements 8, 9: the volumes still add up
    bigger_shard = ParamAffineMap(logical, {0: (5,), 1: (4,)}, {
        0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])], 1: [AffinePiece((4,), 4, (1,), 0, (1,), [1])]})
    assert small.read_map(bigger_shard) is None  # shard element 4 belongs to no piece
    overlap_local = ParamAffineMap(logical, {0: (8,)}, {0: [
        AffinePiece((4,), 0, (1,), 0, (1,), [0]), AffinePiece((4,), 4, (1,), 2, (1,), [0])]})
    assert small.read_map(overlap_local) is None  # 8 = 4 + 4, but addresses 2, 3 twice and 6, 7 never
    twice_here = ParamAffineMap((4,), {0: (4,), 1: (2,)}, {
        0: [AffinePiece((2,), 0, (1,), 0, (1,), [0, 1]), AffinePiece((2,), 0, (1,), 2, (1,), [0, 1])],
        1: [AffinePiece((2,), 2, (1,), 0, (1,), [1])]})
    assert small.read_map(twice_here) is None  # F 0:2 twice in location 0, "held" by 1 as well
    top = rp((4, 4), (0, 0), (0, 0), (8, 4), (4, 4), [0, 1, 2])
    all_declare_more = ParamAffineMap((8, 4), {0: (4, 4), 1: (4, 4), 2: (4, 4)}, {
        0: [top], 2: [top], 1: [rp((4, 4), (4, 0), (0, 0), (8, 4), (4, 4), [1])]})
    assert small.read_map(all_declare_more) is None  # 3 declared, 2 hold it
    for m in (leaves, bigger_shard, overlap_local, twice_here, all_declare_more):
        with pytest.raises(AffineTransferError), small._general_only():
            validate_map(m, "source")


def test_places_carry_what_judge_reads() -> None:
    plain = small.read_map(SRC)
    assert plain is not None
    assert list(plain) == [0, 1, 2, 3]
    assert {loc: place[0] for loc, place in plain.items()} == dict(SRC.shard_shapes)
    assert plain[1] == ((4, 4), (4, 1), (((4, 0), (0, 0), (4, 4), frozenset({1, 3})),), (4, 0), 16)
    multi = small.read_map(two_pieces())
    assert multi is not None
    assert multi[0] == ((4, 4), (4, 1), (((4, 0), (0, 0), (2, 4), frozenset({0})),
                                             ((0, 0), (2, 0), (2, 4), frozenset({0}))), None, 16)


def test_read_map_declines_a_valid_stride_on_a_size_1_axis() -> None:
    """Any stride is valid on an axis of extent 1; the small path reads only row-major ones."""
    plain = contiguous_split_map((8, 1), [4, 4], 0)
    odd = ParamAffineMap((8, 1), plain.shard_shapes, {
        0: [plain.pieces_by_rank[0][0].replace(source_strides=(1, 7))], 1: plain.pieces_by_rank[1]})
    assert small.read_map(plain) is not None
    assert small.read_map(odd) is None and validate_map(odd, "target").held[0][0].index == 0


def test_read_map_declines_maps_it_does_not_read_itself() -> None:
    logical = (4, 2)
    full = contiguous_split_map(logical, [2, 2], 0)
    assert small.read_map(full) is not None

    class Sub(ParamAffineMap):
        __slots__ = ()

    assert small.read_map(Sub(logical, full.shard_shapes, full.pieces_by_rank)) is None
    plain_tuple = [tuple(full.pieces_by_rank[1][0])]  # equal to a piece, but not an AffinePiece
    unshared = ParamAffineMap(logical, full.shard_shapes, {0: full.pieces_by_rank[0], 1: plain_tuple})
    assert small.read_map(unshared) is None
    scalar = ParamAffineMap((), {0: ()}, {0: [AffinePiece((), 0, (), 0, (), [0])]})
    assert small.read_map(scalar) is None  # 0-d: the general path
    assert small.read_map(contiguous_split_map((0, 2), [0], 0)) is None  # empty F
    no_shard = ParamAffineMap(logical, {0: (2, 2)}, {0: full.pieces_by_rank[0], 1: full.pieces_by_rank[1]})
    assert small.read_map(no_shard) is None
    wrong_axes = ParamAffineMap(logical, {0: (2, 2), 1: (4,)}, full.pieces_by_rank)
    assert small.read_map(wrong_axes) is None
    all_of_f = [rp((4, 2), (0, 0), (0, 0), logical, (4, 2), [0])]
    empty_shard = ParamAffineMap(logical, {0: (4, 2), 1: (0, 2)}, {0: all_of_f})
    assert small.read_map(empty_shard) is None
    listed_empty = ParamAffineMap(logical, {0: (4, 2), 1: (0, 2)}, {0: all_of_f, 1: []})
    assert small.read_map(listed_empty) is None  # valid, but a shard of no element is the general path's
    assert general(listed_empty, "target").held[1] == []
    bare_shard = ParamAffineMap(logical, {0: (4, 2), 1: (1, 2)}, {0: all_of_f})
    assert small.read_map(bare_shard) is None
    huge = 1 << 31
    assert small.read_map(contiguous_split_map((huge, huge), [huge], 0)) is None  # F's volume = 2**62
    assert small.read_map(contiguous_split_map((huge, huge // 2), [huge], 0)) is not None
    big_shard = ParamAffineMap((2,), {0: (1 << 62,)}, {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])]})
    assert small.read_map(big_shard) is None
    assert volume((huge, huge)) == MAX_COORDINATE


def test_read_map_declines_locations_that_are_not_plain_tilings() -> None:
    logical, shard = (4, 2), (4, 2)

    def one(*pieces: AffinePiece) -> ParamAffineMap:
        return ParamAffineMap(logical, {0: shard}, {0: list(pieces)})

    top, bottom = (2, 2), (2, 2)
    good = one(rp(top, (0, 0), (0, 0), logical, shard, [0]), rp(bottom, (2, 0), (2, 0), logical, shard, [0]))
    assert small.read_map(good) is not None
    gap = one(rp((1, 2), (0, 0), (0, 0), logical, shard, [0]), rp(bottom, (2, 0), (2, 0), logical, shard, [0]))
    assert small.read_map(gap) is None  # 6 of 8 shard elements
    same_local = one(rp(top, (0, 0), (0, 0), logical, shard, [0]), rp(bottom, (2, 0), (0, 0), logical, shard, [0]),
                     rp((1, 2), (1, 0), (3, 0), logical, shard, [0]))
    assert small.read_map(same_local) is None
    grid = ParamAffineMap((2, 2), {0: (2, 2)}, {0: [
        rp((1, 1), (i, j), (i, j), (2, 2), (2, 2), [0]) for i in range(2) for j in range(2)]})
    assert small.read_map(grid) is None  # a tiling, but not slabs along one axis
    assert validate_map(grid, "target").held[0][3].index == 3
    overlapping_logical = one(rp(top, (0, 0), (0, 0), logical, shard, [0]),
                              rp(top, (1, 0), (2, 0), logical, shard, [0]))
    assert small.read_map(overlapping_logical) is None
    last_row_two_cols = ParamAffineMap((2, 2), {0: (1, 2), 1: (1, 2)}, {
        0: [rp((1, 2), (0, 0), (0, 0), (2, 2), (1, 2), [0])],
        1: [rp((1, 1), (1, 0), (0, 0), (2, 2), (1, 2), [1]), rp((1, 1), (1, 1), (0, 1), (2, 2), (1, 2), [1])],
    })
    assert small.read_map(last_row_two_cols) is None  # F's boxes are no slabs along one axis
    swapped_cols = ParamAffineMap((2, 2), {0: (2, 2)}, {
        0: [rp((2, 1), (0, 0), (0, 1), (2, 2), (2, 2), [0]), rp((2, 1), (0, 1), (0, 0), (2, 2), (2, 2), [0])],
    })
    read = fast(swapped_cols, "target")  # slabs along axis 1, in the shard and in F
    assert read is not None and same_layout(read, general(swapped_cols, "target"))


def test_read_map_checks_holders_and_coverage() -> None:
    logical = (4, 2)
    shard = (2, 2)
    half = (2, 2)

    def m(pieces: dict[int, list[AffinePiece]], shards: dict[int, tuple[int, ...]] | None = None) -> ParamAffineMap:
        return ParamAffineMap(logical, shards or dict.fromkeys(pieces, shard), pieces)

    ok = m({0: [rp(half, (0, 0), (0, 0), logical, shard, [0, 2])], 1: [rp(half, (2, 0), (0, 0), logical, shard, [1])],
            2: [rp(half, (0, 0), (0, 0), logical, shard, [0, 2])]})
    assert small.read_map(ok) is not None
    first, second = rp(half, (0, 0), (0, 0), logical, shard, [0, 2]), rp(half, (2, 0), (0, 0), logical, shard, [1])
    other_declares = m({0: [first], 1: [second], 2: [rp(half, (0, 0), (0, 0), logical, shard, [2, 0, 1])]})
    assert small.read_map(other_declares) is None
    other_shape = m({0: [first], 1: [second], 2: [rp((1, 2), (0, 0), (0, 0), logical, (1, 2), [0, 2])]},
                    {0: shard, 1: shard, 2: (1, 2)})
    assert small.read_map(other_shape) is None
    uncovered = m({0: [rp(half, (0, 0), (0, 0), logical, shard, [0])]})
    assert small.read_map(uncovered) is None
    straddling = ParamAffineMap(logical, {0: (3, 2), 1: (2, 2)}, {
        0: [rp((3, 2), (0, 0), (0, 0), logical, (3, 2), [0])], 1: [rp(half, (2, 0), (0, 0), logical, shard, [1])]})
    assert small.read_map(straddling) is None  # target boxes overlap (volume 10 of 8)
    checker = ParamAffineMap((2, 2), {0: (1, 2), 1: (1, 2)}, {
        0: [rp((1, 1), (0, 0), (0, 0), (2, 2), (1, 2), [0]), rp((1, 1), (1, 1), (0, 1), (2, 2), (1, 2), [0])],
        1: [rp((1, 1), (0, 1), (0, 0), (2, 2), (1, 2), [1]), rp((1, 1), (1, 0), (0, 1), (2, 2), (1, 2), [1])],
    })
    assert small.read_map(checker) is None  # disjoint, covering, but no slab axis
    assert validate_map(checker, "source").shards == {0: (1, 2), 1: (1, 2)}


def test_read_map_piece_count_bound() -> None:
    def cols(n: int) -> ParamAffineMap:
        return contiguous_split_map((2, n), [1] * n, 1)

    assert cols(small.SMALL_PIECES).content.pieces == small.SMALL_PIECES
    assert small.read_map(cols(small.SMALL_PIECES)) is not None
    assert small.read_map(cols(small.SMALL_PIECES + 1)) is None


def test_held_is_built_on_first_use_and_kept() -> None:
    src = validate_map(SRC, "source")
    assert src._held is None and src._build is not None
    first = src.held
    assert src.held is first and src._build is None
    assert [h.index for h in first[0]] == [0] and first[3][0].locations == frozenset({1, 3})
    # Equality is the map's (side, F, shards, pieces), however the layout was read.
    assert validate_map(SRC, "source") == general(SRC, "source") != general(SRC, "target")
    assert general(SRC, "source") != general(rows((8, 4), [4, 4]), "source")
    assert general(TGT, "target") != general(rows((8, 4), [2, 6]), "target")
    assert Layout.__eq__(src, 1) is NotImplemented and src != 1
    logical, shard = (8, 4), (4, 4)
    reordered = ParamAffineMap(logical, {0: shard, 1: shard}, {
        0: [rp((2, 4), (0, 0), (0, 0), logical, shard, [0]), rp((2, 4), (4, 0), (2, 0), logical, shard, [0])],
        1: two_pieces().pieces_by_rank[1]})
    assert general(reordered, "target").shards == general(two_pieces(), "target").shards
    assert general(reordered, "target") != general(two_pieces(), "target")  # the pieces differ
    assert repr(src).startswith("Layout(side='source', logical_shape=(8, 4), shards={0: (4, 4)")


# Each change to GOOD's first segment that the small path must decline (the general path judges).
SEGMENT_CHANGES: dict[str, dict[str, Any]] = {
    "unknown source location": {"source_rank": 9},
    "unknown target location": {"target_rank": 9},
    "source strides": {"source_strides": (8, 1)},
    "target strides": {"target_strides": (8, 1)},
    "axes": {"shape": (8,), "source_strides": (1,), "target_strides": (1,)},
    "reads past its shard": {"source_offset": 12},
    "writes past its shard": {"target_offset": 1},
    "negative read": {"source_offset": -4},
    "wrong element": {"source_offset": 4},
    "empty extent": {"shape": (0, 4)},
    "shape has another axis": {"shape": (2, 4, 1)},
    "box larger than the target shard": {"shape": (3, 4)},
    "whole-shard shape at another offset": {"target_offset": 4},
}


@pytest.mark.parametrize("change", list(SEGMENT_CHANGES), ids=list(SEGMENT_CHANGES))
def test_judge_declines_a_segment_it_does_not_judge_itself(change: str) -> None:
    src, tgt = layouts()
    fields = {**GOOD[0].__dict__, **SEGMENT_CHANGES[change]}
    plan = [TransferSegment(**fields), *GOOD[1:]]
    assert small.judge(GOOD, src, tgt) == ok_verdict(4)
    assert small.judge(plan, src, tgt, gaps=False) is None
    fast, general = both_ways(TGT, SRC, plan)
    assert fast == general
    # A flat segment copying rows 0:2 is right, read element by element (the fallback).
    assert fast.ok == (change == "axes")
    assert small.judge(plan, src, tgt) is None


def test_judge_exactly_once_and_gaps() -> None:
    src, tgt = layouts()
    assert small.judge(GOOD[:3], src, tgt) is None  # location 3 unwritten
    assert small.judge(GOOD[:3], src, tgt, gaps=False) == ok_verdict(3)
    assert small.judge([*GOOD, GOOD[0]], src, tgt, gaps=False) is None  # a double write
    halves = [seg(0, 0, (4, 1), 0, 0, (4, 1), (1, 4)), seg(2, 4, (4, 1), 0, 4, (4, 1), (1, 4)), *GOOD[1:]]
    assert small.judge(halves, src, tgt) == ok_verdict(5)  # two rows into location 0, from two replicas
    cols = [seg(0, 0, (4, 1), 0, 0, (4, 1), (2, 2)), seg(2, 2, (4, 1), 0, 2, (4, 1), (2, 2)), *GOOD[1:]]
    assert small.judge(cols, src, tgt) == ok_verdict(5)  # slabs along axis 1
    crossed = [seg(0, 0, (4, 1), 0, 0, (4, 1), (2, 3)), seg(2, 1, (4, 1), 0, 1, (4, 1), (2, 3)), *GOOD[1:]]
    assert small.judge(crossed, src, tgt, gaps=False) is None
    assert small.judge([], src, tgt) is None
    with small._general_only():
        general = verify_plan(TGT, SRC, [])
    assert verify_plan(TGT, SRC, []) == general and not general.ok
    mixed = general_layout(TGT)
    assert small.judge([], src, tgt, gaps=False) == ok_verdict(0) == check_plan([], src, mixed, 0, gaps=False)
    assert small.judge(GOOD, src, mixed) is None and small.judge(GOOD, general_layout(SRC, "source"), tgt) is None
    assert check_plan(GOOD, src, mixed, 0) == ok_verdict(4)
    # A location of one element left unwritten: the gap check compares with its numel, 1.
    pair = contiguous_split_map((2, 1), [1, 1], 0)
    p_src, p_tgt = layouts(pair, pair)
    assert small.judge([seg(0, 0, (1, 1), 0, 0, (1, 1), (1, 1))], p_src, p_tgt) is None
    both = [seg(0, 0, (1, 1), 0, 0, (1, 1), (1, 1)), seg(1, 0, (1, 1), 1, 0, (1, 1), (1, 1))]
    assert small.judge(both, p_src, p_tgt) == ok_verdict(2)


def test_judge_bounds() -> None:
    whole = contiguous_split_map((4, 1), [4], 0)
    src = general(whole, "source")
    assert small.judge([seg(0, 0, (1, 1), 0, 0, (1, 1), (4, 1))], src, src) is None  # not read by read_map
    s1, t1 = layouts(whole, whole)
    assert small.judge([seg(0, 0, (1, 1), 0, 0, (1, 1), (4, 1))], s1, t1) == ok_verdict(1)
    one = contiguous_split_map((small.SMALL_SEGMENTS, 1), [small.SMALL_SEGMENTS], 0)
    rows_map = contiguous_split_map((small.SMALL_SEGMENTS, 1), [1] * small.SMALL_SEGMENTS, 0)
    s, t = layouts(rows_map, one)
    plan = [seg(0, r, (1, 1), r, 0, (1, 1), (1, 1)) for r in range(small.SMALL_SEGMENTS)]
    assert small.judge(plan, s, t) == ok_verdict(small.SMALL_SEGMENTS)
    assert small.judge([*plan, plan[0]], s, t, gaps=False) is None  # one more than the bound
    n = small.SMALL_LOCATION_PIECES
    for count, engaged in ((n, True), (n + 1, False)):
        logical2 = (count, 1)
        one_loc = ParamAffineMap(logical2, {0: logical2}, {0: [
            rp((1, 1), (r, 0), (r, 0), logical2, logical2, [0]) for r in range(count)]})
        whole2 = contiguous_split_map(logical2, [count], 0)
        for target, source in ((whole2, one_loc), (one_loc, whole2)):
            s2, t2 = layouts(target, source)
            verdict = small.judge([seg(0, 0, (1, 1), 0, 0, (1, 1), logical2)], s2, t2)
            assert (verdict == ok_verdict(1)) is engaged


def test_judge_never_says_ok_when_pieces_do_not_cover_a_box() -> None:
    """``_right`` re-counts the cuts of each box, like ``check_plan``'s ``_cut``: with a place
    that lost a piece (a broken Premise A, which ``read_map`` never builds) it declines."""
    whole = contiguous_split_map((4, 2), [4], 0)
    src, tgt = layouts(whole, whole)
    plan = [seg(0, 0, (2, 1), 0, 0, (2, 1), (4, 2))]
    assert small.judge(plan, src, tgt) == ok_verdict(1)
    half = ((0, 0), (0, 0), (2, 2), frozenset({0}))  # rows 0:2 only
    other = ((2, 0), (2, 0), (2, 2), frozenset({0}))
    for parts in ((half,), (other,), (half, other)):
        place = ((4, 2), (2, 1), parts, None, 8)
        ok = len(parts) == 2
        broken_source = Layout("source", (4, 2), {0: (4, 2)}, {}, {0: place})
        assert (small.judge(plan, broken_source, tgt) == ok_verdict(1)) is ok
        broken_target = Layout("target", (4, 2), {0: (4, 2)}, {}, {0: place})
        assert (small.judge(plan, src, broken_target, gaps=False) == ok_verdict(1)) is ok


# -- the unrolled matrix case, the batch memo and the cheap verdict copies (issue 27) ------------------


@pytest.mark.parametrize("holders", [1, 2])
def test_read_map_declines_a_matrix_piece_past_f_on_either_axis(holders: int) -> None:
    """A one-piece location of a matrix is read by the unrolled decode: each axis' bound is
    checked (a piece one column or one row past F is the map's only fault)."""
    assert small.read_map(rows((8, 4), [4, 4], holders=holders)) is not None
    for offset in (1, 3, 20):  # columns 1:5 or 3:7 of rows 0:4; rows 5:9
        m = rows((8, 4), [4, 4], holders=holders, source_offset=offset)
        assert small.read_map(m) is None, offset
        with pytest.raises(AffineTransferError), small._general_only():
            validate_map(m, "source")
    by_cols = contiguous_split_map((4, 8), [4, 4], 1)  # origins (0, 0) and (0, 4): at F's edge exactly
    read = fast(by_cols, "target")
    assert read is not None and same_layout(read, general(by_cols, "target"))
    assert read.plain is not None and read.plain[1] == ((4, 4), (4, 1), (((0, 4), (0, 0), (4, 4), frozenset({1})),),
                                                        (0, 4), 16)


@pytest.mark.parametrize(("shard", "offset"), [((0, 2), 8), ((2, 0), 4)])
def test_read_map_declines_a_matrix_shard_empty_on_either_axis(shard: tuple[int, int], offset: int) -> None:
    """One empty piece that is its whole (empty) shard, at an origin of its own (F's row 4, or
    row 2 with no column): valid, and the general path lists no piece there; the unrolled decode
    declines it on either axis (every later check would pass it)."""
    logical = (4, 2)
    all_of_f = [rp((4, 2), (0, 0), (0, 0), logical, (4, 2), [0])]
    empty = AffinePiece(shard, offset, row_major_strides(logical), 0, row_major_strides(shard), [1])
    m = ParamAffineMap(logical, {0: (4, 2), 1: shard}, {0: all_of_f, 1: [empty]})
    assert small.read_map(m) is None
    assert general(m, "target").held[1] == []


def test_read_map_declines_a_matrix_piece_with_a_third_axis() -> None:
    """A piece (and shard) of three axes whose F strides are a matrix's: the map is refused (by
    the general path), never read as a matrix."""
    logical = (2, 2)
    piece = AffinePiece((2, 2, 1), 0, (2, 1), 0, (2, 1, 1), [0])
    m = ParamAffineMap(logical, {0: (2, 2, 1)}, {0: [piece]})
    assert small.read_map(m) is None
    with pytest.raises(AffineTransferError), small._general_only():
        validate_map(m, "target")


def test_judge_checks_each_axis_of_a_matrix_segment() -> None:
    """The unrolled read decode and translation check: each axis alone declines."""
    src, tgt = layouts()
    cols = [seg(0, 0, (4, 1), 0, 0, (4, 1), (2, 2)), seg(2, 2, (4, 1), 0, 2, (4, 1), (2, 2)), *GOOD[1:]]
    assert small.judge(cols, src, tgt) == ok_verdict(5)
    changes: dict[str, list[TransferSegment]] = {
        "reads columns 0:2 into columns 2:4": [cols[0], seg(2, 0, (4, 1), 0, 2, (4, 1), (2, 2)), *GOOD[1:]],
        "reads rows 1:3 into rows 0:2": [seg(0, 4, (4, 1), 0, 0, (4, 1), (2, 4)), *GOOD[1:]],
        "reads one column past its shard": [seg(0, 1, (4, 1), 0, 0, (4, 1), (2, 4)), *GOOD[1:]],
        "reads one row past its shard": [seg(0, 12, (4, 1), 0, 0, (4, 1), (2, 4)), *GOOD[1:]],
        "no column": [seg(0, 0, (4, 1), 0, 0, (4, 1), (2, 0)), *GOOD[1:]],
        "no row": [seg(0, 0, (4, 1), 0, 0, (4, 1), (0, 4)), *GOOD[1:]],
    }
    for name, plan in changes.items():
        assert small.judge(plan, src, tgt, gaps=False) is None, name
        fast_verdict, general_verdict = both_ways(TGT, SRC, plan)
        assert fast_verdict == general_verdict and not fast_verdict.ok, name
    # A read box past its shard on one axis, with the translation agreeing: only the bound refuses.
    for axis in (0, 1):
        logical = (8, 2) if axis == 0 else (2, 8)
        whole = contiguous_split_map(logical, [logical[axis]], axis)
        halves = contiguous_split_map(logical, [logical[axis] // 2] * 2, axis)
        h_src, w_tgt = layouts(whole, halves)
        strides = row_major_strides(logical)
        too_far = [seg(0, 0, row_major_strides(halves.shard_shapes[0]), 0, 0, strides, logical)]
        assert small.judge(too_far, h_src, w_tgt) is None, axis
        fast_verdict, general_verdict = both_ways(whole, halves, too_far)
        assert fast_verdict == general_verdict and not fast_verdict.ok, axis


def test_judge_checks_each_axis_beyond_a_matrix() -> None:
    """Three axes take the general decode and translation check: right and wrong alike."""
    logical = (4, 3, 2)
    target = contiguous_split_map(logical, [2, 2], 0)
    source = replicate(contiguous_split_map(logical, [4], 0), 2)
    src, tgt = layouts(target, source)
    plan = plan_transfer(target, source)
    assert small.judge(plan.segments, src, tgt) == ok_verdict(len(plan.segments)) == ok_verdict(2)
    first = plan.segments[0]
    for offset in (1, 6, 12):  # one element, one row, two rows further on
        moved = [TransferSegment(**{**first.__dict__, "source_offset": first.source_offset + offset}),
                 *plan.segments[1:]]
        assert small.judge(moved, src, tgt, gaps=False) is None, offset
        fast_verdict, general_verdict = both_ways(target, source, moved)
        assert fast_verdict == general_verdict and not fast_verdict.ok, offset
    # Split along the last axis: a segment reading the other column is inside its shard and wrong
    # on that axis alone (the translation check compares every axis).
    by_last = contiguous_split_map(logical, [1, 1], 2)
    w_src, l_tgt = layouts(by_last, source)
    right = [seg(0, c, (6, 2, 1), c, 0, (3, 1, 1), (4, 3, 1)) for c in (0, 1)]
    assert small.judge(right, w_src, l_tgt) == ok_verdict(2)
    crossed = [seg(0, 1 - c, (6, 2, 1), c, 0, (3, 1, 1), (4, 3, 1)) for c in (0, 1)]
    assert small.judge(crossed, w_src, l_tgt) is None
    fast_verdict, general_verdict = both_ways(by_last, source, crossed)
    assert fast_verdict == general_verdict and not fast_verdict.ok


def test_the_verdict_memo_reads_content_only_for_a_pair_seen_again(
    monkeypatch: pytest.MonkeyPatch, oracle_work: dict[str, int]
) -> None:
    """The first plan on a pair of layouts is filed without reading its content; plans on a pair
    seen before are compared by content (the first one's read then), each verdict under its name."""
    import refplan.oracle.judge as judge_module

    reads = {"n": 0}
    content = judge_module._segment_content

    def counted(segment: TransferSegment) -> Any:
        reads["n"] += 1
        return content(segment)

    monkeypatch.setattr(judge_module, "_segment_content", counted)
    distinct = {f"p{i}": (contiguous_split_map((8, 4 + i), [4, 4], 0), src_of(4 + i)) for i in range(3)}
    plans: dict[str, Any] = {name: plan_transfer(*pair) for name, pair in distinct.items()}
    assert verify_plans(distinct, plans).ok
    assert reads["n"] == 0 and oracle_work["check_plan"] == 3
    twins = {name: (TGT, SRC) for name in ("a", "b", "c", "d", "e")}
    wrong = [seg(0, 4, (4, 1), 0, 0, (4, 1), (2, 4)), *GOOD[1:]]
    twin_plans: dict[str, Any] = {"a": GOOD, "b": list(GOOD), "c": wrong, "d": list(wrong), "e": GOOD}
    result = verify_plans(twins, twin_plans)
    # Judged: a (b and e then by content), c (d by content), and c with the maps swapped (a failing
    # plan is, for the swapped-maps note; d's swapped judgement is then c's by content).
    assert oracle_work["check_plan"] == 3 + 3
    # Read: b, c, d, e (four segments each); a's content when b came; d again on the swapped pair,
    # and c's content there when d came. The first plan on each pair is not read until then.
    assert reads["n"] == 4 * (4 + 1 + 2)
    assert [result.verdicts[n].ok for n in "abcde"] == [True, True, False, False, True]
    assert all(v.parameter == n for n, v in result.verdicts.items())
    with small._general_only():
        assert verify_plans(twins, twin_plans) == result
    assert verify_plan(TGT, SRC, wrong, parameter="d") == result.verdicts["d"]


def src_of(cols: int) -> ParamAffineMap:
    """``SRC``'s layout (rows 0:4 on 0 and 2, rows 4:8 on 1 and 3) for an (8, cols) parameter."""
    return replicate(contiguous_split_map((8, cols), [4, 4], 0), 2)


def test_verdict_copies_and_the_ok_verdict() -> None:
    full = Verdict("invalid", "a", "why", 1, 2, (3, 4), (5,), "E: m", 6, 7)
    named = full.with_parameter("b")
    assert type(named) is Verdict and named is not full and full.parameter == "a"
    assert named == Verdict("invalid", "b", "why", 1, 2, (3, 4), (5,), "E: m", 6, 7)
    assert list(vars(named)) == list(vars(full)) and hash(named) == hash(Verdict(**{**vars(full), "parameter": "b"}))
    assert full.with_parameter(None).parameter is None and str(named).startswith("invalid: parameter 'b': why")
    assert ok_verdict(3) is ok_verdict(3) and ok_verdict(3) == Verdict(
        "ok", None, "3 segment(s) verified: every target element is written exactly once with its own logical "
        "element, read from a source location that holds it", checked_segments=3)
    assert ok_verdict(0).checked_segments == 0 and ok_verdict(2) != ok_verdict(3)


def test_plain_segments_are_ints_and_tuples_of_ints() -> None:
    """``_plain`` and ``plain_rows`` (the quick judgement's one read of every field) accept exactly
    ints and tuples of ints in every field, wherever the odd segment stands; ``plain_rows`` gives
    the fields in ``FIELDS``' order, the values themselves."""
    import numpy as np

    from refplan.oracle.segments import FIELDS, _plain, plain_rows

    class Int(int):
        pass

    class Tup(tuple):  # type: ignore[type-arg]
        pass

    good = GOOD[0]
    assert _plain([]) and _plain(GOOD)
    assert plain_rows([]) == [] and plain_rows(GOOD) == [FIELDS(seg) for seg in GOOD]
    assert all(a is b for row, seg in zip(plain_rows(GOOD) or [], GOOD) for a, b in zip(row, FIELDS(seg)))
    odd_values: list[dict[str, Any]] = [
        {"source_rank": True}, {"source_offset": 0.0}, {"target_rank": "0"}, {"target_offset": None},
        {"shape": [2, 4]}, {"source_strides": [4, 1]}, {"target_strides": [4, 1]}, {"target_strides": (4, True)},
        {"shape": (2, 4.0)},
        {"source_strides": (4.0, 1)},
        {"source_rank": Int(0)}, {"target_offset": np.int64(0)}, {"shape": Tup((2, 4))},
        {"source_strides": (Int(4), 1)}, {"source_offset": (0,)}, {"target_rank": (0,)},
    ]
    for change in odd_values:
        odd = TransferSegment(**{**good.__dict__, **change})
        for segments in ([odd], [*GOOD, odd], [odd, *GOOD]):
            assert not _plain(segments) and plain_rows(segments) is None, change


def test_judge_declines_maps_of_different_ranks() -> None:
    """``segment_errors`` (``refplan verify --all``) judges segments without comparing the two
    logical shapes: a matrix target and a three-axis source are the general path's to answer."""
    target = contiguous_split_map((4, 6), [4], 0)
    source = contiguous_split_map((4, 3, 2), [4], 0)
    src, tgt = fast(source, "source"), fast(target, "target")
    assert src is not None and tgt is not None
    # Columns 0:3 of the target from a box whose first two axes line up: the strides do not.
    half = [seg(0, 0, (6, 2, 1), 0, 0, (6, 1), (4, 3))]
    assert small.judge(half, src, tgt, gaps=False) is None
    found = segment_errors(target, source, half, limit=5, scan=10)
    with small._general_only():
        assert found == segment_errors(target, source, half, limit=5, scan=10)
    assert [index for index, _ in found[0]] == [0] and found[1] == 1


# ---------------------------------------------------------------------------------------------
# ``verify_plans``' quick judgement (``judge._quick``): exact types, small plain maps and plans.


def _quick_batch() -> tuple[dict[str, Any], dict[str, Any]]:
    """Three distinct TP2xDP2 -> TP4 parameters and their plans."""
    pairs = {f"p{i}": (contiguous_split_map((8, 3 + i), [2, 2, 2, 2], 0),
                       replicate(contiguous_split_map((8, 3 + i), [4, 4], 0), 2)) for i in range(3)}
    return pairs, {name: plan_transfer(*pair) for name, pair in pairs.items()}


def _quick_taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per ``_quick`` call, whether it gave the verdict."""
    import refplan.oracle.judge as judge_module

    taken: list[bool] = []
    real = judge_module._quick

    def counted(*args: Any) -> Any:
        got = real(*args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(judge_module, "_quick", counted)
    return taken


def test_the_quick_judgement_gives_the_general_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    pairs, plans = _quick_batch()
    taken = _quick_taken(monkeypatch)
    quick = verify_plans(pairs, plans)
    assert taken == [True, True, True]
    with small._general_only():
        general = verify_plans(pairs, plans)
    assert taken[3:] == [False, False, False]  # switched off with the small path
    assert quick == general and quick.ok and [v.parameter for v in quick.verdicts.values()] == ["p0", "p1", "p2"]
    assert quick.verdicts["p1"] == ok_verdict(len(plans["p1"].segments)).with_parameter("p1")


def _forced(plan: Any, **fields: Any) -> Any:
    """``plan`` with fields forced past the frozen dataclass (what a Python caller can do)."""
    import copy

    forced = copy.copy(plan)
    for name, value in fields.items():
        object.__setattr__(forced, name, value)
    return forced


def _forced_segment(plan: Any, **fields: Any) -> Any:
    first = _forced(plan.segments[0], **fields)
    return _forced(plan, segments=(first, *plan.segments[1:]))


@pytest.mark.parametrize("change", [
    "list of segments", "segments as dicts", "a bool rank", "a float offset", "a list of strides",
    "a float in a stride", "another logical shape", "a bool in the logical shape", "a wrong offset", "a subclass plan",
    "a dict map", "one segment too few",
])
def test_anything_unusual_goes_to_the_general_judgement(monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """Only exact, plain plans on exact maps are judged quickly; everything else gets exactly the
    verdict it got before (the general steps, ``small._general_only``)."""
    pairs, plans = _quick_batch()
    plan = plans["p1"]
    seg = plan.segments[0]
    target, source = pairs["p1"]
    if change == "list of segments":
        plans["p1"] = _forced(plan, segments=list(plan.segments))
    elif change == "segments as dicts":
        plans["p1"] = {"logical_shape": list(plan.logical_shape), "segments": [s.to_dict() for s in plan.segments]}
    elif change == "a bool rank":
        plans["p1"] = _forced_segment(plan, source_rank=bool(seg.source_rank) if seg.source_rank in (0, 1) else True)
    elif change == "a float offset":
        plans["p1"] = _forced_segment(plan, target_offset=float(seg.target_offset))
    elif change == "a list of strides":
        plans["p1"] = _forced_segment(plan, source_strides=list(seg.source_strides))
    elif change == "a float in a stride":
        plans["p1"] = _forced_segment(plan, target_strides=(float(seg.target_strides[0]), *seg.target_strides[1:]))
    elif change == "another logical shape":
        plans["p1"] = _forced(plan, logical_shape=(8, 5))
    elif change == "a bool in the logical shape":
        plans["p1"] = plan_transfer(*pairs["p0"])
        pairs["p1"] = (contiguous_split_map((1, 1), [1], 0), contiguous_split_map((1, 1), [1], 0))
        plans["p1"] = _forced(plan_transfer(*pairs["p1"]), logical_shape=(True, 1))
    elif change == "a wrong offset":
        plans["p1"] = _forced_segment(plan, source_offset=seg.source_offset + 1)
    elif change == "a subclass plan":
        plans["p1"] = type("Sub", (type(plan),), {})(plan.segments, plan.logical_shape, plan.moved_elements,
                                                     plan.statistics)
    elif change == "a dict map":
        pairs["p1"] = (target.to_dict(), source)
    elif change == "one segment too few":
        plans["p1"] = _forced(plan, segments=plan.segments[1:])
    taken = _quick_taken(monkeypatch)
    quick = verify_plans(pairs, plans)
    with small._general_only():
        general = verify_plans(pairs, plans)
    assert quick == general
    assert quick.verdicts["p0"].ok and quick.verdicts["p2"].ok
    # p1 went to the general steps (the quick one was either not tried or gave no verdict), and
    # the others were judged quickly.
    assert taken[:3].count(True) == 2


def test_one_axis_segments_are_judged_exactly_as_the_general_path() -> None:
    """``small.judge_places``' unrolled 1-D case against ``check_plan``'s general judgement, segment
    by segment (no gap check), on every segment of small offsets and extents between a source
    of two replicated halves and a target of three parts: ``ok`` exactly when the general path
    says ``ok``, never for a segment it refuses."""
    source = validate_map(replicate(contiguous_split_map((6,), [3, 3], 0), 2), "source")
    target = validate_map(contiguous_split_map((6,), [2, 1, 3], 0), "target")
    assert source.plain is not None and target.plain is not None
    agreed = {"ok": 0, "refused": 0}
    for s_loc in range(4):
        for t_loc in range(3):
            for s_off in range(-1, 4):
                for t_off in range(-1, 3):
                    for extent in range(0, 4):
                        seg = TransferSegment(s_loc, s_off, (1,), t_loc, t_off, (1,), (extent,))
                        quick = small.judge([seg], source, target, gaps=False)
                        with small._general_only():
                            general = check_plan([seg], source, target, 10**6, gaps=False)
                        assert (quick is not None) == general.ok, (seg, general.reason)
                        agreed["ok" if general.ok else "refused"] += 1
    assert agreed["ok"] >= 10 and agreed["refused"] >= 100


@pytest.mark.parametrize("field", ["segments", "logical_shape"])
def test_a_plan_field_deleted_past_the_frozen_dataclass_is_judged_invalid(field: str) -> None:
    """Neither the quick judgement nor the batch's verdict memo may let an ``AttributeError`` out
    of ``verify_plans``: the plan is malformed, once or met twice, as ``verify_plan`` says."""
    import copy

    pairs, plans = _quick_batch()
    broken = copy.copy(plans["p1"])
    object.__delattr__(broken, field)
    want = "malformed plan: plan: cannot be read (AttributeError)"
    assert verify_plan(*pairs["p1"], broken).reason == want
    for batch_plans in ({**plans, "p1": broken}, {**plans, "p1": broken, "p2": broken}):
        result = verify_plans({**pairs, "p2": pairs["p1"]} if "p2" in batch_plans and batch_plans["p2"] is broken
                              else pairs, batch_plans)
        assert result.status == "invalid" and result.verdicts["p0"].ok
        assert all(result.verdicts[name].reason == want for name, plan in batch_plans.items() if plan is broken)


# -- maps the first pass must not take (each found by a surviving mutant of ``read_map``) -----------


def test_read_map_declines_pieces_that_each_declare_another_location() -> None:
    """Every piece declares as many holders as hold its box, but not the ones that do (location
    0's rows name location 1 and the other way round): ``read_map``'s first pass must not count
    a declaration of the right size as the right one. The general path refuses the map."""
    logical, shard = (4, 2), (2, 2)
    swapped = ParamAffineMap(logical, {0: shard, 1: shard}, {
        0: [rp(shard, (0, 0), (0, 0), logical, shard, [1])], 1: [rp(shard, (2, 0), (0, 0), logical, shard, [0])]})
    assert small.read_map(swapped) is None
    with pytest.raises(AffineTransferError):
        general_layout(swapped)
    right = ParamAffineMap(logical, {0: shard, 1: shard}, {
        0: [rp(shard, (0, 0), (0, 0), logical, shard, [0])], 1: [rp(shard, (2, 0), (0, 0), logical, shard, [1])]})
    assert small.read_map(right) is not None


@pytest.mark.parametrize("logical", [(2, 1), (2,)])
def test_read_map_reads_one_tuple_of_pieces_again_in_another_shard(logical: tuple[int, ...]) -> None:
    """One tuple object of pieces at two locations whose shards differ: read once per shard.
    Location 1's shard, (1, 1) (or (1,)), is the row-major strides of location 0's, so a reading
    keyed on anything but the shard itself would hand location 1 location 0's place, where the
    piece (all of F, two elements) does not fit its one-element shard. The general path refuses."""
    whole = (rp(logical, (0,) * len(logical), (0,) * len(logical), logical, logical, [0, 1]),)
    small_shard = (1,) * len(logical)
    assert row_major_strides(logical) == small_shard
    m = ParamAffineMap(logical, {0: logical, 1: small_shard}, {0: whole, 1: whole})
    assert m.pieces_by_rank[0] is m.pieces_by_rank[1]  # the constructor keeps the one tuple
    assert small.read_map(m) is None
    with pytest.raises(AffineTransferError):
        general_layout(m)


@pytest.mark.parametrize("logical", [(4, 2), (4,), (4, 2, 1)])
def test_read_map_declines_an_empty_piece_that_slabs_would_separate(logical: tuple[int, ...]) -> None:
    """An empty whole-shard piece after two row blocks (F's row 4): valid, the general path lists
    no piece there, and the boxes are separable slabs along rows, so only the read of the empty
    extent itself declines it (on a matrix and off one)."""
    rest = logical[1:]
    half = (2, *rest)
    empty_shard = (0, *rest)
    zero = (0,) * len(logical)
    strides = row_major_strides(logical)
    empty = AffinePiece(empty_shard, 4 * (strides[0]), strides, 0, row_major_strides(empty_shard), [2])
    m = ParamAffineMap(logical, {0: half, 1: half, 2: empty_shard}, {
        0: [rp(half, zero, zero, logical, half, [0])],
        1: [rp(half, (2, *zero[1:]), zero, logical, half, [1])],
        2: [empty],
    })
    assert small.read_map(m) is None
    assert general_layout(m).held[2] == []


def test_judge_places_judges_gaps_unless_told_not_to() -> None:
    """``judge_places``'s own default is the gap check (``judge`` passes it explicitly)."""
    src, tgt = layouts()
    assert src.plain is not None and tgt.plain is not None
    assert small.judge_places(GOOD, src.plain, tgt.plain, 2, 2) is not None
    assert small.judge_places(GOOD[:3], src.plain, tgt.plain, 2, 2) is None
    assert small.judge_places(GOOD[:3], src.plain, tgt.plain, 2, 2, gaps=False) is not None


def test_verify_plans_passes_its_fallback_budget_to_the_general_judgement() -> None:
    """A plan the quick judgement declines (a segment that is not a box: rows of 8 over a
    4-wide shard) is judged element by element within ``fallback_elements``: over the batch's
    budget it is unverifiable, within it ok, as ``verify_plan`` says."""
    identity = contiguous_split_map((4, 4), [4], 0)
    segments = [TransferSegment(0, 0, (8, 1), 0, 0, (8, 1), (2, 8))]
    for wraps in (segments, TransferPlan(tuple(segments), (4, 4), 16)):  # a list, and the planner's own type
        assert verify_plans({"w": (identity, identity)}, {"w": wraps}).verdicts["w"].ok
        small_budget = verify_plans({"w": (identity, identity)}, {"w": wraps}, fallback_elements=4).verdicts["w"]
        assert small_budget.status == "unverifiable"
        assert verify_plan(identity, identity, wraps, fallback_elements=4).status == "unverifiable"
