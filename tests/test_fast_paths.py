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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refplan.box import decode_row_major, row_major_strides, volume
from refplan.errors import AffineTransferError
from refplan.frames import _decode, normalize
from refplan.limits import fast_paths
from refplan.maps import AffinePiece, ParamAffineMap, contiguous_split_map, replicate
from refplan.oracle.layout import validate_map
from refplan.strategies import param_maps


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
