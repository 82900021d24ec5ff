"""The builders make the content directly (issue 27): the same map as the constructor, no weaker.

The builders no longer go through ``AffinePiece(...)``/``ParamAffineMap(...)`` per piece: they
convert each argument once and make converted pieces themselves, share holder sets and piece
tuples, and remember what their arguments built. None of that may change a map. So every builder
is compared here with a *reference* written in this file from the builder's documented meaning,
built piece by piece through the general constructor (which converts and checks everything): the
two must be one content object, with the same locations in the same order and the same pieces.
And every argument is still held to ``as_int``'s rule, refused with the argument named.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refplan import maps
from refplan.errors import InvalidMapError
from refplan.maps import (
    AffinePiece,
    ParallelLayout,
    ParamAffineMap,
    block_gather_map,
    contiguous_split_map,
    parallel_map,
    parallel_maps,
    parallel_pairs,
    replicate,
    replicated_map,
    runs_map,
    segmented_map,
    split,
    sub_param_map,
)

# -- references: the general constructor, piece by piece ------------------------------------------


def _strides(shape: Sequence[int]) -> list[int]:
    out, step = [], 1
    for extent in reversed(shape):
        out.append(step)
        step *= extent
    return out[::-1]


def _with(shape: Sequence[int], axis: int, extent: int) -> list[int]:
    out = list(shape)
    out[axis] = extent
    return out


def ref_contiguous(shape: Sequence[int], sizes: Sequence[int], axis: int) -> ParamAffineMap:
    strides = _strides(shape)
    shards, pieces, start = {}, {}, 0
    for rank, size in enumerate(sizes):
        shard = _with(shape, axis, size)
        shards[rank] = shard
        pieces[rank] = [AffinePiece(shard, start * strides[axis], strides, 0, _strides(shard), [rank])]
        start += size
    return ParamAffineMap(shape, shards, pieces)


def ref_replicate(
    m: ParamAffineMap, copies: int, location_of: Callable[[int, int], int] | None = None
) -> ParamAffineMap:
    ranks = sorted({*m.shard_shapes, *m.pieces_by_rank})

    def name(rank: int, copy: int) -> int:
        return location_of(rank, copy) if location_of else copy * len(ranks) + ranks.index(rank)

    shards, pieces = {}, {}
    for rank in ranks:
        for copy in range(copies):
            new = name(rank, copy)
            if rank in m.shard_shapes:
                shards[new] = list(m.shard_shapes[rank])
            pieces[new] = [
                AffinePiece(p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides,
                            sorted({name(h, c) for h in p.locations if h in ranks for c in range(copies)}), p.scale)
                for p in m.pieces_by_rank.get(rank, ())
            ]
    return ParamAffineMap(m.logical_shape, shards, pieces)


def assert_same(fast: ParamAffineMap, reference: ParamAffineMap) -> None:
    """One content, and (spelled out, independently of the content key) the same locations in the
    same order, the same shard shapes and the same pieces field by field."""
    assert fast.content is reference.content
    assert list(fast.shard_shapes.items()) == list(reference.shard_shapes.items())
    assert list(fast.pieces_by_rank) == list(reference.pieces_by_rank)
    for rank, pieces in reference.pieces_by_rank.items():
        got = fast.pieces_by_rank[rank]
        assert [tuple(p) for p in got] == [tuple(p) for p in pieces]
        assert all(type(p) is AffinePiece for p in got)


def both_orders(build: Callable[[], ParamAffineMap], reference: Callable[[], ParamAffineMap]) -> None:
    """Equal whichever is built first, and when neither is remembered any more. Built first, the
    builder's content also counts its own pieces (``MapContent.pieces``, which the planner's size
    limits read; the count is not part of the content's identity, so only a fresh one shows it)."""
    fast = build()
    assert fast.content.pieces == sum(map(len, fast.pieces_by_rank.values()))
    assert_same(fast, reference())
    del fast  # contents hold no cycles: both are gone now, and so is what the builder remembered
    ref = reference()
    assert_same(build(), ref)


# -- drawn layouts -------------------------------------------------------------------------------

shapes = st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple)


@st.composite
def split_layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int], int]:
    shape = draw(shapes)
    axis = draw(st.integers(0, len(shape) - 1))
    sizes = draw(st.lists(st.integers(0, shape[axis]), min_size=1, max_size=4))
    return shape, sizes, axis


