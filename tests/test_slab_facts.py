"""The slab structure a builder records on a map's content is the one the planner would work out
from its pieces.

``planner._slab_side`` trusts ``MapContent.slabs`` once it is known, and the builders
(``contiguous_split_map``, ``replicated_map``, ``replicate``, ``parallel_map``) record it as they
build, from their arguments, without looking at the pieces. A wrong record would send a map the
general path refuses (or reads differently) down the slab path, so every record is checked here
against ``_slab_structure`` recomputed from the pieces, on drawn builder calls: valid splits,
empty parts, sizes that do not add up, scales, renamed replicas, and replicas of replicas.
"""

from __future__ import annotations

import copy
import pickle
from itertools import pairwise
from typing import Any

import pytest
from conftest import Reached, examples
from hypothesis import given
from hypothesis import strategies as st

from refplan import plan_transfers, verify_plans
from refplan.box import row_major_strides
from refplan.maps import (
    UNKNOWN,
    AffinePiece,
    MapContent,
    ParallelLayout,
    ParamAffineMap,
    contiguous_split_map,
    parallel_map,
    parallel_maps,
    replicate,
    replicated_map,
)
from refplan.planner import _slab_structure


def _recomputed(content: MapContent) -> Any:
    logical = content.logical_shape
    return _slab_structure(content, logical, row_major_strides(logical))


def _shapes(min_extent: int = 1) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(min_extent, 6), min_size=1, max_size=3).map(tuple)


@st.composite
def _sizes(draw: st.DrawFn, extent: int) -> list[int]:
    """Mostly a partition of ``extent`` into positive parts; sometimes with an empty part, or not
    adding up (then the map is no slab map and its record must say so)."""
    kind = draw(st.sampled_from(["partition", "partition", "partition", "empty", "any"]))
    if kind == "any":
        return draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
    cuts = sorted(draw(st.sets(st.integers(1, extent - 1), max_size=3))) if extent > 1 else []
    bounds = [0, *cuts, extent]
    sizes = [b - a for a, b in pairwise(bounds)]
    if kind == "empty":
        sizes.insert(draw(st.integers(0, len(sizes))), 0)
    return sizes


@st.composite
def _built(draw: st.DrawFn) -> tuple[str, ParamAffineMap]:
    shape = draw(_shapes())
    kind = draw(st.sampled_from(["split", "whole", "parallel", "batch"]))
    if kind == "whole":
        m = replicated_map(shape, draw(st.integers(0, 4)), draw(st.sampled_from([1.0, 1.0, 2.0])))
    elif kind == "batch":  # parallel_maps: the default split, default or named locations (whole on each)
        tp, copies = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        names = [5 * n for n in draw(st.permutations(range(tp * copies)))]
        rows = [names[c * tp:(c + 1) * tp] for c in range(copies)] if draw(st.booleans()) else None
        m = parallel_maps([(shape, ParallelLayout(tp, draw(st.integers(0, len(shape) - 1)), copies, rows))])[0]
    else:
        axis = draw(st.integers(0, len(shape) - 1))
        sizes = draw(_sizes(shape[axis]))
        if kind == "split":
            m = contiguous_split_map(shape, sizes, axis)
        else:
            copies = draw(st.integers(1, 3))
            names = draw(st.permutations(range(len(sizes) * copies)))
            renamed = draw(st.booleans())
            m = parallel_map(shape, partition_dim=axis, copies=copies, sizes=sizes,
                             location_of=(lambda t, c: names[c * len(sizes) + t]) if renamed else None)
    for _ in range(draw(st.integers(0, 2))):  # replicas of replicas
        copies = draw(st.integers(1, 3))
        width = len(m.ranks)
        if draw(st.booleans()):
            # Spread out, so that a holder set's own iteration order is not already sorted.
            spread = draw(st.sampled_from([1, 13, 1000]))
            names = [n * spread for n in draw(st.permutations(range(width * copies)))]
            index = {r: i for i, r in enumerate(m.ranks)}
            m = replicate(m, copies, lambda loc, c, names=names, w=width, at=index: names[c * w + at[loc]])
        else:
            m = replicate(m, copies)
        kind += "+replicate"
    return kind, m


