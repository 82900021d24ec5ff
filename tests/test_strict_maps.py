"""The Python API is as strict as the file readers, and a map's shared content is its own (issue 25).

Two holes let the oracle be fooled through the Python API:
- every field went through ``int()``, so a map written with ``n / 2`` (2.5 rows) or ``True + 1.5``
  was truncated into a valid integer map, shared that map's content, planned, and was verified
  ``ok``;
- the shared-content key was only tested by properties whose expected value restated the key
  itself, so keying pieces by ``pieces_by_rank.values()`` (a piece list moved to another location
  reads back as its valid twin) survived the whole suite.

Here the expected value of every sharing property is computed from the *input* handed to the
constructor, written out as JSON text independently of ``refplan.maps``, never from what the
constructed map reports (which, under a wrong key, is the twin's content).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refplan import AffinePiece, ParamAffineMap, contiguous_split_map, replicate, verify_plan
from refplan.errors import InvalidMapError
from refplan.frames import normalize
from refplan.maps import as_int, is_int
from refplan.planner import plan_transfer
from refplan.strategies import map_pairs

# -- the integer rule ------------------------------------------------------------------------------

NOT_INTEGERS: list[Any] = [True, False, np.True_, 2.5, 2.0, np.float64(3.0), "3", None, [3], 3 + 0j, 1e300]
INTEGERS: list[Any] = [0, 3, -7, 2**70, np.int64(5), np.int32(-2), np.uint8(7), np.array(4)]


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
def test_the_rule_refuses_what_is_not_exactly_an_integer(value: Any) -> None:
    assert as_int(value) is None and not is_int(value)


@pytest.mark.parametrize("value", INTEGERS, ids=repr)
def test_the_rule_takes_integers_of_any_kind_as_plain_ints(value: Any) -> None:
    converted = as_int(value)
    assert type(converted) is int and converted == int(value) and is_int(value)


def _piece_args() -> dict[str, Any]:
    return {"shape": [2, 3], "source_offset": 0, "source_strides": [3, 1], "dest_offset": 0,
            "dest_strides": [3, 1], "locations": [0, 1]}


PIECE_FIELDS = [
    ("shape", lambda bad: [2, bad]), ("source_offset", lambda bad: bad), ("source_strides", lambda bad: [bad, 1]),
    ("dest_offset", lambda bad: bad), ("dest_strides", lambda bad: [3, bad]), ("locations", lambda bad: [0, bad]),
]


@pytest.mark.parametrize("field,put", PIECE_FIELDS, ids=[f for f, _ in PIECE_FIELDS])
@pytest.mark.parametrize("bad", [True, 2.5, np.float64(1.0), "1", np.True_], ids=repr)
def test_a_piece_refuses_a_non_integer_in_any_field_naming_it(field: str, put: Any, bad: Any) -> None:
    args = {**_piece_args(), field: put(bad)}
    with pytest.raises(InvalidMapError, match=rf"AffinePiece\.{field}.*not an integer"):
        AffinePiece(**args)
    with pytest.raises(InvalidMapError, match="not an integer"):
        AffinePiece(**_piece_args())._replace(**{field: put(bad)})


@pytest.mark.parametrize("bad", [True, "1.0", None, [1.0]], ids=repr)
def test_a_piece_refuses_a_scale_that_is_not_a_number(bad: Any) -> None:
    with pytest.raises(InvalidMapError, match="scale"):
        AffinePiece(**_piece_args(), scale=bad)


def test_a_piece_refuses_a_location_listed_twice() -> None:
    with pytest.raises(InvalidMapError, match=r"locations.*\[0, 1\] listed more than once"):
        AffinePiece(**{**_piece_args(), "locations": [1, 0, 1, 0]})


def test_numpy_integers_make_the_same_piece_and_share_the_content() -> None:
    plain = contiguous_split_map((6, 4), [3, 3], 0)
    piece = plain.pieces_by_rank[0][0]
    numpy_piece = AffinePiece(np.array(piece.shape), np.int64(piece.source_offset), np.array(piece.source_strides),
                              np.int32(piece.dest_offset), tuple(np.int16(s) for s in piece.dest_strides),
                              np.array(sorted(piece.locations)))
    assert numpy_piece == piece and all(type(v) is int for v in (*numpy_piece.shape, numpy_piece.source_offset))
    again = ParamAffineMap(np.array(plain.logical_shape), {np.int64(0): np.array([3, 4]), 1: (3, 4)},
                           {np.int64(0): [numpy_piece], 1: plain.pieces_by_rank[1]})
    assert again.content is plain.content


class _OtherHash(int):
    """An integer key that is not the same dict key as the plain int it equals."""

    def __hash__(self) -> int:
        return 12345

    def __eq__(self, other: object) -> bool:
        return other is self


@pytest.mark.parametrize("shape,shards,pieces,match", [
    ((6.0, 4), {0: (6, 4)}, {0: ()}, r"logical_shape\[0\]: 6\.0"),
    ((6, 4), {0: (6, True)}, {0: ()}, r"shard_shapes\[0\]\[1\]: True"),
    ((6, 4), {0.0: (6, 4)}, {0: ()}, "shard_shapes key: 0.0"),
    ((6, 4), {0: (6, 4)}, {"0": ()}, "pieces_by_rank key: '0'"),
    ((6, 4), {0: (6, 4), _OtherHash(0): (6, 4)}, {0: ()}, "two keys name one location"),
], ids=["shape", "shard", "shard-key", "piece-key", "twice"])
def test_a_map_refuses_non_integer_fields_and_keys(shape: Any, shards: Any, pieces: Any, match: str) -> None:
    with pytest.raises(InvalidMapError, match=match):
        ParamAffineMap(shape, shards, pieces)


def test_half_a_row_is_refused_not_truncated_into_a_valid_plan() -> None:
    """The reviewer's case: a split written with ``n / 2`` for n = 5 was a (5, 4) map of two 2-row
    shards, planned into segments and verified ``ok``. It is refused where it is built."""
    n = 5
    with pytest.raises(InvalidMapError, match=r"2\.5 is not an integer"):
        contiguous_split_map((n, 4), [n / 2, n / 2], 0)
    with pytest.raises(InvalidMapError, match="not an integer"):
        AffinePiece((True + 1.5, 4), 0, (4, 1), 0, (4, 1), [0])  # type: ignore[arg-type]
    # The integer map it used to become still plans and verifies: the refusal is of the input only.
    whole = contiguous_split_map((n, 4), [2, 3], 0)
    assert verify_plan(whole, whole, plan_transfer(whole, whole)).ok


# -- the content key: independent expected values --------------------------------------------------


def _plain(value: Any) -> Any:
    """Input values as JSON-able plain Python, converting only integer kinds (the rule under test
    is not used: numpy integers are the only non-int integers drawn here)."""
    if isinstance(value, (np.integer, int)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, float):
        return value
    raise AssertionError(f"unexpected input value {value!r}")


def _text(shape: Any, shards: dict[Any, Any], pieces: dict[Any, list[tuple[Any, ...]]]) -> str:
    """The input as canonical text: what a map built from it must hold, in the order it was given."""
    return json.dumps([
        _plain(shape),
        [[_plain(k), _plain(v)] for k, v in shards.items()],
        [[_plain(k), [[_plain(f) for f in piece] for piece in v]] for k, v in pieces.items()],
    ])


def _held(m: ParamAffineMap) -> str:
    """What the built map reports holding, as the same text."""
    return json.dumps([
        list(m.logical_shape),
        [[k, list(v)] for k, v in m.shard_shapes.items()],
        [[k, [[_plain(f) for f in piece] for piece in v]] for k, v in m.pieces_by_rank.items()],
    ])


def _raw(m: ParamAffineMap) -> tuple[list[int], dict[Any, Any], dict[Any, list[tuple[Any, ...]]]]:
    return (list(m.logical_shape), {k: list(v) for k, v in m.shard_shapes.items()},
            {k: [tuple(p) for p in v] for k, v in m.pieces_by_rank.items()})


def _build(shape: Any, shards: dict[Any, Any], pieces: dict[Any, list[tuple[Any, ...]]]) -> ParamAffineMap:
    return ParamAffineMap(shape, shards, {k: [AffinePiece(*p) for p in v] for k, v in pieces.items()})


@st.composite
def _variant(draw: st.DrawFn, m: ParamAffineMap) -> tuple[Any, dict[Any, Any], dict[Any, list[tuple[Any, ...]]]]:
    """The map's own input, changed in one drawn way (or not at all)."""
    shape, shards, pieces = _raw(m)
    how = draw(st.sampled_from(["same", "move", "swap", "reorder", "numpy", "bump", "drop"]))
    keys = list(pieces)
    if how == "move" and keys:  # a piece list moved to a location no shard shape names (R21)
        old = draw(st.sampled_from(keys))
        new = max([*shards, *pieces]) + 1 + draw(st.integers(0, 2))
        pieces = {new if k == old else k: v for k, v in pieces.items()}
    elif how == "swap" and len(keys) >= 2:
        a, b = draw(st.lists(st.sampled_from(keys), min_size=2, max_size=2, unique=True))
        pieces = {k: pieces[b] if k == a else pieces[a] if k == b else v for k, v in pieces.items()}
    elif how == "reorder":
        pieces = {k: pieces[k] for k in draw(st.permutations(keys))}
        shards = {k: shards[k] for k in draw(st.permutations(list(shards)))}
    elif how == "numpy":
        kind = draw(st.sampled_from([np.int64, np.int32]))
        shape = [kind(v) for v in shape]
        shards = {kind(k): np.array(v, dtype=np.int64) for k, v in shards.items()}
        pieces = {k: [(np.array(p[0]), kind(p[1]), *p[2:]) for p in v] for k, v in pieces.items()}
    elif how == "bump" and keys:
        k = draw(st.sampled_from(keys))
        if pieces[k]:
            i = draw(st.integers(0, len(pieces[k]) - 1))
            field = draw(st.integers(0, 4))
            p = list(pieces[k][i])
            if field in (1, 3):
                p[field] += 1
            elif p[field]:
                p[field] = (*p[field][:-1], p[field][-1] + 1)
            pieces = {**pieces, k: [*pieces[k][:i], tuple(p), *pieces[k][i + 1:]]}
    elif how == "drop" and keys:
        k = draw(st.sampled_from(keys))
        pieces = {**pieces, k: pieces[k][:-1]}
    return shape, shards, pieces