@given(split_layouts(), st.integers(1, 5), st.booleans())
def test_contiguous_replicate_and_parallel_map_equal_the_constructors(
    layout: tuple[tuple[int, ...], list[int], int], copies: int, permuted: bool
) -> None:
    shape, sizes, axis = layout
    both_orders(lambda: contiguous_split_map(shape, sizes, axis), lambda: ref_contiguous(shape, sizes, axis))
    # A location_of that is not the default order: reversed copies, TP rank spread apart.
    width = len(sizes)
    where = (lambda rank, copy: (copies - 1 - copy) * width * 2 + rank) if permuted else None
    both_orders(
        lambda: replicate(contiguous_split_map(shape, sizes, axis), copies, where),
        lambda: ref_replicate(ref_contiguous(shape, sizes, axis), copies, where),
    )
    both_orders(
        lambda: parallel_map(shape, partition_dim=axis, copies=copies, sizes=sizes, location_of=where),
        lambda: ref_replicate(ref_contiguous(shape, sizes, axis), copies, where),
    )
    tp = len(sizes)
    both_orders(
        lambda: parallel_map(shape, tp, axis - len(shape), copies),  # a negative axis counts from the end
        lambda: ref_replicate(ref_contiguous(shape, split(shape[axis], tp), axis), copies),
    )


@st.composite
def batch_layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], ParallelLayout, Any]:
    """A shape and a ``ParallelLayout`` of it: TP 1-3 (one TP rank holds all of its axis, which
    may be empty), 1-4 copies, locations default, spelled out in the default order, or permuted
    and spread apart; with the ``location_of`` the same layout means."""
    shape = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple))
    axis = draw(st.integers(0, len(shape) - 1))
    tp, copies = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["default", "spelled", "named", "named"]))
    if kind == "default":
        return shape, ParallelLayout(tp, axis, copies), None
    spread = [3 * n for n in draw(st.permutations(range(tp * copies)))]
    order = list(range(tp * copies)) if kind == "spelled" else spread
    rows = [order[c * tp:(c + 1) * tp] for c in range(copies)]
    return shape, ParallelLayout(tp, axis, copies, rows), (lambda t, c: rows[c][t])


@given(st.lists(batch_layouts(), min_size=1, max_size=4))
def test_parallel_maps_are_parallel_map_and_the_constructors(items: list[tuple[Any, ParallelLayout, Any]]) -> None:
    """Every map of a batch is the content ``parallel_map`` builds from the same arguments, and
    equal to the reference built piece by piece, whichever is built first; the whole-on-named-
    locations path (an expert under EP x DP) included."""
    batch = [(shape, layout) for shape, layout, _ in items]
    for (shape, layout, where), made in zip(items, parallel_maps(batch), strict=True):
        axis, tp, copies = layout.partition_dim, layout.tp, layout.copies
        assert made.content is parallel_map(shape, tp, axis, copies, location_of=where).content

        def one(shape: tuple[int, ...] = shape, layout: ParallelLayout = layout) -> ParamAffineMap:
            return parallel_maps([(shape, layout)])[0]

        def ref(shape: tuple[int, ...] = shape, axis: int = axis, tp: int = tp, copies: int = copies,
                where: Any = where) -> ParamAffineMap:
            return ref_replicate(ref_contiguous(shape, split(shape[axis], tp), axis), copies, where)

        del made
        both_orders(one, ref)
        got = one()
        assert got.content.slabs == replicate(contiguous_split_map(shape, split(shape[axis], tp), axis), copies,
                                              where).content.slabs


def test_parallel_maps_whole_on_named_locations() -> None:
    """The direct path (all of F on each named location) against the general one, fresh and
    remembered; a location named twice is refused as ``replicate`` refuses it; extents of 0."""
    for shape, names in (((4, 3), [5, 2]), ((7,), [9]), ((2, 5), [4, 0, 8]), ((0, 3), [1, 6]), ((3, 0), [2, 1])):
        layout = ParallelLayout(copies=len(names), locations=[[n] for n in names])
        both_orders(lambda shape=shape, layout=layout: parallel_maps([(shape, layout)])[0],  # type: ignore[misc]
                    lambda shape=shape, names=names: ref_replicate(ref_contiguous(shape, [shape[0]], 0), len(names),
                                                                    lambda _t, c: names[c]))
    with pytest.raises(InvalidMapError, match="location_of maps two"):
        parallel_maps([((4, 3), ParallelLayout(copies=2, locations=[[5], [5]]))])


class _Rows(list):  # type: ignore[type-arg]
    """Locations that note whether the collector ran while they were read."""

    seen: ClassVar[list[bool]] = []

    def __iter__(self) -> Any:
        _Rows.seen.append(gc.isenabled())
        return super().__iter__()


def test_parallel_maps_pause_the_collector_and_restore_it() -> None:
    _Rows.seen.clear()
    assert gc.isenabled()
    layout = ParallelLayout(copies=2, locations=_Rows([[1], [0]]))
    parallel_maps([((4,), layout), ((5,), layout)])
    assert _Rows.seen == [True, False] and gc.isenabled()  # checked when written, then once per call
    gc.disable()
    try:
        parallel_maps([((6,), layout)])
        assert not gc.isenabled()  # a collector the caller disabled stays disabled
    finally:
        gc.enable()
    with pytest.raises(InvalidMapError):
        parallel_maps([((4,), layout), ((4, "x"), layout)])
    assert gc.isenabled()


