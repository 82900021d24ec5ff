"""The array fast paths decide exactly what the per-piece rule paths decide.

``frames._common_frames`` (planner) decodes all pieces of a location at once and hands anything
unusual to the per-piece loop, which decides and explains. A fast path that accepted one piece
too many would skip a rule; one that built a different frame would plan the wrong bytes. So the
fast paths are taken at any size and then switched off (``limits.fast_paths``) and the outcome
compared: the same frames, the same layout, or the same error class and message. The oracle's
map validation (``oracle.layout``) has no array path of its own any more; it is held to the same
comparison so that one added later is covered from the start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from refplan.box import Box, WorkCounter, decode_row_major, overlapping_pairs, row_major_strides, volume
from refplan.errors import AffineTransferError
from refplan.frames import NormalizedMap, _decode, normalize
from refplan.limits import fast_paths
from refplan.maps import AffinePiece, ParamAffineMap, contiguous_split_map, replicate
from refplan.oracle.layout import validate_map
from refplan.regions import Region, _small_intersections, intersections, source_regions
from refplan.strategies import map_pairs, param_maps


def _outcome(run: Callable[[], Any]) -> Any:
    try:
        return ("ok", run())
    except AffineTransferError as exc:
        return (type(exc).__name__, str(exc))


_CHANGES: list[Callable[[AffinePiece, ParamAffineMap, int], dict[str, Any]]] = [
    lambda p, m, loc: {},
    lambda p, m, loc: {"source_offset": p.source_offset + 1},
    lambda p, m, loc: {"source_offset": p.source_offset - 1},
    lambda p, m, loc: {"dest_offset": p.dest_offset + 1},
    lambda p, m, loc: {"dest_offset": -1},
    lambda p, m, loc: {"dest_offset": 2**70},
    lambda p, m, loc: {"shape": (*p.shape[:-1], p.shape[-1] + 1)} if p.shape else {},
    lambda p, m, loc: {"shape": (*p.shape[:-1], 0)} if p.shape else {},
    lambda p, m, loc: {"shape": (*p.shape[:-1], 2**63)} if p.shape else {},
    lambda p, m, loc: {"source_strides": p.source_strides[::-1]},
    lambda p, m, loc: {"dest_strides": tuple(s + 1 for s in p.dest_strides)},
    lambda p, m, loc: {"locations": frozenset()},
    lambda p, m, loc: {"locations": p.locations | {99}},
    lambda p, m, loc: {"scale": 2.0},
    # One whole tensor further: the same coordinates modulo the shape, but not a coordinate.
    lambda p, m, loc: {"source_offset": p.source_offset + volume(m.logical_shape)},
    lambda p, m, loc: {"dest_offset": p.dest_offset + volume(m.shard_shapes[loc])},
]


def _mutated(m: ParamAffineMap, change: int, pick: int) -> ParamAffineMap:
    """``m`` with one field of one piece changed by ``_CHANGES[change]`` (index 0: unchanged)."""
    locations = [loc for loc in m.ranks if m.pieces_by_rank.get(loc)]
    if not locations:
        return m
    loc = locations[pick % len(locations)]
    pieces = list(m.pieces_by_rank[loc])
    i = pick % len(pieces)
    piece = pieces[i]
    fields = dict(zip(AffinePiece.FIELDS, piece))
    fields.update(_CHANGES[change](piece, m, loc))
    pieces[i] = AffinePiece(**fields)
    return ParamAffineMap(m.logical_shape, dict(m.shard_shapes), {**m.pieces_by_rank, loc: pieces})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(param_maps(max_holders=2), st.integers(0, len(_CHANGES) - 1), st.integers(0, 1000))
def test_planner_frames_are_the_same_without_the_array_path(m: ParamAffineMap, change: int, pick: int) -> None:
    m = _mutated(m, change, pick)
    with fast_paths(True):
        fast = _outcome(lambda: normalize(m, "source", "w"))
    with fast_paths(False):
        slow = _outcome(lambda: normalize(m, "source", "w"))
    assert fast == slow


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(param_maps(max_holders=2), st.integers(0, len(_CHANGES) - 1), st.integers(0, 1000))
def test_oracle_layouts_are_the_same_without_the_array_path(m: ParamAffineMap, change: int, pick: int) -> None:
    m = _mutated(m, change, pick)
    with fast_paths(True):
        fast = _outcome(lambda: validate_map(m, "source"))
    with fast_paths(False):
        slow = _outcome(lambda: validate_map(m, "source"))
    assert fast == slow


@pytest.mark.parametrize("change", range(1, len(_CHANGES)))
def test_every_change_to_a_gathered_map_is_refused_the_same_way(change: int) -> None:
    """A replicated two-way split: one mutated piece must be refused by both paths, identically
    (index 0, the unchanged map, is the only valid one)."""
    m = replicate(contiguous_split_map((8, 6), [4, 4], 0), 2)
    bad = _mutated(m, change, 1)
    with fast_paths(True):
        fast = _outcome(lambda: normalize(bad, "source", "w"))
    with fast_paths(False):
        slow = _outcome(lambda: normalize(bad, "source", "w"))
    assert fast == slow
    assert fast[0] != "ok", (change, fast)
    with fast_paths(True):
        fast = _outcome(lambda: validate_map(bad, "source"))
    with fast_paths(False):
        slow = _outcome(lambda: validate_map(bad, "source"))
    assert fast == slow
    assert fast[0] != "ok", (change, fast)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 9), max_size=4), st.data())
def test_the_common_frame_decode_is_the_row_major_decode(shape: list[int], data: st.DataObject) -> None:
    """``frames._decode`` (offsets already range-checked, strides at hand) against the rule's
    ``decode_row_major``, at every shape up to 4 axes and offsets over the whole range."""
    offset = data.draw(st.integers(0, volume(shape) - 1))
    assert _decode(offset, row_major_strides(shape)) == decode_row_major(offset, shape)


def _intersected(target: NormalizedMap, regions: tuple[Region, ...], arrays: bool) -> tuple[Any, int]:
    work = WorkCounter()
    with fast_paths(arrays):
        try:
            out: Any = ("ok", intersections(target, regions, work))
        except AffineTransferError as exc:
            out = (type(exc).__name__, str(exc))
    return out, work.count


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(map_pairs(max_parts=5), st.data())
def test_small_intersections_are_the_array_intersections(pair: tuple[ParamAffineMap, ParamAffineMap],
                                                          data: st.DataObject) -> None:
    """``regions._small_intersections`` (a few boxes, no numpy) against the array path: the same
    intersections in the same order, the same work charged (it is in every plan's statistics),
    the same refusal when a region is missing (so a target frame is not tiled)."""
    target, source = pair
    try:
        t = normalize(target, "target", "w")
        regions = source_regions(normalize(source, "source", "w"), WorkCounter())
    except AffineTransferError:
        assume(False)
        return
    drop = data.draw(st.sampled_from([None, *range(len(regions))]))
    regs = regions if drop is None else regions[:drop] + regions[drop + 1:]
    assert _intersected(t, regs, True) == _intersected(t, regs, False)


def test_a_tensor_parallel_layout_takes_the_small_intersections() -> None:
    """The case the small path is for: TP=4 x DP=2 -> TP=8 (8 frames, 4 regions) is joined
    without numpy, and equals the array path."""
    target = contiguous_split_map((64, 16), [8] * 8, 0)
    source = replicate(contiguous_split_map((64, 16), [16] * 4, 0), 2)
    t = normalize(target, "target", "w")
    regions = source_regions(normalize(source, "source", "w"), WorkCounter())
    small = _small_intersections(t, regions, WorkCounter())
    assert small is not None and len(small) == 8
    assert _intersected(t, regions, True) == _intersected(t, regions, False) == (("ok", small), 8 + 4 + 8)


_COORD = st.integers(-3, 12)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 3).flatmap(lambda ndim: st.lists(
    st.tuples(st.tuples(*[_COORD] * ndim), st.tuples(*[st.integers(-1, 6)] * ndim)), max_size=12)))
def test_few_boxes_find_the_same_pairs_and_charge_the_same_work(raw: list[tuple[tuple[int, ...], ...]]) -> None:
    """``box._few_separated`` (a Python sort for a few boxes) against the array path: the same
    pairs (none, when it settles them) and the same work charged, with empty and negative extents,
    overlapping boxes, touching slabs and 0-axis boxes among them."""
    boxes = [Box(origin, extent) for origin, extent in raw]
    seen = []
    for arrays in (True, False):
        work = WorkCounter()
        with fast_paths(arrays):
            seen.append((overlapping_pairs(boxes, work), work.count))
    assert seen[0] == seen[1]
    brute = {(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])}
    assert seen[0][0] == brute
