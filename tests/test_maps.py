"""The data model: DeepSpeed's dict layout key for key, hostile dicts, builders and ``replicate``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refplan import (
    AffinePiece,
    InvalidMapError,
    ParamAffineMap,
    block_gather_map,
    contiguous_split_map,
    replicate,
    replicated_map,
    segmented_map,
    sub_param_map,
)
from refplan.frames import normalize
from refplan.strategies import map_pairs

# A map dict exactly as DeepSpeed's ParamAffineMap.to_dict() writes one (facts §3.2): int rank keys,
# sorted locations, "scale" only when it is not 1.
DEEPSPEED_DICT: dict[str, Any] = {
    "logical_shape": [4, 6],
    "ranks": {
        0: {
            "shard_shape": [4, 3],
            "pieces": [{"shape": [4, 3], "source": [0, [6, 1]], "dest": [0, [3, 1]], "locations": [0]}],
        },
        1: {
            "shard_shape": [4, 3],
            "pieces": [{"shape": [4, 3], "source": [3, [6, 1]], "dest": [0, [3, 1]], "locations": [1]}],
        },
    },
}


def test_deepspeed_dict_loads_unchanged_and_round_trips() -> None:
    m = ParamAffineMap.from_dict(DEEPSPEED_DICT)
    assert m == contiguous_split_map((4, 6), [3, 3], 1)
    assert m.to_dict() == DEEPSPEED_DICT
    via_json = json.loads(json.dumps(DEEPSPEED_DICT))  # rank keys become strings
    assert ParamAffineMap.from_dict(via_json) == m


def test_scale_is_written_only_when_not_one() -> None:
    d = replicated_map((2,), 2, scale=0.5).to_dict()
    assert d["ranks"][0]["pieces"][0]["scale"] == 0.5
    assert "scale" not in replicated_map((2,), 2).to_dict()["ranks"][0]["pieces"][0]
    with pytest.raises(InvalidMapError, match="zero scale"):
        AffinePiece((1,), 0, (1,), 0, (1,), [0], scale=0.0)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("ranks"), "needs 'logical_shape' and 'ranks'"),
        (lambda d: d.update(logical_shape=[4, "6"]), "logical_shape"),
        (lambda d: d["ranks"].update({"x": d["ranks"][0]}), "not an integer"),
        (lambda d: d["ranks"][0]["pieces"][0].update(shape=[4, 3.0]), r"pieces\[0\].shape"),
        (lambda d: d["ranks"][0]["pieces"][0].update(source=[0]), r"pieces\[0\].source"),
        (lambda d: d["ranks"][0]["pieces"][0].update(locations=[True]), "locations"),
        (lambda d: d["ranks"][0]["pieces"][0].update(scale="1"), "scale"),
        (lambda d: d["ranks"][0]["pieces"][0].pop("dest"), "lacks key"),
        (lambda d: d["ranks"][0].update(pieces={}), "expected a list"),
    ],
)
def test_hostile_dicts_get_invalid_map_error_naming_the_field(mutate: Any, match: str) -> None:
    d = json.loads(json.dumps(DEEPSPEED_DICT))
    d["ranks"] = {int(k): v for k, v in d["ranks"].items()}
    mutate(d)
    with pytest.raises(InvalidMapError, match=match):
        ParamAffineMap.from_dict(d)


def test_builders_produce_valid_maps() -> None:
    maps = [
        replicated_map((5, 6), 3),
        contiguous_split_map((11, 8), [3, 3, 3, 2], 0),
        sub_param_map((12, 8), (8, 4), [[3, 3, 2], [2, 1, 1]], 0),
        sub_param_map((12, 8), (8, 4), [[8, 0], [0, 4]], 0),  # zero widths give empty pieces
        segmented_map((48, 8), [(32, False), (16, True)], 0, 4, [[8, 8, 8, 8]]),
        block_gather_map((8, 64), {r: [h for h in range(8) if h % 2 == r] for r in range(2)}, 8, 1),
    ]
    for m in maps:
        normalized = normalize(m, "source", "p")
        assert sum(f.box.volume for f in normalized.frames) >= m.numel
    with pytest.raises(InvalidMapError, match="do not account for"):
        segmented_map((48, 8), [(32, False), (16, True)], 0, 2, [[20, 10]])


def test_replicate_builds_exact_holders() -> None:
    tp = contiguous_split_map((8, 4), [4, 4], 0)
    m = replicate(tp, 3)
    assert m.ranks == (0, 1, 2, 3, 4, 5)
    assert m.pieces_by_rank[4][0].locations == frozenset({0, 2, 4})
    assert m.pieces_by_rank[5][0].locations == frozenset({1, 3, 5})
    normalize(m, "source", "p")  # holder exactness holds
    custom = replicate(tp, 2, location_of=lambda r, c: 10 * c + r + 100)
    assert custom.ranks == (100, 101, 110, 111)
    with pytest.raises(InvalidMapError, match="maps two"):
        replicate(tp, 2, location_of=lambda r, c: r)
    with pytest.raises(InvalidMapError, match="at least 1"):
        replicate(tp, 0)


def test_every_way_of_making_a_piece_converts_and_checks() -> None:
    """A piece is a named tuple, but no named-tuple door skips its constructor: ``_make``,
    ``_replace``, ``replace``, copies and pickles convert the fields and refuse a zero scale."""
    import copy
    import pickle

    piece = AffinePiece([2, 3], 0, [3, 1], 0, [3, 1], [1, 0])
    assert piece == ((2, 3), 0, (3, 1), 0, (3, 1), frozenset({0, 1}), 1.0)
    made = AffinePiece._make([[2, 3], 4, [3, 1], 0, [3, 1], [0], 1])
    assert type(made) is AffinePiece and made.shape == (2, 3) and made.source_offset == 4 and made.scale == 1.0
    assert type(made.scale) is float
    with pytest.raises(InvalidMapError, match=r"source_offset.*not an integer"):
        AffinePiece._make([[2, 3], "4", [3, 1], 0, [3, 1], [0], 1])
    assert piece._replace(dest_offset=3).dest_offset == 3 and type(piece.replace(locations=[2]).locations) is frozenset
    for copied in (copy.copy(piece), copy.deepcopy(piece), pickle.loads(pickle.dumps(piece))):
        assert copied == piece and type(copied) is AffinePiece
    with pytest.raises(InvalidMapError, match="zero scale"):
        AffinePiece._make([[2, 3], 0, [3, 1], 0, [3, 1], [0], 0.0])
    with pytest.raises(InvalidMapError, match="zero scale"):
        piece._replace(scale=0)
    with pytest.raises(TypeError, match="no field"):
        piece.replace(offset=1)


# -- hash-consing: equal maps share one immutable content ------------------------------------------


def test_equal_maps_share_one_content_and_unequal_ones_do_not() -> None:
    """Built by a builder, loaded from a dict or copied: a map equal to one alive now (same shape,
    same shard shapes and pieces per location in the same order) gets that map's ``content``;
    a change of any one field, or of dict order, gives another content."""
    from refplan.maps import MapContent

    built = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
    loaded = ParamAffineMap.from_dict(built.to_dict())
    again = ParamAffineMap(built.logical_shape, dict(built.shard_shapes), dict(built.pieces_by_rank))
    assert type(built.content) is MapContent and built.content.pieces == 4
    assert again.content is built.content and again is not built
    assert loaded == built  # equal as values whatever the dict order (to_dict sorts locations) ...
    ordered = ParamAffineMap(built.logical_shape, dict(sorted(built.shard_shapes.items())),
                             dict(sorted(built.pieces_by_rank.items())))
    assert loaded.content is ordered.content  # ... and the same content exactly when the order is the same
    assert (ordered.content is built.content) == (list(ordered.shard_shapes) == list(built.shard_shapes))
    loc, listed = next(iter(built.pieces_by_rank.items()))
    for field in AffinePiece.FIELDS[:-1]:
        value = getattr(listed[0], field)
        if field == "locations":
            changed: Any = [*value, 9]
        else:
            changed = value + 1 if isinstance(value, int) else (*value[:-1], 7)
        other = ParamAffineMap(built.logical_shape, built.shard_shapes,
                               {**built.pieces_by_rank, loc: (listed[0].replace(**{field: changed}), *listed[1:])})
        assert other.content is not built.content and other != built, field
    assert ParamAffineMap((8, 5), built.shard_shapes, built.pieces_by_rank).content is not built.content
    shards = {**built.shard_shapes, loc: (4, 5)}
    assert ParamAffineMap(built.logical_shape, shards, built.pieces_by_rank).content is not built.content


def test_a_map_holding_anything_but_exact_pieces_shares_nothing() -> None:
    """A plain tuple equal to a piece (or a subclass of one) must never make a map share a content
    with, or lend one to, a map of real pieces: the planner and the oracle recognize layouts by it."""
    from refplan.maps import MapContent

    class Piece(AffinePiece):
        __slots__ = ()

    real = contiguous_split_map((4, 6), [2, 2], 0)
    for odd in (tuple, lambda p: Piece(*p)):
        pieces = {loc: tuple(map(odd, v)) for loc, v in real.pieces_by_rank.items()}
        first = ParamAffineMap(real.logical_shape, real.shard_shapes, pieces)  # type: ignore[arg-type]
        second = ParamAffineMap(real.logical_shape, real.shard_shapes, pieces)  # type: ignore[arg-type]
        assert first == real and first == second  # equal as values
        assert type(first.content) is not MapContent and first.content is not second.content
        assert first.content is not real.content
    # The subclass's pieces written out and loaded again are plain pieces: shared as usual.
    assert ParamAffineMap.from_dict(first.to_dict()).content is real.content


def test_a_content_lives_only_as_long_as_a_map_uses_it() -> None:
    """The table of contents holds them weakly: planning a model's maps and dropping them leaves
    nothing behind."""
    import gc

    from refplan import maps

    gc.collect()
    before = len(maps._CONTENTS)
    # Shapes no other test builds (a map another test keeps alive would already be counted).
    made = [contiguous_split_map((7919 + i, 13), [3960, 3959 + i], 0) for i in range(50)]
    assert len(maps._CONTENTS) == before + 50
    del made
    gc.collect()
    assert len(maps._CONTENTS) == before


def test_copies_and_pickles_of_a_map_are_equal_and_share_its_content() -> None:
    import copy
    import pickle

    m = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
    for copied in (copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert type(copied) is ParamAffineMap and copied == m and hash(copied) == hash(m)
        assert copied.content is m.content
    assert repr(m).startswith("ParamAffineMap(logical_shape=(8, 4), shard_shapes={0: (4, 4), 2: (4, 4)")
    assert eval(repr(m), {"ParamAffineMap": ParamAffineMap, "AffinePiece": AffinePiece,
                          "frozenset": frozenset}) == m


@given(pair=map_pairs(max_parts=4, max_locations=3), data=st.data())
def test_drawn_maps_share_a_content_exactly_when_equal_in_dict_order(pair: Any, data: st.DataObject) -> None:
    """On drawn maps: rebuilt from their own fields (in any dict order drawn), a map shares its
    content exactly when it lists its locations in the same order; two maps share one exactly
    when their converted fields, in order, are equal."""
    def fields(m: ParamAffineMap) -> tuple[Any, ...]:
        return (m.logical_shape, tuple(m.shard_shapes.items()), tuple(m.pieces_by_rank.items()))

    target, source = pair
    for m in pair:
        order = data.draw(st.permutations(list(m.pieces_by_rank)))
        shards = data.draw(st.permutations(list(m.shard_shapes)))
        again = ParamAffineMap(list(m.logical_shape), {r: list(m.shard_shapes[r]) for r in shards},
                               {r: list(m.pieces_by_rank[r]) for r in order})
        assert again == m
        assert (again.content is m.content) == (fields(again) == fields(m))
    assert (target.content is source.content) == (fields(target) == fields(source))