BATCH_REFUSALS = [
    ([((4,), ParallelLayout(2))], None),
    ([(4,)], "parallel_maps: params[0] is not a (shape, ParallelLayout) pair: (4,)"),
    ([((4,), ParallelLayout()), ((4,), {"tp": 2})],
     "parallel_maps: params[1]'s layout is a dict, not a ParallelLayout"),
    ([((4,), ParallelLayout()), ((4.0,), ParallelLayout())],
     "parallel_maps: params[1] shape[0]: 4.0 is not an integer (a float)"),
    ([((4, 3), ParallelLayout(partition_dim=-3))],
     "parallel_maps: params[0] partition_dim: -3 is not an axis of a 2-d shape"),
]


@pytest.mark.parametrize("items,message", BATCH_REFUSALS)
def test_parallel_maps_refuse_naming_the_item(items: list[Any], message: str | None) -> None:
    if message is None:
        assert len(parallel_maps(items)) == 1
        return
    with pytest.raises(InvalidMapError) as info:
        parallel_maps(items)
    assert str(info.value) == message


@pytest.mark.parametrize("kwargs,message", [
    ({"tp": 0}, "ParallelLayout.tp must be at least 1, got 0"),
    ({"tp": True}, "ParallelLayout.tp: True is not an integer (a bool)"),
    ({"copies": 2.0}, "ParallelLayout.copies: 2.0 is not an integer (a float)"),
    ({"partition_dim": "0"}, "ParallelLayout.partition_dim: '0' is not an integer (a str)"),
    ({"copies": 2, "locations": [[0]]},
     "ParallelLayout.locations: expected 2 copies of 1 locations (copies x tp), got [1]"),
    ({"tp": 2, "locations": [[0]]},
     "ParallelLayout.locations: expected 1 copies of 2 locations (copies x tp), got [1]"),
    ({"locations": [[0.5]]}, "ParallelLayout.locations[0][0]: 0.5 is not an integer (a float)"),
    ({"locations": 3}, "ParallelLayout.locations: expected a sequence of integer sequences, got 3"),
])
def test_parallel_layout_refuses_its_fields_where_written(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidMapError) as info:
        ParallelLayout(**kwargs)
    assert str(info.value) == message


def test_a_layout_altered_after_construction_is_converted_again() -> None:
    """``parallel_maps`` does not trust the check made when the layout was written."""
    layout = ParallelLayout(copies=2)
    object.__setattr__(layout, "copies", 2.0)
    with pytest.raises(InvalidMapError, match=r"parallel_maps: params\[0\]\.copies: 2.0 is not an integer"):
        parallel_maps([((4,), layout)])


def test_parallel_pairs_is_parallel_maps_by_name() -> None:
    """``parallel_pairs`` gives ``plan_transfers``'s dict: each name's (target, source) maps are the
    contents ``parallel_maps`` builds, and a generator's items are made inside the pause."""
    expert = ParallelLayout(copies=2, locations=[[9], [1]])
    split8, tp4dp2 = ParallelLayout(8), ParallelLayout(4, 1, 2)
    made: list[bool] = []

    def items() -> Any:
        for i, (shape, target, source) in enumerate((((64, 16), split8, tp4dp2), ((16, 32), expert, split8),
                                                     ((7,), ParallelLayout(), expert))):
            made.append(gc.isenabled())
            yield f"p{i}", shape, target, source

    pairs = parallel_pairs(items())
    assert made == [False, False, False] and gc.isenabled()
    assert list(pairs) == ["p0", "p1", "p2"]
    flat = parallel_maps([((64, 16), split8), ((64, 16), tp4dp2), ((16, 32), expert), ((16, 32), split8),
                          ((7,), ParallelLayout()), ((7,), expert)])
    assert [m.content for pair in pairs.values() for m in pair] == [m.content for m in flat]
    assert all(a is b for a, b in zip([m.content for pair in pairs.values() for m in pair],
                                      [m.content for m in flat], strict=True))