@given(pair=map_pairs(max_parts=4, max_locations=3), data=st.data())
def test_a_map_holds_exactly_its_input_and_shares_a_content_exactly_when_inputs_are_equal(
    pair: Any, data: st.DataObject
) -> None:
    """Built from a drawn map's fields and from a drawn variant (a piece list moved to another
    location, two swapped, dicts reordered, numpy integers, one field bumped, a piece dropped):
    each built map reports exactly its own input, and the two share a content exactly when their
    inputs' canonical texts are equal."""
    for m in pair:
        base_in = _raw(m)
        var_in = data.draw(_variant(m))
        base, var = _build(*base_in), _build(*var_in)
        assert _held(base) == _text(*base_in)
        assert _held(var) == _text(*var_in)
        assert (base.content is var.content) == (_text(*base_in) == _text(*var_in))


def test_a_piece_list_moved_to_another_location_never_reads_back_as_its_valid_twin() -> None:
    """The content-key mutant's witness: the same piece lists under other location keys. The moved
    map is invalid (R21: pieces at a location with no shard shape); it must hold what it was given,
    get a content of its own, and be refused by validation while its twin passes."""
    valid = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
    shards = dict(valid.shard_shapes)
    last = max(valid.pieces_by_rank)
    moved_pieces = {(k if k != last else last + 5): v for k, v in valid.pieces_by_rank.items()}
    moved = ParamAffineMap(valid.logical_shape, shards, moved_pieces)
    assert moved.content is not valid.content and moved != valid
    assert list(moved.pieces_by_rank) == [*list(valid.pieces_by_rank)[:-1], last + 5]
    normalize(valid, "source", "w")
    with pytest.raises(InvalidMapError, match=f"location ({last}|{last + 5})"):
        normalize(moved, "source", "w")
    swapped = ParamAffineMap(valid.logical_shape, shards, dict(zip(reversed(list(valid.pieces_by_rank)),
                                                                   valid.pieces_by_rank.values())))
    assert swapped.content is not valid.content
    assert swapped.pieces_by_rank[0] == valid.pieces_by_rank[last]


