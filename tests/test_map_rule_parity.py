"""The planner and the oracle read one rulebook for maps (R0-R28).

The oracle re-derives every premise with its own code (``oracle.layout``), so nothing but a test
holds the two to the same rules. Here one field of one piece (or a shard, or an extra empty piece)
of a valid pair is changed, and the two must agree: the planner refuses the pair with
``InvalidMapError``/``UnsupportedLayoutError`` exactly when the oracle, judging any plan for it,
answers ``invalid_map`` under that same class. Until 2026-12-06 they did not for empty pieces:
the oracle skipped them before R9-R11 (``ok`` for maps every planner refuses), held an empty
shard's empty pieces to rules the planner does not (R6 skips them), and named a non-empty piece in
an empty shard by its strides (``UnsupportedLayoutError``) where the planner says R6
(``InvalidMapError``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refplan.errors import AffineTransferError, InvalidMapError, UnsupportedLayoutError
from refplan.maps import AffinePiece, ParamAffineMap
from refplan.planner import plan_transfer
from refplan.strategies import map_pairs
from refplan.verify import verify_plan

_FIELDS = ("zero extent", "extent", "source offset", "dest offset", "source stride", "dest stride",
           "no holder", "other holder", "scale", "short strides", "extra empty piece", "drop piece", "shard")


def _mutated(m: ParamAffineMap, data: st.DataObject) -> ParamAffineMap:
    pieces = {loc: list(m.pieces_by_rank.get(loc, ())) for loc in m.ranks}
    shards = dict(m.shard_shapes)
    holders = [loc for loc in pieces if pieces[loc]]
    loc = data.draw(st.sampled_from(holders))
    index = data.draw(st.integers(0, len(pieces[loc]) - 1))
    p = pieces[loc][index]
    shape, strides, dest = list(p.shape), list(p.source_strides), list(p.dest_strides)
    s_off, d_off, held, scale = p.source_offset, p.dest_offset, set(p.locations), p.scale
    what = data.draw(st.sampled_from(_FIELDS))
    axis = data.draw(st.integers(0, max(len(shape) - 1, 0)))
    step = data.draw(st.sampled_from([-1, 1, 2, 7]))
    if what == "drop piece":
        del pieces[loc][index]
        return ParamAffineMap(m.logical_shape, shards, pieces)
    if what == "shard":
        if shards[loc]:
            shard = list(shards[loc])
            shard[axis] = max(0, shard[axis] + step)
            shards[loc] = tuple(shard)
        return ParamAffineMap(m.logical_shape, shards, pieces)
    if what == "extra empty piece":
        empty = list(shape)
        if empty:
            empty[axis] = 0
        pieces[loc].append(AffinePiece(
            tuple(empty), data.draw(st.sampled_from([s_off, 10**6])), tuple(strides),
            data.draw(st.sampled_from([d_off, 10**6])), tuple(dest),
            data.draw(st.sampled_from([tuple(held), ()])), data.draw(st.sampled_from([1.0, 3.0])),
        ))
        return ParamAffineMap(m.logical_shape, shards, pieces)
    if shape and what == "zero extent":
        shape[axis] = 0
    elif shape and what == "extent":
        shape[axis] = max(-1, shape[axis] + step)
    elif what == "source offset":
        s_off += step
    elif what == "dest offset":
        d_off += step
    elif strides and what == "source stride":
        strides[axis] += 1
    elif dest and what == "dest stride":
        dest[axis] += 1
    elif what == "no holder":
        held = set()
    elif what == "other holder":
        held ^= {data.draw(st.sampled_from([*m.ranks, 99]))}
    elif what == "scale":
        scale = 2.0
    elif what == "short strides":
        strides = strides[:-1]
    pieces[loc][index] = AffinePiece(tuple(shape), s_off, tuple(strides), d_off, tuple(dest), tuple(sorted(held)),
                                     scale)
    return ParamAffineMap(m.logical_shape, shards, pieces)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(map_pairs(), st.data())
def test_the_planner_refuses_a_changed_map_exactly_when_the_oracle_calls_it_invalid(
    pair: tuple[ParamAffineMap, ParamAffineMap], data: st.DataObject
) -> None:
    target, source = pair
    plan = plan_transfer(target, source)
    for _ in range(4):  # several changes per pair: drawing the pair is most of an example's cost
        side = data.draw(st.sampled_from(["target", "source"]))
        changed = _mutated(target if side == "target" else source, data)
        t, s = (changed, source) if side == "target" else (target, changed)
        planner: Any
        try:
            plan_transfer(t, s)
            planner = None
        except (InvalidMapError, UnsupportedLayoutError) as exc:
            planner = exc
        except AffineTransferError:  # a budget: policy, not a rule of the map
            continue
        verdict = verify_plan(t, s, plan)
        if planner is None:
            assert verdict.status != "invalid_map", (side, changed.to_dict(), verdict.map_error)
        else:
            assert verdict.status == "invalid_map", (side, changed.to_dict(), str(planner), str(verdict))
            assert (verdict.map_error or "").startswith(type(planner).__name__ + ":"), (
                side, changed.to_dict(), str(planner), verdict.map_error
            )


@pytest.mark.parametrize(
    ("pieces", "shards", "cls", "fragment"),
    [
        # An empty shard's empty pieces are held to R7 and R8 only: both accept a holderless one ...
        ({0: [AffinePiece((2, 4), 0, (4, 1), 0, (4, 1), [0])], 1: [AffinePiece((0, 4), 0, (4, 1), 0, (4, 1), [])]},
         {0: (2, 4), 1: (0, 4)}, None, ""),
        # ... and both refuse a non-empty piece there by R6, whatever its strides.
        ({0: [AffinePiece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
          1: [AffinePiece((2, 4), 0, (4, 1), 0, (1, 1), [0, 1])]},
         {0: (2, 4), 1: (2, 0)}, InvalidMapError, "empty shard"),
    ],
)
def test_empty_shards_are_read_alike(
    pieces: dict[int, list[AffinePiece]], shards: dict[int, tuple[int, ...]], cls: type[Exception] | None,
    fragment: str,
) -> None:
    whole = ParamAffineMap((2, 4), {0: (2, 4)}, {0: [AffinePiece((2, 4), 0, (4, 1), 0, (4, 1), [0])]})
    source = ParamAffineMap((2, 4), shards, pieces)
    plan = plan_transfer(whole, whole)
    verdict = verify_plan(whole, source, plan)
    if cls is None:
        plan_transfer(whole, source)
        assert verdict.status == "ok", str(verdict)
    else:
        with pytest.raises(cls, match=fragment):
            plan_transfer(whole, source)
        assert verdict.status == "invalid_map" and fragment in (verdict.map_error or ""), str(verdict)
        assert (verdict.map_error or "").startswith(cls.__name__), verdict.map_error


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(map_pairs(), st.data())
def test_two_changed_maps_are_refused_for_the_same_rule_first(
    pair: tuple[ParamAffineMap, ParamAffineMap], data: st.DataObject
) -> None:
    """Both maps changed at once: the planner and the oracle name the first broken rule in
    spec/validation.md's order, so their classes agree (the oracle checked a source map's region
    rules before the target map's piece rules, and R4 after a location's pieces: a coverage fault
    was named where the planner named a stride, ``InvalidMapError`` against
    ``UnsupportedLayoutError``; an outside probe, 2026-12-07)."""
    target, source = pair
    plan = plan_transfer(target, source)
    t, s = _mutated(target, data), _mutated(source, data)
    try:
        plan_transfer(t, s)
        return  # both changes kept the maps valid, or the oracle's agreement is the test above's
    except (InvalidMapError, UnsupportedLayoutError) as exc:
        planner: Exception = exc
    except AffineTransferError:  # a budget: policy, not a rule of the map
        return
    verdict = verify_plan(t, s, plan)
    assert verdict.status == "invalid_map", (t.to_dict(), s.to_dict(), str(planner), str(verdict))
    assert (verdict.map_error or "").startswith(type(planner).__name__ + ":"), (
        t.to_dict(), s.to_dict(), str(planner), verdict.map_error
    )


_WHOLE = ParamAffineMap((2, 2), {0: (2, 2)}, {0: [AffinePiece((2, 2), 0, (2, 1), 0, (2, 1), [0])]})


@pytest.mark.parametrize(("target", "source", "cls", "fragment"), [
    # R13 on the target (step 3) before R25 on the source (step 4): its row 1 is held by nobody
    (ParamAffineMap((2, 2), {0: (2, 2)}, {0: [AffinePiece((2, 2), 0, (2, 1), 0, (1, 2), [0])]}),
     ParamAffineMap((2, 2), {0: (1, 2)}, {0: [AffinePiece((1, 2), 0, (2, 1), 0, (2, 1), [0])]}),
     UnsupportedLayoutError, "dest strides"),
    # R4 at location 0 (a non-empty shard, only an empty piece) before R13 at location 1's piece
    (_WHOLE,
     ParamAffineMap((2, 2), {0: (2, 2), 1: (2, 2)}, {0: [AffinePiece((0, 2), 4, (2, 1), 4, (2, 1), [0])],
                                                     1: [AffinePiece((2, 2), 0, (2, 1), 0, (1, 2), [1])]}),
     InvalidMapError, "nonempty shard"),
])
def test_the_first_rule_broken_in_the_spec_s_order_is_named_by_both(
    target: ParamAffineMap, source: ParamAffineMap, cls: type[Exception], fragment: str
) -> None:
    """The outside probe's two inputs with two faults each (2026-12-07): the oracle named the later
    rule, under the other class."""
    with pytest.raises(cls, match=fragment):
        plan_transfer(target, source)
    verdict = verify_plan(target, source, [])
    assert verdict.status == "invalid_map", str(verdict)
    assert (verdict.map_error or "").startswith(cls.__name__ + ":") and fragment in (verdict.map_error or ""), (
        verdict.map_error
    )