@pytest.mark.parametrize("items,message", [
    ([("w", (4,), ParallelLayout())], "parallel_pairs: params[0] is not a (name, shape, target ParallelLayout, "
                                      "source ParallelLayout) tuple: ('w', (4,), ParallelLayout(tp=1, "),
    ([(1, (4,), ParallelLayout(), ParallelLayout())], "parallel_pairs: params[0]'s name 1 is not a str"),
    ([("w", (4,), ParallelLayout(), ParallelLayout()), ("v", (4,), ParallelLayout(), ParallelLayout()),
      ("w", (4,), ParallelLayout(), ParallelLayout())], "parallel_pairs: params[2] names 'w', as params[0] did"),
    ([("w", (4,), ParallelLayout(), [1])], "parallel_pairs: params[0]'s source layout is a list, not a ParallelLayout"),
    ([("w", (4, 2.0), ParallelLayout(), ParallelLayout())],
     "parallel_pairs: params[0] shape[1]: 2.0 is not an integer (a float)"),
    ([("w", (4,), ParallelLayout(), ParallelLayout(partition_dim=1))],
     "parallel_pairs: params[0] source partition_dim: 1 is not an axis of a 1-d shape"),
])
def test_parallel_pairs_refuse_naming_the_item(items: list[Any], message: str) -> None:
    with pytest.raises(InvalidMapError) as info:
        parallel_pairs(items)
    assert str(info.value).startswith(message), str(info.value)  # a long item is abbreviated (reprlib)
    assert gc.isenabled()


def test_a_batch_build_is_forgotten_with_its_maps() -> None:
    """One entry per new content files it under both keys (a TP split) or under its content key
    alone (whole copies, whose content key is as cheap to make), and every entry goes when its
    maps do."""
    gc.collect()
    before = len(maps._BUILT), len(maps._CONTENTS)
    whole = ParallelLayout(copies=2, locations=[[3], [1]])
    split = ParallelLayout(2, 0, 2, [[3, 0], [1, 2]])
    made = parallel_maps([((131 + i, 3), whole) for i in range(20)])
    assert len(maps._BUILT) == before[0] and len(maps._CONTENTS) == before[1] + 20
    made += parallel_maps([((131 + i, 3), split) for i in range(20)])
    assert len(maps._BUILT) == before[0] + 20 and len(maps._CONTENTS) == before[1] + 40
    again = parallel_maps([((131, 3), whole), ((131, 3), split)])
    assert again[0].content is made[0].content and again[1].content is made[20].content
    del made, again
    assert (len(maps._BUILT), len(maps._CONTENTS)) == before


@given(shapes, st.integers(0, 5), st.sampled_from([1.0, 0.5, -2.0]), st.integers(1, 3))
def test_replicated_map_equals_the_constructor(shape: tuple[int, ...], degree: int, scale: float, copies: int) -> None:
    def reference() -> ParamAffineMap:
        strides = _strides(shape)
        piece = AffinePiece(shape, 0, strides, 0, strides, list(range(degree)), scale)
        return ParamAffineMap(shape, dict.fromkeys(range(degree), shape), {r: [piece] for r in range(degree)})

    both_orders(lambda: replicated_map(shape, degree, scale), reference)
    both_orders(
        lambda: replicate(replicated_map(shape, degree, scale), copies), lambda: ref_replicate(reference(), copies)
    )


@given(st.data())
def test_sub_param_segmented_and_block_gather_maps_equal_the_constructors(data: st.DataObject) -> None:
    degree = data.draw(st.integers(1, 3), label="degree")
    widths = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=degree, max_size=degree), min_size=1, max_size=3))
    sizes = [sum(w) for w in widths]
    width = data.draw(st.integers(1, 3), label="width")
    shape = (sum(sizes), width)

    def sub_reference() -> ParamAffineMap:
        strides = _strides(shape)
        shards = {r: [sum(w[r] for w in widths), width] for r in range(degree)}
        pieces: dict[int, list[AffinePiece]] = {r: [] for r in range(degree)}
        filled, start = [0] * degree, 0
        for size, row in zip(sizes, widths):
            at = start
            for r in range(degree):
                pieces[r].append(AffinePiece([row[r], width], at * strides[0], strides, filled[r] * width,
                                             _strides(shards[r]), [r]))
                at += row[r]
                filled[r] += row[r]
            start += size
        return ParamAffineMap(shape, shards, pieces)

    both_orders(lambda: sub_param_map(shape, sizes, widths, 0), sub_reference)

    # The same widths as split segments, with a replicated segment drawn in between.
    extra = data.draw(st.integers(1, 3), label="replicated rows")
    at = data.draw(st.integers(0, len(sizes)), label="replicated position")
    segments = [(s, False) for s in sizes]
    segments.insert(at, (extra, True))
    seg_shape = (sum(sizes) + extra, width)

    def seg_reference() -> ParamAffineMap:
        strides = _strides(seg_shape)
        rows = [None if replicated else widths[sum(1 for s in segments[:i] if not s[1])]
                for i, (_, replicated) in enumerate(segments)]
        shards = {r: [sum(s if w is None else w[r] for (s, _), w in zip(segments, rows)), width] for r in range(degree)}
        pieces: dict[int, list[AffinePiece]] = {r: [] for r in range(degree)}
        filled, start = [0] * degree, 0
        for (size, _), row in zip(segments, rows):
            for r in range(degree):
                extent = size if row is None else row[r]
                src = start if row is None else start + sum(row[:r])
                holders = list(range(degree)) if row is None else [r]
                pieces[r].append(AffinePiece([extent, width], src * strides[0], strides, filled[r] * width,
                                             _strides(shards[r]), holders))
                filled[r] += extent
            start += size
        return ParamAffineMap(seg_shape, shards, pieces)

    both_orders(lambda: segmented_map(seg_shape, segments, 0, degree, widths), seg_reference)

    # Blocks dealt to locations (drawn, possibly out of order), packed in the listed order.
    blocks = data.draw(st.integers(1, 6), label="blocks")
    owner = data.draw(st.lists(st.integers(0, degree - 1), min_size=blocks, max_size=blocks), label="owners")
    ids = {r: data.draw(st.permutations([b for b in range(blocks) if owner[b] == r])) for r in range(degree)}
    block_shape = (width, blocks * 2)

    def block_reference() -> ParamAffineMap:
        strides = _strides(block_shape)
        shards, pieces = {}, {}
        for r, listed in ids.items():
            shards[r] = [width, len(listed) * 2]
            pieces[r] = [AffinePiece([width, 2], b * 2 * strides[1], strides, i * 2, _strides(shards[r]), [r])
                         for i, b in enumerate(listed)]  # one piece per block: the merged runs are equal as F
        return ParamAffineMap(block_shape, shards, pieces)

    built = block_gather_map(block_shape, ids, 2, 1)
    # Runs of consecutive ids are one piece in the builder, one per block in the reference: compare
    # what each location holds element by element instead (small shapes, a test only).
    assert _cells(built) == _cells(block_reference())
    assert list(built.shard_shapes.items()) == [(r, (width, len(ids[r]) * 2)) for r in ids]