@given(pair=map_pairs(max_parts=4, max_locations=3), data=st.data())
def test_a_drawn_non_integer_anywhere_is_refused_never_truncated_into_a_twin(pair: Any, data: st.DataObject) -> None:
    """A bool, a float (integral or not) or a numpy float put in one drawn integer field of a drawn
    map's input (shape, shard shape, a piece field, a location, a key) is refused with an
    ``InvalidMapError`` naming a field, while the map of the unpoisoned input is alive (so a
    truncating constructor would have handed back its content)."""
    m = pair[0]
    shape, shards, pieces = _raw(m)
    bad = data.draw(st.sampled_from([True, False, 0.5, 2.0, -1.5, np.float64(1.0), np.True_]))
    spots = ["shape", "shard", "shard-key", "piece-key"]
    if any(pieces.values()):
        spots += ["piece-shape", "piece-offset", "piece-strides", "piece-locations"]
    spot = data.draw(st.sampled_from(spots))
    if spot == "shape" and shape:
        shape = [bad, *shape[1:]]
    elif spot == "shard" and shards and any(shards.values()):
        k = next(k for k, v in shards.items() if v)
        shards = {**shards, k: [bad, *shards[k][1:]]}
    elif spot == "shard-key" and shards:
        k = next(iter(shards))
        shards = {(float(k) if isinstance(bad, float) else bad) if key == k else key: v for key, v in shards.items()}
    elif spot == "piece-key" and pieces:
        k = next(iter(pieces))
        pieces = {(float(k) if isinstance(bad, float) else bad) if key == k else key: v for key, v in pieces.items()}
    elif spot.startswith("piece-"):
        k = next(k for k, v in pieces.items() if v)
        p = list(pieces[k][0])
        if spot == "piece-shape" and p[0]:
            p[0] = (bad, *p[0][1:])
        elif spot == "piece-offset":
            p[1] = bad
        elif spot == "piece-strides" and p[2]:
            p[2] = (bad, *p[2][1:])
        elif spot == "piece-locations":
            p[5] = [bad]
        else:
            p[3] = bad
        pieces = {**pieces, k: [tuple(p), *pieces[k][1:]]}
    else:
        return  # a 0-axis shape or no shard to poison: nothing drawn here
    with pytest.raises(InvalidMapError, match=r"not an integer|two keys"):
        _build(shape, shards, pieces)