def test_every_builder_records_the_structure_of_its_pieces() -> None:
    reached = Reached()

    @given(_built())
    def check(built: tuple[str, ParamAffineMap]) -> None:
        kind, m = built
        content = m.content
        assert type(content) is MapContent
        assert content.slabs is not UNKNOWN  # every builder here says what it built
        assert content.slabs == _recomputed(content)
        reached.hit("slab map" if content.slabs is not None else "not a slab map")
        if content.slabs is not None and "+replicate" in kind:
            reached.hit("replicated slab map")

    check()
    reached.at_least("slab map", max(1, examples() // 3))
    reached.at_least("replicated slab map", max(1, examples() // 10))
    reached.at_least("not a slab map", 1)


def test_a_constructed_map_is_recorded_by_the_planner_as_its_builder_would() -> None:
    """A map made by the constructor records nothing; planning it records the structure worked
    out from its pieces, which is the record its builder makes (they share one content)."""
    shape = (7, 5)  # no other live map has this content: it is made here, by the constructor
    pieces = {0: [((3, 5), 0, (5, 1), 0, (5, 1), [0])], 1: [((4, 5), 15, (5, 1), 0, (5, 1), [1])]}
    made = ParamAffineMap(shape, {0: (3, 5), 1: (4, 5)}, {r: [AffinePiece(*p) for p in ps] for r, ps in pieces.items()})
    assert made.content.slabs is UNKNOWN
    target = replicated_map(shape, 2)
    plans = plan_transfers({"w": (target, made)})
    assert verify_plans({"w": (target, made)}, plans).status == "ok"
    assert made.content.slabs == (0, ((0, 3, (0,), (5, 1)), (3, 4, (1,), (5, 1)))) == _recomputed(made.content)
    assert contiguous_split_map(shape, [3, 4], 0).content is made.content


@pytest.mark.parametrize("sizes", [[2, 2], [4], [1, 0, 3], [1, 1], [5, 1]])
def test_split_records(sizes: list[int]) -> None:
    """A split is a slab map exactly when its parts are non-empty and add up to the extent."""
    content = contiguous_split_map((4, 3), sizes, 0).content
    want = None
    if sizes == [2, 2]:
        want = (0, ((0, 2, (0,), (3, 1)), (2, 2, (1,), (3, 1))))
    elif sizes == [4]:
        want = (None, ((0, 4, (0,), (3, 1)),))
    assert content.slabs == want == _recomputed(content)


def test_replica_records_list_holders_sorted() -> None:
    """Renamed replicas whose holder sets do not iterate in order (0, 26, 52 | 65, 13, 39): the
    record lists each box's holders sorted, as the planner's requests name candidates."""
    names = [0, 13, 26, 39, 52, 65]
    for m in (replicate(contiguous_split_map((4, 3), [2, 2], 0), 3, lambda loc, c: names[c * 2 + loc]),
              parallel_map((4, 3), 2, 0, 3, location_of=lambda t, c: names[c * 2 + t])):
        assert m.content.slabs == (0, ((0, 2, (0, 26, 52), (3, 1)), (2, 2, (13, 39, 65), (3, 1))))
        assert m.content.slabs == _recomputed(m.content)


def test_unknown_is_one_object_through_copies() -> None:
    """``UNKNOWN`` pickles and copies as itself, so a content's ``slabs`` is never a stray
    instance that a builder would take for a record."""
    assert pickle.loads(pickle.dumps(UNKNOWN)) is UNKNOWN
    assert copy.deepcopy(UNKNOWN) is UNKNOWN and repr(UNKNOWN) == "UNKNOWN"


@pytest.mark.parametrize("case", ["columns", "pair-holders", "third-axis", "whole"])
def test_structure_worked_out_from_pieces(case: str) -> None:
    """``_slab_structure`` itself (the planner's own reading of a map nobody recorded), on maps
    a builder would record, written out: a split along a later axis of a non-square F, a box
    held by two locations whose set does not iterate in order ({8, 1}), a split along axis 2
    (shard strides of its own), and all of F."""
    if case == "columns":
        m = contiguous_split_map((4, 6), [2, 4], 1)
        want: Any = (1, ((0, 2, (0,), (2, 1)), (2, 4, (1,), (4, 1))))
    elif case == "pair-holders":
        m = replicate(contiguous_split_map((4, 3), [1, 3], 0), 2, lambda loc, c: [[1, 8], [0, 5]][loc][c])
        want = (0, ((0, 1, (1, 8), (3, 1)), (1, 3, (0, 5), (3, 1))))
    elif case == "third-axis":
        m = contiguous_split_map((2, 3, 4), [1, 3], 2)
        want = (2, ((0, 1, (0,), (3, 1, 1)), (1, 3, (1,), (9, 3, 1))))
    else:
        m = replicated_map((5, 2), 3)
        want = (None, ((0, 5, (0, 1, 2), (2, 1)),))
    assert _recomputed(m.content) == want == m.content.slabs


def test_whole_records_by_count_of_holders() -> None:
    """All of F held by no location is no slab map; by one or more locations it is one box."""
    assert replicated_map((3, 2), 0).content.slabs is None is _recomputed(replicated_map((3, 2), 0).content)
    for degree in (1, 2):
        content = replicated_map((3, 2), degree).content
        assert content.slabs == (None, ((0, 3, tuple(range(degree)), (2, 1)),)) == _recomputed(content)
    assert replicated_map((3, 2), 2, 2.0).content.slabs is None  # a scale: not a plain copy