runs = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 3)), min_size=1, max_size=3).map(tuple)


@given(st.data())
def test_runs_map_equals_the_constructor(data: st.DataObject) -> None:
    """Placement-described layouts (DTensor, DCP, Megatron): the product of one run per axis is a
    piece, identical holdings are replicas. Drawn holdings, repeated ones included."""
    ndim = data.draw(st.integers(1, 2), label="ndim")
    shape = tuple(data.draw(st.lists(st.integers(1, 8), min_size=ndim, max_size=ndim), label="shape"))
    kinds = data.draw(st.lists(st.tuples(*[runs] * ndim), min_size=1, max_size=3), label="holdings")
    picks = data.draw(st.lists(st.integers(0, len(kinds) - 1), min_size=1, max_size=5), label="which")
    locations = data.draw(st.permutations(range(10)), label="locations")[:len(picks)]
    holdings = {loc: kinds[k] for loc, k in zip(locations, picks)}
    if data.draw(st.booleans(), label="an empty location"):  # holds nothing: a location, no pieces
        empty = {10: ((),) * ndim}
        # First or last: the locations after an empty one are still read.
        holdings = {**empty, **holdings} if data.draw(st.booleans(), label="empty first") else {**holdings, **empty}

    def reference() -> ParamAffineMap:
        strides = _strides(shape)
        shards, pieces = {}, {}
        for loc, holding in holdings.items():
            shard = [sum(n for _, n in axis_runs) for axis_runs in holding]
            shards[loc] = shard
            pieces[loc] = []
            if 0 in shard:
                continue
            local = _strides(shard)
            starts = [[sum(n for _, n in axis_runs[:i]) for i in range(len(axis_runs))] for axis_runs in holding]
            replicas = [other for other, h in holdings.items() if h == holding]
            for choice in itertools.product(*(range(len(axis_runs)) for axis_runs in holding)):
                pieces[loc].append(AffinePiece(
                    [holding[a][i][1] for a, i in enumerate(choice)],
                    sum(holding[a][i][0] * strides[a] for a, i in enumerate(choice)), strides,
                    sum(starts[a][i] * local[a] for a, i in enumerate(choice)), local, replicas,
                ))
        return ParamAffineMap(shape, shards, pieces)

    both_orders(lambda: runs_map(shape, holdings), reference)
    as_lists = {np.int64(loc): [[list(r) for r in axis_runs] for axis_runs in h] for loc, h in holdings.items()}
    assert runs_map(list(shape), as_lists).content is reference().content


def _cells(m: ParamAffineMap) -> dict[int, list[int]]:
    """For every location, the F element (row-major index) at each shard element, in shard order."""
    out = {}
    for rank, shard in m.shard_shapes.items():
        cells = [-1] * int(np.prod(shard))
        for p in m.pieces_by_rank[rank]:
            for index in np.ndindex(*p.shape):
                src = p.source_offset + sum(i * s for i, s in zip(index, p.source_strides))
                dst = p.dest_offset + sum(i * s for i, s in zip(index, p.dest_strides))
                cells[dst] = src
        out[rank] = cells
    return out


