"""Exact tests of refplan/maps.py that `make mutation` found missing (docs/mutation.md, "The planner's core").

The dict form's refusals word for word, with the JSON path of the field at fault; the
constructors' refusals naming the field and index; ``piece_arrays`` on hand-worked pieces; and
the builders' exact pieces where a mutant changed one offset or index.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from refplan.errors import InvalidMapError
from refplan.maps import (
    AffinePiece,
    ParamAffineMap,
    _field_name,
    block_gather_map,
    contiguous_split_map,
    is_int,
    piece_arrays,
    replicate,
    replicated_map,
    segmented_map,
    sub_param_map,
)

GOOD = contiguous_split_map((4,), [2, 2], 0).to_dict()


def _refused(doc: Any) -> str:
    with pytest.raises(InvalidMapError) as info:
        ParamAffineMap.from_dict(doc)
    return str(info.value)


def _with(change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    change(doc)
    return doc


P0 = '$.ranks["1"].pieces[0]'


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["ranks"].__setitem__(0, []), '$.ranks["0"]: expected {shard_shape, pieces}'),
    (lambda d: d["ranks"][0].pop("pieces"), '$.ranks["0"]: expected {shard_shape, pieces}'),
    (lambda d: d["ranks"][0]["shard_shape"].__setitem__(0, 1.5),
     '$.ranks["0"].shard_shape: expected a list of integers, got [1.5]'),
    (lambda d: d["ranks"][1].__setitem__("pieces", {}), '$.ranks["1"].pieces: expected a list, got dict'),
    (lambda d: d["ranks"][1]["pieces"].__setitem__(0, 5), f"{P0}: a piece must be an object, got int"),
    (lambda d: d["ranks"][1]["pieces"][0].pop("dest"), f"{P0}: piece lacks key(s) ['dest']"),
    (lambda d: [d["ranks"][1]["pieces"][0].pop(k) for k in ("source", "locations")],
     f"{P0}: piece lacks key(s) ['source', 'locations']"),
    (lambda d: d["ranks"][1]["pieces"][0].pop("shape"), f"{P0}: piece lacks key(s) ['shape']"),
    (lambda d: d["ranks"][1]["pieces"][0].__setitem__("dest", [0]),
     f"{P0}.dest: expected [offset, [strides...]], got [0]"),
    (lambda d: d["ranks"][1]["pieces"][0].__setitem__("dest", [0, [1.5]]),
     f"{P0}.dest[1]: expected a list of integers, got [1.5]"),
    (lambda d: d["ranks"][1]["pieces"][0].__setitem__("source", [0, (2.5,)]),
     f"{P0}.source[1]: expected a list of integers, got (2.5,)"),
    (lambda d: d["ranks"][1]["pieces"][0].__setitem__("shape", "2"),
     f"{P0}.shape: expected a list of integers, got '2'"),
    (lambda d: d["ranks"][1]["pieces"][0].__setitem__("locations", [1, 1, 0, 0, 2]),
     f"{P0}.locations: location(s) [0, 1] listed more than once"),
    (lambda d: d["ranks"][1]["pieces"][0].__setitem__("scale", "x"), f"{P0}.scale: expected a number, got 'x'"),
    (lambda d: d["ranks"][1]["pieces"][0].__setitem__("scale", 0),
     f"{P0}.scale: a zero scale is not invertible, so F could not be rebuilt from the shard"),
    (lambda d: d["ranks"].__setitem__("x", d["ranks"].pop(1)), "$.ranks: location key 'x' is not an integer"),
])
def test_dict_form_refusals_name_the_json_path(change: Any, message: str) -> None:
    assert _refused(_with(change)) == message


def test_dict_form_refuses_a_scale_too_large_for_a_float() -> None:
    message = _refused(_with(lambda d: d["ranks"][1]["pieces"][0].__setitem__("scale", 10**400)))
    assert message.startswith(f"{P0}.scale: 1000") and message.endswith(" does not fit a float")


def test_dict_form_refuses_what_is_no_map() -> None:
    assert _refused([]) == "$: a map must be an object, got list"


def test_dict_form_reads_tuples_and_string_keys() -> None:
    doc = _with(lambda d: d["ranks"][1]["pieces"][0].__setitem__("dest", (0, (1,))))
    doc["ranks"] = {str(k): v for k, v in doc["ranks"].items()}
    assert ParamAffineMap.from_dict(doc) == contiguous_split_map((4,), [2, 2], 0)
    piece = AffinePiece.from_dict({"shape": [2], "source": [2, [1]], "dest": [0, [1]], "locations": [1]}, "p")
    assert piece == AffinePiece((2,), 2, (1,), 0, (1,), [1])
    with pytest.raises(InvalidMapError) as info:
        AffinePiece.from_dict({"shape": [2]}, "p")
    assert str(info.value) == "p: piece lacks key(s) ['source', 'dest', 'locations']"


def test_field_names_quote_what_is_not_an_identifier() -> None:
    assert _field_name("$", "0", "pieces") == '$.ranks["0"].pieces'
    assert _field_name("$", "a") == "$.ranks.a"
    assert _field_name("$", "\u00e9", "x") == '$.ranks["\\u00e9"].x'
    long = "0" * 100
    assert _field_name("$", long) == "$.ranks[" + ('"' + long)[:80] + "]"


def test_to_dict_lists_ranks_without_pieces_or_shard() -> None:
    m = ParamAffineMap((2,), {0: (2,), 1: (0,)}, {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])]})
    assert m.to_dict()["ranks"][1] == {"shard_shape": [0], "pieces": []}


# ---------------------------------------------------------------------------------------------
# Constructors


class _One:
    """An integer-like key (``__index__`` is 1) that hashes apart from 1."""

    def __index__(self) -> int:
        return 1


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ParamAffineMap(5, {}, {}), "ParamAffineMap.logical_shape: expected a sequence of integers, got 5"),
    (lambda: ParamAffineMap((1.5,), {0: (1,)}, {}), "ParamAffineMap.logical_shape[0]: 1.5 is not an integer (a float)"),
    (lambda: ParamAffineMap((1,), {"a": (1,)}, {}), "ParamAffineMap.shard_shapes key: 'a' is not an integer (a str)"),
    (lambda: ParamAffineMap((1,), {0: (1, 1.5)}, {}),
     "ParamAffineMap.shard_shapes[0][1]: 1.5 is not an integer (a float)"),
    (lambda: ParamAffineMap((1,), {0: (1,)}, {"a": []}),
     "ParamAffineMap.pieces_by_rank key: 'a' is not an integer (a str)"),
    (lambda: ParamAffineMap((1,), {1: (1,), _One(): (1,)}, {}),
     "ParamAffineMap: two keys name one location (e.g. 1 and numpy's 1)"),
    (lambda: ParamAffineMap((1,), {1: (1,)}, {1: [], _One(): []}),
     "ParamAffineMap: two keys name one location (e.g. 1 and numpy's 1)"),
    (lambda: AffinePiece((1,), 0, (1,), 0, (1,), [3, 1, 3, 1, 2]),
     "AffinePiece.locations: location(s) [1, 3] listed more than once"),
    (lambda: AffinePiece((1,), 0, (1,), 0, (1,), [0, 1.0]),
     "AffinePiece.locations[1]: 1.0 is not an integer (a float)"),
    (lambda: AffinePiece((1,), 0, (1,), 0, (1,), 7), "AffinePiece.locations: expected a sequence of integers, got 7"),
    (lambda: AffinePiece((1,), 0, (1,), 0, (1,), [0], "x"), "AffinePiece.scale: expected a number, got 'x'"),
    (lambda: AffinePiece((1,), 0, (1,), 0, (1,), [0], True), "AffinePiece.scale: expected a number, got True"),
    (lambda: AffinePiece((1,), 0.5, (1,), 0, (1,), [0]), "AffinePiece.source_offset: 0.5 is not an integer (a float)"),
    (lambda: replicated_map((1.5,), 1), "shape[0]: 1.5 is not an integer (a float)"),
    (lambda: contiguous_split_map((4.5,), [2], 0), "shape[0]: 4.5 is not an integer (a float)"),
    (lambda: sub_param_map((4.5,), [4], [[2, 2]], 0), "shape[0]: 4.5 is not an integer (a float)"),
    (lambda: segmented_map((4.5,), [(4, True)], 0, 2, [[2, 2]]), "shape[0]: 4.5 is not an integer (a float)"),
    (lambda: block_gather_map((4.5,), {0: [0]}, 1, 0), "shape[0]: 4.5 is not an integer (a float)"),
    (lambda: replicate(contiguous_split_map((4,), [2, 2], 0), 0), "replicate: copies must be at least 1, got 0"),
])
def test_constructor_refusals_name_the_field(make: Any, message: str) -> None:
    with pytest.raises(InvalidMapError) as info:
        make()
    assert str(info.value) == message


def test_integer_like_values_are_plain_ints() -> None:
    piece = AffinePiece((np.int64(2),), np.int32(1), (1,), 0, (1,), frozenset([np.int64(0)]), np.float32(1.0))
    assert piece == AffinePiece((2,), 1, (1,), 0, (1,), [0])
    assert [type(v) for v in (piece.source_offset, *piece.shape, *piece.locations)] == [int, int, int]
    assert type(piece.scale) is float
    assert is_int(5) and is_int(np.int8(5)) and not is_int(True) and not is_int(5.0) and not is_int("5")
    m = ParamAffineMap((np.int64(2),), {_One(): (2,)}, {np.int64(1): [AffinePiece((2,), 0, (1,), 0, (1,), [1])]})
    assert m.shard_shapes == {1: (2,)} and list(m.pieces_by_rank) == [1]


def test_a_map_is_not_equal_to_a_plain_value_and_hashes_as_its_content() -> None:
    m = contiguous_split_map((4,), [2, 2], 0)
    assert (m == m.to_dict()) is False and m != 5
    assert hash(m) == hash(contiguous_split_map((4,), [2, 2], 0))
    assert len({m, contiguous_split_map((4,), [2, 2], 0), contiguous_split_map((4,), [1, 3], 0)}) == 2


# ---------------------------------------------------------------------------------------------
# piece_arrays


def test_piece_arrays_reads_extents_and_offsets() -> None:
    pieces = [AffinePiece((2, 3), 0, (3, 1), 5, (3, 1), [0]), AffinePiece((1, 3), 6, (3, 1), 0, (3, 1), [1])]
    arrays = piece_arrays(pieces, 2)
    assert arrays is not None
    ext, src, dst = arrays
    assert ext.dtype == np.int64 and src.dtype == np.int64 and dst.dtype == np.int64
    assert ext.tolist() == [[2, 3], [1, 3]] and src.tolist() == [0, 6] and dst.tolist() == [5, 0]
    assert piece_arrays([AffinePiece((2,), 1 << 63, (1,), 0, (1,), [0])], 1) is None
    assert piece_arrays([AffinePiece((2,), 0, (1,), 1 << 63, (1,), [0])], 1) is None
    assert piece_arrays([AffinePiece((1 << 63,), 0, (1,), 0, (1,), [0])], 1) is None


# ---------------------------------------------------------------------------------------------
# Builders, piece by piece


def _pieces(m: ParamAffineMap) -> dict[int, list[tuple[Any, ...]]]:
    return {r: [(p.shape, p.source_offset, p.dest_offset, sorted(p.locations)) for p in ps]
            for r, ps in m.pieces_by_rank.items()}


def test_segmented_map_pieces() -> None:
    # F = (6, 2): rows [0, 4) split over 2 locations as [2, 2], rows [4, 6) replicated.
    m = segmented_map((6, 2), [(4, False), (2, True)], 0, 2, [[2, 2]])
    assert m.shard_shapes == {0: (4, 2), 1: (4, 2)}
    assert _pieces(m) == {
        0: [((2, 2), 0, 0, [0]), ((2, 2), 8, 4, [0, 1])],
        1: [((2, 2), 4, 0, [1]), ((2, 2), 8, 4, [0, 1])],
    }


def test_segmented_map_with_two_split_segments() -> None:
    m = segmented_map((6,), [(2, False), (4, False)], 0, 2, [[1, 1], [3, 1]])
    assert _pieces(m) == {0: [((1,), 0, 0, [0]), ((3,), 2, 1, [0])], 1: [((1,), 1, 0, [1]), ((1,), 5, 1, [1])]}
    with pytest.raises(InvalidMapError):
        segmented_map((6,), [(2, False), (4, False)], 0, 2, [[1, 1]])


def test_sub_param_map_pieces() -> None:
    # F = (6,): sub-parameters of 2 and 4 elements, each split over 2 locations.
    m = sub_param_map((6,), [2, 4], [[1, 1], [3, 1]], 0)
    assert _pieces(m) == {0: [((1,), 0, 0, [0]), ((3,), 2, 1, [0])], 1: [((1,), 1, 0, [1]), ((1,), 5, 1, [1])]}


def test_block_gather_map_merges_runs_of_consecutive_blocks() -> None:
    # 6 blocks of 1 row of F = (6, 2); location 0 gathers blocks 0, 1, 2 and 5, location 1 blocks 3, 4.
    m = block_gather_map((6, 2), {0: [0, 1, 2, 5], 1: [3, 4]}, 1, 0)
    assert _pieces(m) == {0: [((3, 2), 0, 0, [0]), ((1, 2), 10, 6, [0])], 1: [((2, 2), 6, 0, [1])]}
    gaps = block_gather_map((6, 2), {0: [0, 2, 4], 1: [1, 3, 5]}, 1, 0)
    assert _pieces(gaps)[0] == [((1, 2), 0, 0, [0]), ((1, 2), 4, 2, [0]), ((1, 2), 8, 4, [0])]


def test_replicate_names_every_copy() -> None:
    m = replicate(contiguous_split_map((4,), [2, 2], 0), 2)
    assert _pieces(m) == {
        0: [((2,), 0, 0, [0, 2])], 1: [((2,), 2, 0, [1, 3])], 2: [((2,), 0, 0, [0, 2])], 3: [((2,), 2, 0, [1, 3])],
    }
    assert replicate(contiguous_split_map((4,), [2, 2], 0), 1) == contiguous_split_map((4,), [2, 2], 0)
    with pytest.raises(InvalidMapError, match="location"):
        replicate(contiguous_split_map((4,), [2, 2], 0), 2, lambda rank, copy: rank)


def test_three_segments_and_three_sub_parameters_advance_their_starts() -> None:
    # F = (9,): widths [1, 1], [2, 1], [3, 1] of segments (or sub-parameters) 2, 3 and 4 long.
    want = {0: [((1,), 0, 0, [0]), ((2,), 2, 1, [0]), ((3,), 5, 3, [0])],
            1: [((1,), 1, 0, [1]), ((1,), 4, 1, [1]), ((1,), 8, 2, [1])]}
    widths = [[1, 1], [2, 1], [3, 1]]
    assert _pieces(segmented_map((9,), [(2, False), (3, False), (4, False)], 0, 2, widths)) == want
    assert _pieces(sub_param_map((9,), [2, 3, 4], widths, 0)) == want


def test_missing_piece_keys_are_named_one_by_one() -> None:
    entry = {"shape": [2], "source": [0, [1]], "dest": [0, [1]], "locations": [0]}
    for key in ("source", "locations"):
        with pytest.raises(InvalidMapError) as info:
            AffinePiece.from_dict({k: v for k, v in entry.items() if k != key})
        assert str(info.value) == f"piece: piece lacks key(s) ['{key}']"


def test_a_scale_too_large_for_a_float_is_refused() -> None:
    with pytest.raises(InvalidMapError) as info:
        AffinePiece((1,), 0, (1,), 0, (1,), [0], 10**400)
    assert str(info.value).startswith("AffinePiece.scale: 1000") and str(info.value).endswith(" does not fit a float")


def test_maps_and_contents_cannot_lose_a_field() -> None:
    from dataclasses import FrozenInstanceError

    m = contiguous_split_map((4,), [2, 2], 0)
    with pytest.raises(FrozenInstanceError) as info:
        del m.logical_shape
    assert str(info.value) == "cannot delete field 'logical_shape': a ParamAffineMap is immutable"
    with pytest.raises(FrozenInstanceError) as info:
        del m.content.pieces
    assert str(info.value) == "cannot delete 'pieces': a map's content is immutable"


def test_dict_form_of_a_location_without_shard_or_pieces() -> None:
    assert ParamAffineMap((2,), {}, {0: []}).to_dict() == {
        "logical_shape": [2], "ranks": {0: {"shard_shape": None, "pieces": []}},
    }
    with_empty = ParamAffineMap((2,), {0: (2,), 1: (0,)}, {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])]})
    assert replicate(with_empty, 2).to_dict()["ranks"] == {
        0: {"shard_shape": [2], "pieces": [{"shape": [2], "source": [0, [1]], "dest": [0, [1]], "locations": [0, 2]}]},
        1: {"shard_shape": [0], "pieces": []},
        2: {"shard_shape": [2], "pieces": [{"shape": [2], "source": [0, [1]], "dest": [0, [1]], "locations": [0, 2]}]},
        3: {"shard_shape": [0], "pieces": []},
    }


def test_segments_after_a_replicated_one_and_missing_widths() -> None:
    # F = (6,): [0, 2) replicated over both locations, then [2, 6) split [3, 1].
    m = segmented_map((6,), [(2, True), (4, False)], 0, 2, [[3, 1]])
    assert _pieces(m) == {0: [((2,), 0, 0, [0, 1]), ((3,), 2, 2, [0])], 1: [((2,), 0, 0, [0, 1]), ((1,), 5, 2, [1])]}
    with pytest.raises(InvalidMapError) as info:
        segmented_map((6,), [(2, False), (4, False)], 0, 2, [[1, 1]])
    assert str(info.value) == "segmented_map: no split widths for the split segment of 4"


def test_replicate_keeps_the_scale() -> None:
    scaled = ParamAffineMap((2,), {0: (2,)}, {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0], 0.5)]})
    assert [p.scale for ps in replicate(scaled, 2).pieces_by_rank.values() for p in ps] == [0.5, 0.5]