# -- what the fast paths share, and what they must not keep ----------------------------------------


def test_replicate_shares_one_piece_tuple_and_one_holder_set_per_location() -> None:
    """Linear in copies by construction: k copies of a TP map add k dict entries, not k pieces
    with k holders each (which was quadratic in memory and time)."""
    tp = contiguous_split_map((64, 8), split(64, 4), 0)
    m = replicate(tp, 256)
    assert len(m.pieces_by_rank) == 1024
    assert len({id(ps) for ps in m.pieces_by_rank.values()}) == 4
    holder_sets = {id(p.locations) for ps in m.pieces_by_rank.values() for p in ps}
    assert len(holder_sets) == 4
    assert m.pieces_by_rank[4 * 255 + 3][0].locations == frozenset(4 * c + 3 for c in range(256))


def test_a_remembered_build_lives_only_as_long_as_its_maps() -> None:
    gc.collect()
    before = len(maps._BUILT), len(maps._CONTENTS)
    made = [contiguous_split_map((97 + i, 3), [50, 47 + i], 0) for i in range(20)]
    again = [replicate(m, 3) for m in made]
    assert len(maps._BUILT) == before[0] + 40 and len(maps._CONTENTS) == before[1] + 40
    assert replicate(made[0], 3) is not again[0] and replicate(made[0], 3).content is again[0].content
    del made, again
    gc.collect()
    assert (len(maps._BUILT), len(maps._CONTENTS)) == before


def test_a_content_that_dies_after_the_module_globals_reads_none_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """At interpreter shutdown a module's globals are set to ``None`` before every object is
    gone; a content dying then ran ``_forget``, which looked ``_BUILT`` up and printed
    "Exception ignored in: <function _forget ...>" per content at exit (seen after a hypothesis
    run that had built maps). Set the global to ``None`` as shutdown does and let a built
    content die: its entries still go, and nothing is raised in the callback."""
    raised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", raised.append)
    gc.collect()
    before = len(maps._BUILT), len(maps._CONTENTS)
    table = maps._BUILT
    made = replicate(contiguous_split_map((89, 5), [40, 49], 0), 3)
    assert len(table) == before[0] + 2
    monkeypatch.setattr(maps, "_BUILT", None)
    del made
    gc.collect()
    assert raised == []
    assert (len(table), len(maps._CONTENTS)) == before


def test_every_builder_hands_out_an_immutable_map_of_the_exact_classes() -> None:
    """The builders fill a new content (and map) in as a private open class and then set its
    ``__class__`` (``maps._new_content``): what leaves them is exactly a ``ParamAffineMap`` holding
    exactly a ``MapContent``, which refuses assignment and deletion like the constructor's, and
    which the planner's and the oracle's exact-type checks accept as shared."""
    whole = ParallelLayout(copies=3, locations=[[4], [9], [11]])
    experts = [ParallelLayout(copies=c, locations=[[7 * k + 1] for k in range(c)]) for c in (1, 2)]
    built = [
        *parallel_maps([((40 + i, 6), layout) for i, layout in enumerate((whole, *experts, ParallelLayout(2, 1, 2)))]),
        *parallel_pairs([("w", (33, 5), experts[0], experts[1])])["w"],
        replicated_map((17, 3), 4), replicate(contiguous_split_map((19, 4), [9, 10], 0), 2),
        parallel_map((21, 8), 4, 1, 2),
        ParamAffineMap((5,), {0: (5,)}, {0: [AffinePiece((5,), 0, (1,), 0, (1,), [0])]}),
    ]
    for m in built:
        assert type(m) is ParamAffineMap and type(m.content) is maps.MapContent
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.content.slabs = None
        with pytest.raises(dataclasses.FrozenInstanceError):
            del m.content.logical_shape
        with pytest.raises(dataclasses.FrozenInstanceError):
            m._content = built[0].content
        again = ParamAffineMap(m.logical_shape, dict(m.shard_shapes), dict(m.pieces_by_rank))
        assert again.content is m.content
    assert built[1].shard_shapes == {1: (41, 6)} and list(built[0].pieces_by_rank) == [4, 9, 11]


def test_the_content_key_tells_shard_locations_apart() -> None:
    """The key keeps the shard shapes' locations, not only their values in order: two maps whose
    shard shapes are equal value for value but held at other locations are two contents."""
    pieces = {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])], 1: [AffinePiece((2,), 2, (1,), 0, (1,), [1])]}
    first = ParamAffineMap((4,), {0: (2,), 1: (2,)}, pieces)
    other = ParamAffineMap((4,), {0: (2,), 5: (2,)}, pieces)
    assert first.content is not other.content
    assert list(other.shard_shapes) == [0, 5] and list(first.shard_shapes) == [0, 1]


def test_numpy_arguments_build_the_same_content_as_ints() -> None:
    ints = contiguous_split_map((12, 4), [5, 7], 1 - 1)
    numpy = contiguous_split_map(np.array([12, 4]), [np.int64(5), np.int32(7)], np.int8(0))
    assert numpy.content is ints.content
    assert parallel_map((12, 4), np.int64(2), copies=np.uint8(3)).content is replicate(
        contiguous_split_map((12, 4), [6, 6], 0), 3).content
    assert replicate(ints, 2, lambda r, c: np.int64(10 * c + r)).pieces_by_rank.keys() == {0, 10, 1, 11}


def test_replicate_of_a_map_with_unknown_pieces_goes_through_the_constructor() -> None:
    """A subclass piece is never trusted as converted: its copies are made by the constructor,
    which gives exact pieces, hence the plain map's content."""

    class Tagged(AffinePiece):
        pass

    plain = contiguous_split_map((6, 2), [3, 3], 0)
    odd = ParamAffineMap((6, 2), dict(plain.shard_shapes),
                         {r: [Tagged(*p) for p in ps] for r, ps in plain.pieces_by_rank.items()})
    assert type(odd.content) is not type(plain.content)
    assert replicate(odd, 2).content is replicate(plain, 2).content


# -- the integer rule, argument by argument --------------------------------------------------------


class _Zero:
    """An integer 0 by ``__index__`` that a dict does not merge with the int 0 (its own hash)."""

    def __index__(self) -> int:
        return 0


REFUSALS: list[tuple[Callable[[], Any], str]] = [
    (lambda: contiguous_split_map((4, 2), [2, True], 0), "per_rank_sizes[1]: True is not an integer (a bool)"),
    (lambda: contiguous_split_map((4, 2), [2.0, 2], 0), "per_rank_sizes[0]: 2.0 is not an integer (a float)"),
    (lambda: contiguous_split_map((4, 2), [2, 2], True), "partition_dim: True is not an integer (a bool)"),
    (lambda: contiguous_split_map((4, 2), [2, 2], 2), "partition_dim: 2 is not an axis of a 2-d shape"),
    (lambda: contiguous_split_map((4, 2), [2, 2], -3), "partition_dim: -3 is not an axis of a 2-d shape"),
    (lambda: contiguous_split_map((4, "2"), [2, 2], 0), "shape[1]: '2' is not an integer (a str)"),
    (lambda: replicated_map((4,), 2.0), "tp_degree: 2.0 is not an integer (a float)"),
    (lambda: replicated_map((4,), 2, 0), "a zero scale is not invertible, so F could not be rebuilt from the shard"),
    (lambda: replicated_map((4,), 2, True), "AffinePiece.scale: expected a number, got True"),
    (lambda: replicate(contiguous_split_map((4,), [2, 2], 0), True),
     "replicate: copies: True is not an integer (a bool)"),
    (lambda: replicate(contiguous_split_map((4,), [2, 2], 0), 2.0),
     "replicate: copies: 2.0 is not an integer (a float)"),
    (lambda: replicate(contiguous_split_map((4,), [2, 2], 0), 2, lambda r, c: r + 0.5),
     "replicate: location_of(0, 0): 0.5 is not an integer (a float)"),
    (lambda: replicate(contiguous_split_map((4,), [2, 2], 0), 2, lambda r, c: 3 if r else 2 * c + 1),
     "replicate: location_of maps two (location, copy) pairs to 3"),
    (lambda: parallel_map((4,), 0), "parallel_map: tp must be at least 1, got 0"),
    (lambda: parallel_map((4,), 2.5), "tp: 2.5 is not an integer (a float)"),
    (lambda: parallel_map((4,), copies=0), "parallel_map: copies must be at least 1, got 0"),
    (lambda: parallel_map((4,), sizes=[1, np.float32(3)]), "sizes[1]: np.float32(3.0) is not an integer (a float32)"),
    (lambda: sub_param_map((4,), [2, 2.0], [[1, 1], [1, 1]], 0), "sub_dim_sizes[1]: 2.0 is not an integer (a float)"),
    (lambda: sub_param_map((4,), [2, 2], [[1, 1], [1, False]], 0),
     "shard_widths[1][1]: False is not an integer (a bool)"),
    (lambda: sub_param_map((4,), [2, 2], [[1, 1]], 0),
     "sub_param_map: 1 rows of shard_widths for 2 sub-parameters (one each, at least one)"),
    (lambda: sub_param_map((4,), [2, 2], [[1, 1], [2]], 0),
     "sub_param_map: shard_widths[1] has 1 widths, shard_widths[0] 2"),
    (lambda: segmented_map((4,), [(4.0, False)], 0, 2, [[2, 2]]), "segments[0][0]: 4.0 is not an integer (a float)"),
    (lambda: segmented_map((4,), [(4, False)], 0, 2, [[2, 2.0]]),
     "split_widths[0][1]: 2.0 is not an integer (a float)"),
    (lambda: segmented_map((4,), [(4, True)], 0, "2", []), "tp_degree: '2' is not an integer (a str)"),
    (lambda: block_gather_map((4, 2), {0: [0, 1.0]}, 1, 0), "block_ids_by_rank[0][1]: 1.0 is not an integer (a float)"),
    (lambda: block_gather_map((4, 2), {0.0: [0]}, 1, 0), "block_ids_by_rank key: 0.0 is not an integer (a float)"),
    (lambda: block_gather_map((4, 2), {0: [0]}, True, 0), "block_size: True is not an integer (a bool)"),
    (lambda: runs_map((4,), {0: [[(0, 2.0)]]}), "holdings[0][0][0][1]: 2.0 is not an integer (a float)"),
    (lambda: runs_map((4,), {0: [[(True, 2)]]}), "holdings[0][0][0][0]: True is not an integer (a bool)"),
    (lambda: runs_map((4,), {0: [[(0, 2, 1)]]}), "holdings[0][0][0]: expected (start, length), got (0, 2, 1)"),
    (lambda: runs_map((4,), {0: [[(0, 2)], [(0, 1)]]}), "holdings[0]: runs for 2 axes of a 1-d tensor"),
    (lambda: runs_map((4,), {0: [5]}), "holdings[0][0]: expected a sequence of (start, length), got 5"),
    (lambda: runs_map((4,), {"0": [[(0, 4)]]}), "holdings key: '0' is not an integer (a str)"),
    (lambda: block_gather_map((4, 2), {0: [0], _Zero(): [1]}, 1, 0),
     "ParamAffineMap: two keys name one location (e.g. 1 and numpy's 1)"),
]


@pytest.mark.parametrize("make,message", REFUSALS, ids=[m for _, m in REFUSALS])
def test_builders_refuse_what_is_not_an_integer_naming_the_argument(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(InvalidMapError) as info:
        make()
    assert str(info.value) == message


def test_parallel_map_defaults_and_argument_names() -> None:
    """One TP rank and one copy by default: the whole of F at location 0; a bad argument is
    refused naming it."""
    assert parallel_map((4, 3)).content is contiguous_split_map((4, 3), [4], 0).content
    assert parallel_map((4, 3), 2).content is contiguous_split_map((4, 3), [2, 2], 0).content
    assert parallel_map((4, 3), copies=2).content is replicate(contiguous_split_map((4, 3), [4], 0), 2).content
    # The two default-location cases built without a widening pass: one copy of a split, and one
    # whole shard on every location; each equal to its reference built first or second, fresh
    # (piece counts, slab facts) or remembered. A part of F on one location is not the whole.
    for shape, sizes, axis, copies in (((4, 3), [1, 3], 1, 1), ((4, 3), [3], 1, 3), ((4, 3), [4], 0, 5),
                                       ((5,), [2], 0, 2), ((6, 2), [0, 6], 0, 1)):
        def fast(shape: tuple[int, ...] = shape, sizes: list[int] = sizes, axis: int = axis,
                 copies: int = copies) -> ParamAffineMap:
            return parallel_map(shape, partition_dim=axis, copies=copies, sizes=sizes)

        def slow(shape: tuple[int, ...] = shape, sizes: list[int] = sizes, axis: int = axis,
                 copies: int = copies) -> ParamAffineMap:
            return ref_replicate(ref_contiguous(shape, sizes, axis), copies)

        both_orders(fast, slow)
        assert fast().content.slabs == replicate(contiguous_split_map(shape, sizes, axis), copies).content.slabs
    assert parallel_map((4, 3), copies=3).content is replicated_map((4, 3), 3).content
    for kwargs, name in (({"shape": (4, "x")}, "shape"), ({"shape": (4, 3), "partition_dim": 2}, "partition_dim"),
                         ({"shape": (4, 3), "copies": 1.5}, "copies"), ({"shape": (4, 3), "tp": "2"}, "tp")):
        with pytest.raises(InvalidMapError, match=name):
            parallel_map(**kwargs)  # type: ignore[arg-type]


class _One:
    """A key that is the integer 1 by ``__index__`` without being equal to 1 as a dict key."""

    def __index__(self) -> int:
        return 1


def test_runs_map_refuses_two_keys_for_one_location() -> None:
    with pytest.raises(InvalidMapError, match="two keys name one location"):
        runs_map((4,), {1: [[(0, 2)]], _One(): [[(2, 2)]]})
    with pytest.raises(InvalidMapError, match="logical_shape"):
        runs_map((4, "x"), {0: [[(0, 4)], [(0, 1)]]})
