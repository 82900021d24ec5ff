"""The data model: affine pieces and per-parameter maps, their dict form, and layout builders.

A map says, for one parameter, which boxes of the logical tensor F each *location* holds and
where in its shard. Both sides of a piece are ``torch.as_strided`` arguments (offset and strides in
elements), so a piece can be applied without interpretation. ``locations`` names every location
holding identical data for the piece: it is a relation, not an owner, because choosing a single
owner is the planner's decision (the replica policy), not a fact about the layout.

The dict form is key-for-key the one DeepSpeed's ``ParamAffineMap.to_dict()`` writes
(``{logical_shape, ranks: {rank: {shard_shape, pieces: [{shape, source: [off, strides],
dest: [off, strides], locations, scale?}]}}}``), so a map exported there loads here unchanged.
Construction does no validation beyond normalising types: validation belongs to ``frames``, which
can name the parameter and refuse with the right error class. ``from_dict`` does check *types*,
so hostile JSON gets an ``InvalidMapError`` naming the field instead of a bare ``TypeError``.
"""

from __future__ import annotations

import operator
import re
import reprlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import FrozenInstanceError
from functools import partial
from itertools import chain
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar
from weakref import WeakValueDictionary

import numpy as np

from .box import row_major_strides, volume
from .errors import InvalidMapError

__all__ = [
    "AffinePiece",
    "MapContent",
    "ParamAffineMap",
    "block_gather_map",
    "contiguous_split_map",
    "piece_arrays",
    "replicate",
    "replicated_map",
    "segmented_map",
    "sub_param_map",
]


_INT_ONLY = frozenset([int])


def as_int(value: Any) -> int | None:
    """``value`` as an ``int`` when it is exactly an integer, else ``None``: the one integer rule of
    every constructor and every file reader.

    Exactly an integer means ``int`` (or a subclass) or an integer scalar that says so through
    ``__index__`` (numpy's, a 0-d integer array or tensor); never a ``bool`` (``True`` is an int to
    Python, never a count or an offset to a map), never a float, even an integral one. Why no
    ``int()``: it truncates, so a map written with ``n / 2`` for 2.5 rows would silently become
    another, valid map, be planned and be verified ``ok``: the oracle only ever sees what the
    constructor made of the input.
    """
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _not_int(value: Any, what: str) -> InvalidMapError:
    return InvalidMapError(f"{what}: {describe(value)} is not an integer (a {type(value).__name__})")


def _int(value: Any, what: str) -> int:
    """One integer field, by ``as_int``'s rule; ``what`` names the field in the error."""
    if type(value) is int:
        return value
    converted = as_int(value)
    if converted is None:
        raise _not_int(value, what)
    return converted


def _ints(values: Iterable[Any], what: str) -> tuple[int, ...]:
    """A tuple of integer fields, by ``as_int``'s rule; plain ints (the common case) are checked by
    one C pass over their types, anything else element by element with its index named."""
    try:
        items = tuple(values)
    except TypeError:
        raise InvalidMapError(f"{what}: expected a sequence of integers, got {describe(values)}") from None
    if _INT_ONLY.issuperset(map(type, items)):
        return items
    return tuple([_int(v, f"{what}[{i}]") for i, v in enumerate(items)])


def _locations(values: Iterable[Any]) -> frozenset[int]:
    """A piece's holders: integers by ``as_int``'s rule, each named once (a location listed twice
    is a malformed relation, and the schema's ``uniqueItems`` refuses it in files)."""
    if type(values) is frozenset and _INT_ONLY.issuperset(map(type, values)):
        return values
    items = _ints(values, "AffinePiece.locations")
    held = frozenset(items)
    if len(held) != len(items):
        twice = sorted(v for v, n in Counter(items).items() if n > 1)
        raise InvalidMapError(f"AffinePiece.locations: location(s) {describe(twice)} listed more than once")
    return held


def _scale(value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidMapError(f"AffinePiece.scale: expected a number, got {describe(value)}")
    try:
        return float(value)
    except OverflowError:
        raise InvalidMapError(f"AffinePiece.scale: {describe(value)} does not fit a float") from None


class _PieceFields(NamedTuple):
    """The seven fields of a piece, in order (the storage of ``AffinePiece``)."""

    shape: tuple[int, ...]
    source_offset: int
    source_strides: tuple[int, ...]
    dest_offset: int
    dest_strides: tuple[int, ...]
    locations: frozenset[int]
    scale: float = 1.0


_Piece = TypeVar("_Piece", bound="AffinePiece")


class AffinePiece(_PieceFields):
    """A block held identically in F (``source_*``) and in a shard (``dest_*``).

    ``shape`` is shared by both sides: same elements, same arrangement. ``scale`` is the factor
    the shard holds the block by (``shard == full * scale``); refplan plans only scale 1 and
    refuses others with ``UnsupportedLayoutError``, but the field is kept so such maps load.

    A piece is an immutable value: a named tuple of its seven fields (``FIELDS``), converted as
    it is built (ints, tuples of ints, a frozenset of locations, a float scale) and read by name.
    Why a tuple and not a frozen dataclass: a map is recognized by its content as it is built
    (``MapContent``: equal maps share one), and a tuple's hash and equality run in C over
    exactly those fields, where a dataclass's generated ``__hash__`` and ``__eq__`` are a Python
    call per piece (or a field-by-field copy to key on). And a field cannot be forced afterwards
    (``object.__setattr__`` has nothing to set), so what the key saw is what validation reads.
    Equal to a plain tuple of the same fields, like any named tuple; only maps whose pieces are
    exactly this class share their content. Every way of
    making one (``AffinePiece(...)``, ``replace``, ``_replace``, ``_make``, copies, pickles) goes
    through the constructor's conversions and checks.
    """

    __slots__ = ()

    FIELDS: ClassVar[tuple[str, ...]] = _PieceFields._fields
    """The field names, in the tuple's order (``dataclasses.fields`` of the former dataclass)."""

    def __new__(
        cls,
        shape: Sequence[int],
        source_offset: int,
        source_strides: Sequence[int],
        dest_offset: int,
        dest_strides: Sequence[int],
        locations: Iterable[int],
        scale: float = 1.0,
    ) -> AffinePiece:
        piece = tuple.__new__(cls, (
            _ints(shape, "AffinePiece.shape"), _int(source_offset, "AffinePiece.source_offset"),
            _ints(source_strides, "AffinePiece.source_strides"), _int(dest_offset, "AffinePiece.dest_offset"),
            _ints(dest_strides, "AffinePiece.dest_strides"), _locations(locations), _scale(scale),
        ))
        if piece[6] == 0.0:
            raise InvalidMapError("a zero scale is not invertible, so F could not be rebuilt from the shard")
        return piece

    @classmethod
    def _make(cls: type[_Piece], iterable: Iterable[Any]) -> _Piece:  # type: ignore[override]
        # Only pieces are made here (the base's may make any tuple of its type, unconverted).
        return cls(*iterable)

    def _replace(self: _Piece, **changes: Any) -> _Piece:
        return self.replace(**changes)

    def replace(self: _Piece, **changes: Any) -> _Piece:
        """This piece with some fields changed, built (and converted) like a new one."""
        unknown = set(changes) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"AffinePiece has no field(s) {sorted(unknown)}")
        return type(self)(**{**self._asdict(), **changes})

    @property
    def numel(self) -> int:
        return volume(self.shape)

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "shape": list(self.shape),
            "source": [self.source_offset, list(self.source_strides)],
            "dest": [self.dest_offset, list(self.dest_strides)],
            "locations": sorted(self.locations),
        }
        if self.scale != 1.0:
            entry["scale"] = self.scale
        return entry

    @classmethod
    def from_dict(cls, entry: Any, where: str = "piece") -> AffinePiece:
        return _parse_piece(entry, lambda: where)


_MISSING = object()
_PIECE_KEYS = ("shape", "source", "dest", "locations")
LOCATION_KEY = re.compile(r"-?[0-9]{1,4000}")
"""A location (or other integer) key written as a JSON object key: ASCII decimal digits with an
optional minus sign, at most 4000 of them (Python's ``int()`` refuses more than 4300 digits, so a
longer key is refused here, by name, instead of by a bare ``ValueError``). The one pattern for
map, endpoint and file keys."""
_SHOW = reprlib.Repr()
_SHOW.maxlevel = 3
_SHOW.maxstring = 60
_SHOW.maxother = 60
_SHOW.maxlong = 60


def describe(value: Any) -> str:
    """A bounded ``repr`` for error messages: depth, length and digits are capped.

    Hostile input can be a deeply nested list, a list of a million floats or an integer with
    thousands of digits; a plain ``repr`` would recurse, allocate per element or take quadratic
    time before the message is even truncated.
    """
    try:
        return _SHOW.repr(value)
    except Exception:  # a hostile object's own __repr__ may raise anything
        return f"<{type(value).__name__}>"


def is_int(value: Any) -> bool:
    """Whether ``value`` is exactly an integer by ``as_int``'s rule (never a ``bool`` or a float):
    the loaders' test, the same rule the constructors apply."""
    return type(value) is int or as_int(value) is not None


def parse_int_key(key: Any) -> int | None:
    """An integer object key (an int, or a ``LOCATION_KEY`` string, surrounding spaces allowed) as
    an int, or ``None`` when it is not one; the caller words the error."""
    if is_int(key):
        return int(key)
    if isinstance(key, str):
        text = key.strip()
        if LOCATION_KEY.fullmatch(text):
            return int(text)
    return None


def _int_list(value: Any, where: Callable[[], str]) -> list[int]:
    if type(value) is list and all(type(v) is int for v in value):  # the JSON fast path
        return value
    if not isinstance(value, (list, tuple)) or not all(is_int(v) for v in value):
        raise InvalidMapError(f"{where()}: expected a list of integers, got {describe(value)}")
    return list(value)


def _offset_strides(value: Any, where: Callable[[], str]) -> tuple[int, list[int]]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not is_int(value[0]):
        raise InvalidMapError(f"{where()}: expected [offset, [strides...]], got {describe(value)}")
    return value[0], _int_list(value[1], lambda: f"{where()}[1]")


def _parse_piece(entry: Any, where: Callable[[], str]) -> AffinePiece:
    """One piece from its dict form; ``where`` names it, and is only called to build an error."""
    if not isinstance(entry, Mapping):
        raise InvalidMapError(f"{where()}: a piece must be an object, got {type(entry).__name__}")
    shape = entry.get("shape", _MISSING)
    source = entry.get("source", _MISSING)
    dest = entry.get("dest", _MISSING)
    locations = entry.get("locations", _MISSING)
    if shape is _MISSING or source is _MISSING or dest is _MISSING or locations is _MISSING:
        missing = [k for k in _PIECE_KEYS if k not in entry]
        raise InvalidMapError(f"{where()}: piece lacks key(s) {missing}")
    shape_l = _int_list(shape, lambda: f"{where()}.shape")
    src_off, src_strides = _offset_strides(source, lambda: f"{where()}.source")
    dst_off, dst_strides = _offset_strides(dest, lambda: f"{where()}.dest")
    locations_l = _int_list(locations, lambda: f"{where()}.locations")
    if len(set(locations_l)) != len(locations_l):
        twice = sorted(v for v, n in Counter(locations_l).items() if n > 1)
        raise InvalidMapError(f"{where()}.locations: location(s) {describe(twice)} listed more than once")
    scale = entry.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise InvalidMapError(f"{where()}.scale: expected a number, got {describe(scale)}")
    try:
        scale_f = float(scale)
    except OverflowError:
        raise InvalidMapError(f"{where()}.scale: {describe(scale)} does not fit a float") from None
    return AffinePiece(shape_l, src_off, src_strides, dst_off, dst_strides, locations_l, scale_f)


class MapContent:
    """What a map holds, immutable all the way down, and shared by every map equal to it.

    Models repeat layouts: each layer of a transformer has the same maps, and an MoE model has
    tens of thousands of expert weights over a few dozen layouts. The planner and the oracle
    validate each distinct layout once and must recognize every parameter that has it. Comparing
    each parameter's maps with an earlier one's, field by field, was most of the planner's time on
    such batches (touching every parameter's own objects is the cost, not the Python: see
    docs/performance.md). So a map is *hash-consed* as it is built: its converted content is
    looked up in a table of the contents alive now, and a map equal to one already built (same
    logical shape, same shard shapes and pieces per location, in the same order, every piece
    exactly an ``AffinePiece``) gets that one's ``MapContent``. Equal content is then the same
    object, and recognizing a layout is one identity test.

    Sound because nothing in it can change: its attributes cannot be assigned or deleted, the
    shape and shard shapes are tuples of ints, the pieces are immutable tuples (``AffinePiece``),
    and both mappings are read-only views of dicts no caller holds. (Like every frozen object of
    refplan's, its attribute slots can still be forced with ``object.__setattr__``; a content is
    never handed to a policy, so only a caller's own code could do that, and doing so is outside
    the contract.) The table holds contents weakly: a content lives as long as a map uses it.
    A map whose pieces are not all exactly ``AffinePiece`` (a plain tuple equal to a piece, a
    subclass that could compare equal while meaning something else) gets a content of its own
    (``_UnsharedContent``) that is never recognized as another's.
    """

    __slots__ = ("__weakref__", "logical_shape", "pieces", "pieces_by_rank", "shard_shapes")
    logical_shape: tuple[int, ...]
    shard_shapes: Mapping[int, tuple[int, ...]]
    pieces_by_rank: Mapping[int, tuple[AffinePiece, ...]]
    pieces: int

    def __init__(
        self,
        logical_shape: tuple[int, ...],
        shard_shapes: Mapping[int, tuple[int, ...]],
        pieces_by_rank: Mapping[int, tuple[AffinePiece, ...]],
        pieces: int,
    ) -> None:
        _set(self, "logical_shape", logical_shape)
        _set(self, "shard_shapes", shard_shapes)
        _set(self, "pieces_by_rank", pieces_by_rank)
        _set(self, "pieces", pieces)  # how many, over every location

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to {name!r}: a map's content is immutable")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete {name!r}: a map's content is immutable")


_set = object.__setattr__


class _UnsharedContent(MapContent):
    """The content of a map that holds something other than exact ``AffinePiece`` pieces: its own,
    never shared, never recognized as equal to another map's (it is validated, and refused, alone)."""

    __slots__ = ()


_CONTENTS: WeakValueDictionary[tuple[Any, ...], MapContent] = WeakValueDictionary()
_EXACT_PIECE = frozenset([AffinePiece])


def _content(
    logical_shape: tuple[int, ...], shard_shapes: dict[int, tuple[int, ...]], pieces_by_rank: dict[int, tuple[Any, ...]]
) -> MapContent:
    """The shared content equal to these converted fields, made and remembered if none is alive."""
    kinds = [*map(type, chain.from_iterable(pieces_by_rank.values()))]
    if not _EXACT_PIECE.issuperset(kinds):
        return _UnsharedContent(
            logical_shape, MappingProxyType(shard_shapes), MappingProxyType(pieces_by_rank), len(kinds)
        )
    key = (logical_shape, tuple(shard_shapes.items()), tuple(pieces_by_rank.items()))
    found = _CONTENTS.get(key)
    if found is None:
        found = MapContent(logical_shape, MappingProxyType(shard_shapes), MappingProxyType(pieces_by_rank), len(kinds))
        # Two threads building equal maps at once may still each keep a content of their own:
        # that loses sharing, never soundness (one object always means one content).
        found = _CONTENTS.setdefault(key, found)
    return found


class ParamAffineMap:
    """How one parameter is spread over locations: ``shard_shapes`` and ``pieces_by_rank``.

    Keys are *location* ids of this map, not process ranks: a source location 0 and a target
    location 0 are unrelated until ``TransferEndpoints`` binds them to processes.

    An immutable value: the fields are read-only (``shard_shapes`` and ``pieces_by_rank`` are
    read-only mappings), and every map equal to one already built shares that one's
    ``MapContent`` (``content``), so what the planner or the oracle validated for one map is what
    every map with the same ``content`` holds. Copies and pickles are rebuilt through the
    constructor.
    """

    __slots__ = ("_content",)
    _content: MapContent

    def __init__(
        self,
        logical_shape: Sequence[int],
        shard_shapes: Mapping[int, Sequence[int]],
        pieces_by_rank: Mapping[int, Sequence[AffinePiece]],
    ) -> None:
        shards: dict[int, tuple[int, ...]] = {}
        for r, s in shard_shapes.items():
            key = _int(r, "ParamAffineMap.shard_shapes key")
            shards[key] = _ints(s, f"ParamAffineMap.shard_shapes[{key}]")
        held: dict[int, tuple[Any, ...]] = {}
        for r, p in pieces_by_rank.items():
            held[_int(r, "ParamAffineMap.pieces_by_rank key")] = tuple(p)
        if len(shards) != len(shard_shapes) or len(held) != len(pieces_by_rank):
            raise InvalidMapError("ParamAffineMap: two keys name one location (e.g. 1 and numpy's 1)")
        logical = _ints(logical_shape, "ParamAffineMap.logical_shape")
        object.__setattr__(self, "_content", _content(logical, shards, held))

    @property
    def logical_shape(self) -> tuple[int, ...]:
        return self._content.logical_shape

    @property
    def shard_shapes(self) -> Mapping[int, tuple[int, ...]]:
        return self._content.shard_shapes

    @property
    def pieces_by_rank(self) -> Mapping[int, tuple[AffinePiece, ...]]:
        return self._content.pieces_by_rank

    @property
    def content(self) -> MapContent:
        """The shared, immutable content: two maps with the same ``content`` object are equal."""
        return self._content

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: a ParamAffineMap is immutable")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}: a ParamAffineMap is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParamAffineMap) or other.__class__ is not self.__class__:
            return NotImplemented
        mine, theirs = self._content, other._content
        return mine is theirs or (
            mine.logical_shape == theirs.logical_shape
            and mine.shard_shapes == theirs.shard_shapes
            and mine.pieces_by_rank == theirs.pieces_by_rank
        )

    def __hash__(self) -> int:
        return hash(self._content.logical_shape)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(logical_shape={self.logical_shape!r}, "
                f"shard_shapes={dict(self.shard_shapes)!r}, pieces_by_rank={dict(self.pieces_by_rank)!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.logical_shape, dict(self.shard_shapes), dict(self.pieces_by_rank)))

    @property
    def numel(self) -> int:
        return volume(self.logical_shape)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every location named by a shard shape or a piece list, sorted."""
        return tuple(sorted(set(self.shard_shapes) | set(self.pieces_by_rank)))

    def piece_count(self) -> int:
        return sum(len(p) for p in self.pieces_by_rank.values())

    def to_dict(self) -> dict[str, Any]:
        """DeepSpeed's layout; a location with pieces but no shard shape gets ``shard_shape: None``."""
        ranks: dict[int, Any] = {}
        for rank in self.ranks:
            shard = self.shard_shapes.get(rank)
            ranks[rank] = {
                "shard_shape": list(shard) if shard is not None else None,
                "pieces": [p.to_dict() for p in self.pieces_by_rank.get(rank, ())],
            }
        return {"logical_shape": list(self.logical_shape), "ranks": ranks}

    @classmethod
    def from_dict(cls, entry: Any, where: str = "$") -> ParamAffineMap:
        """Load DeepSpeed's dict form; JSON's string rank keys are accepted.

        Only types are checked here (geometry is ``frames``' job), but every malformed value is an
        ``InvalidMapError`` naming the field, and two keys naming one location ("0" and 0, or
        "0" and "00") are refused rather than letting the later one win. Error locations are
        formatted only when an error is raised, so parsing costs no per-piece string work.
        ``where`` is the map's JSON path (``$`` for a map document of its own); every error names
        the field's path below it, in the one notation of every message (``_field_name``).
        """
        if not isinstance(entry, Mapping):
            raise InvalidMapError(f"{where}: a map must be an object, got {type(entry).__name__}")
        if "logical_shape" not in entry or "ranks" not in entry:
            raise InvalidMapError(f"{where}: a map needs 'logical_shape' and 'ranks'")
        logical = _int_list(entry["logical_shape"], lambda: f"{where}.logical_shape")
        ranks = entry["ranks"]
        if not isinstance(ranks, Mapping):
            raise InvalidMapError(f"{where}.ranks: expected an object keyed by location")
        shard_shapes: dict[int, Sequence[int]] = {}
        pieces_by_rank: dict[int, list[AffinePiece]] = {}
        for key, value in ranks.items():
            rank = _rank_key(key, where)
            if rank in pieces_by_rank:
                raise InvalidMapError(f"{where}.ranks: location {rank} is listed twice")
            if not isinstance(value, Mapping) or "pieces" not in value:
                raise InvalidMapError(f"{_field_name(where, key)}: expected {{shard_shape, pieces}}")
            shard = value.get("shard_shape")
            if shard is not None:
                shard_shapes[rank] = _int_list(shard, partial(_field_name, where, key, "shard_shape"))
            raw = value["pieces"]
            if not isinstance(raw, (list, tuple)):
                raise InvalidMapError(f"{_field_name(where, key, 'pieces')}: expected a list, got {type(raw).__name__}")
            pieces: list[AffinePiece] = []
            for i, p in enumerate(raw):
                pieces.append(_parse_piece(p, partial(_field_name, where, key, f"pieces[{i}]")))
            pieces_by_rank[rank] = pieces
        return cls(logical, shard_shapes, pieces_by_rank)


def _field_name(where: str, key: Any, field: str | None = None) -> str:
    """The JSON path of location ``key``'s ``field`` below the map at ``where``.

    One notation in every message (``$`` the root, ``.key`` for identifier-like keys,
    ``["key"]`` for others, ``[i]`` for indices): a location is an object key as the file spells
    it (``ranks["0"]``, found by searching the file for ``"0"``), not a list index.
    """
    import json  # only when an error is being written

    text = str(key)
    name = f".{text}" if text.isidentifier() and text.isascii() else f"[{json.dumps(text)[:80]}]"
    return f"{where}.ranks{name}" + ("" if field is None else f".{field}")


def _rank_key(key: Any, where: str) -> int:
    """A location key: an int, or a decimal string of ASCII digits (JSON object keys are strings)."""
    value = parse_int_key(key)
    if value is not None:
        return value
    raise InvalidMapError(f"{where}.ranks: location key {describe(key)} is not an integer")


# ---------------------------------------------------------------------------------------------
# Builders. Each returns a valid map for valid arguments; they exist so tests and users can say
# "TP=4 row split" in one line, and they match DeepSpeed's builders piece for piece.


def replicated_map(shape: Sequence[int], tp_degree: int, scale: float = 1.0) -> ParamAffineMap:
    """Every location ``0..tp_degree-1`` holds all of F as one piece naming all of them."""
    shape_t = _ints(shape, "shape")
    strides = row_major_strides(shape_t)
    ranks = list(range(tp_degree))
    piece = AffinePiece(shape_t, 0, strides, 0, strides, ranks, scale)
    return ParamAffineMap(shape_t, {r: shape_t for r in ranks}, {r: [piece] for r in ranks})


def contiguous_split_map(
    shape: Sequence[int], per_rank_sizes: Sequence[int], partition_dim: int
) -> ParamAffineMap:
    """Location r holds one contiguous block of ``per_rank_sizes[r]`` along ``partition_dim``."""
    shape_t = _ints(shape, "shape")
    strides = row_major_strides(shape_t)
    shard_shapes: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    start = 0
    for rank, size in enumerate(per_rank_sizes):
        shard = list(shape_t)
        shard[partition_dim] = size
        shard_t = tuple(shard)
        shard_shapes[rank] = shard_t
        pieces[rank] = [
            AffinePiece(shard_t, start * strides[partition_dim], strides, 0, row_major_strides(shard_t), [rank])
        ]
        start += size
    return ParamAffineMap(shape_t, shard_shapes, pieces)


def sub_param_map(
    shape: Sequence[int],
    sub_dim_sizes: Sequence[int],
    shard_widths: Sequence[Sequence[int]],
    partition_dim: int,
) -> ParamAffineMap:
    """F is sub-parameters (e.g. Q, K, V) concatenated on ``partition_dim``, each split.

    ``shard_widths[i][r]`` is location r's width of sub-parameter i; a shard holds its slice of
    each sub-parameter in order. Zero widths give empty pieces, which the planner skips.
    """
    shape_t = _ints(shape, "shape")
    strides = row_major_strides(shape_t)
    degree = len(shard_widths[0])
    shard_shapes: dict[int, tuple[int, ...]] = {}
    for rank in range(degree):
        shard = list(shape_t)
        shard[partition_dim] = sum(w[rank] for w in shard_widths)
        shard_shapes[rank] = tuple(shard)
    pieces: dict[int, list[AffinePiece]] = {r: [] for r in range(degree)}
    dest_start = dict.fromkeys(range(degree), 0)
    sub_start = 0
    for index, sub_size in enumerate(sub_dim_sizes):
        widths = shard_widths[index]
        src = sub_start
        for rank in range(degree):
            piece_shape = list(shape_t)
            piece_shape[partition_dim] = widths[rank]
            dest_strides = row_major_strides(shard_shapes[rank])
            pieces[rank].append(
                AffinePiece(
                    piece_shape,
                    src * strides[partition_dim],
                    strides,
                    dest_start[rank] * dest_strides[partition_dim],
                    dest_strides,
                    [rank],
                )
            )
            src += widths[rank]
            dest_start[rank] += widths[rank]
        sub_start += sub_size
    return ParamAffineMap(shape_t, shard_shapes, pieces)


def segmented_map(
    shape: Sequence[int],
    segments: Sequence[tuple[int, bool]],
    partition_dim: int,
    tp_degree: int,
    split_widths: Sequence[Sequence[int]],
) -> ParamAffineMap:
    """Blocks along ``partition_dim`` that are either split or replicated (the bigcode layout).

    ``segments`` is ``[(size, replicated), ...]`` covering the axis. Split segments take the next
    entry of ``split_widths`` (explicit, because the widths a layer really uses are not always an
    even division, and a map built by dividing would read the wrong rows yet still validate).
    """
    shape_t = _ints(shape, "shape")
    strides = row_major_strides(shape_t)
    ranks = list(range(tp_degree))
    widths_of: list[list[int] | None] = []
    split_index = 0
    for size, replicated in segments:
        if replicated:
            widths_of.append(None)
            continue
        if split_index >= len(split_widths):
            raise InvalidMapError(f"segmented_map: no split widths for the split segment of {size}")
        split = list(split_widths[split_index])
        split_index += 1
        if len(split) != tp_degree or sum(split) != size:
            raise InvalidMapError(
                f"segmented_map: split widths {split} do not account for a segment of {size} "
                f"across {tp_degree} locations"
            )
        widths_of.append(split)
    shard_shapes: dict[int, tuple[int, ...]] = {}
    for rank in ranks:
        extent = sum(size if w is None else w[rank] for (size, _), w in zip(segments, widths_of))
        shard = list(shape_t)
        shard[partition_dim] = extent
        shard_shapes[rank] = tuple(shard)
    pieces: dict[int, list[AffinePiece]] = {r: [] for r in ranks}
    dest_start = dict.fromkeys(ranks, 0)
    src_start = 0
    for (size, _replicated), widths in zip(segments, widths_of):
        for rank in ranks:
            extent = size if widths is None else widths[rank]
            offset = src_start if widths is None else src_start + sum(widths[:rank])
            piece_shape = list(shape_t)
            piece_shape[partition_dim] = extent
            dest_strides = row_major_strides(shard_shapes[rank])
            pieces[rank].append(
                AffinePiece(
                    piece_shape,
                    offset * strides[partition_dim],
                    strides,
                    dest_start[rank] * dest_strides[partition_dim],
                    dest_strides,
                    ranks if widths is None else [rank],
                )
            )
            dest_start[rank] += extent
        src_start += size
    return ParamAffineMap(shape_t, shard_shapes, pieces)


def block_gather_map(
    shape: Sequence[int],
    block_ids_by_rank: Mapping[int, Sequence[int]],
    block_size: int,
    partition_dim: int,
) -> ParamAffineMap:
    """Each location holds its listed equal-size blocks (not necessarily adjacent), packed in order.

    Runs of consecutive ids become one piece (Yuan shared-QK); locations are the dict keys.
    """
    shape_t = _ints(shape, "shape")
    strides = row_major_strides(shape_t)
    shard_shapes: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    for rank, ids in block_ids_by_rank.items():
        shard = list(shape_t)
        shard[partition_dim] = len(ids) * block_size
        shard_shapes[rank] = tuple(shard)
        dest_strides = row_major_strides(shard_shapes[rank])
        out: list[AffinePiece] = []
        dest_block = 0
        index = 0
        while index < len(ids):
            run = 1
            while index + run < len(ids) and ids[index + run] == ids[index + run - 1] + 1:
                run += 1
            piece_shape = list(shape_t)
            piece_shape[partition_dim] = run * block_size
            out.append(
                AffinePiece(
                    piece_shape,
                    ids[index] * block_size * strides[partition_dim],
                    strides,
                    dest_block * block_size * dest_strides[partition_dim],
                    dest_strides,
                    [rank],
                )
            )
            dest_block += run
            index += run
        pieces[rank] = out
    return ParamAffineMap(shape_t, shard_shapes, pieces)


def replicate(
    tp_map: ParamAffineMap,
    copies: int,
    location_of: Callable[[int, int], int] | None = None,
) -> ParamAffineMap:
    """Turn a TP map into a TP×DP map where each TP location's shard is held by ``copies`` locations.

    This is the ZeRO-1/2 trainer layout: every data-parallel replica holds the same TP shard.
    ``location_of(tp_location, copy)`` names the new location; the default puts TP innermost
    (``copy * n + index``, where ``index`` is the TP location's position among the sorted ones),
    the Megatron rank order. Each piece's ``locations`` becomes every copy of every location it
    named, so the replicas are exact holders and the planner sees them as candidates.
    """
    if copies < 1:
        raise InvalidMapError(f"replicate: copies must be at least 1, got {copies}")
    order = {rank: i for i, rank in enumerate(tp_map.ranks)}
    width = len(order)

    def default(rank: int, copy: int) -> int:
        return copy * width + order[rank]

    name = location_of or default
    shard_shapes: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    for rank in tp_map.ranks:
        for copy in range(copies):
            new = name(rank, copy)
            if new in shard_shapes or new in pieces:
                raise InvalidMapError(f"replicate: location_of maps two (location, copy) pairs to {new}")
            if rank in tp_map.shard_shapes:
                shard_shapes[new] = tp_map.shard_shapes[rank]
            pieces[new] = [
                AffinePiece(
                    p.shape,
                    p.source_offset,
                    p.source_strides,
                    p.dest_offset,
                    p.dest_strides,
                    sorted({name(loc, c) for loc in p.locations if loc in order for c in range(copies)}),
                    p.scale,
                )
                for p in tp_map.pieces_by_rank.get(rank, ())
            ]
    return ParamAffineMap(tp_map.logical_shape, shard_shapes, pieces)


def piece_arrays(pieces: Sequence[AffinePiece], ndim: int) -> tuple[np.ndarray[Any, Any], ...] | None:
    """(extents ``(n, ndim)``, source offsets ``(n,)``, dest offsets ``(n,)``) of ``pieces`` as int64
    arrays, or ``None`` when a value does not fit int64.

    Only reads fields: the caller checks that every shape has ``ndim`` axes first (the extents
    are read flattened, ``n * ndim`` values) and decides what the values mean. For the planner's
    and the oracle's array paths, which then validate them, each with its own rules.
    """
    n = len(pieces)
    try:
        flat = chain.from_iterable([p.shape for p in pieces])
        ext = np.fromiter(flat, dtype=np.int64, count=n * ndim).reshape(n, ndim)
        src = np.fromiter((p.source_offset for p in pieces), dtype=np.int64, count=n)
        dst = np.fromiter((p.dest_offset for p in pieces), dtype=np.int64, count=n)
    except (OverflowError, TypeError, ValueError):
        return None
    return ext, src, dst


def split(n: int, d: int) -> list[int]:
    """``n`` over ``d`` locations, the first ``n % d`` one larger: DeepSpeed's (and Megatron's)
    uneven split, and the one place refplan states it (layouts, scenarios, tests)."""
    base, extra = divmod(n, d)
    return [base + (1 if r < extra else 0) for r in range(d)]


def _bigcode(tp: int) -> ParamAffineMap:
    return segmented_map((48, 8), [(32, False), (16, True)], 0, tp, [split(32, tp)])


def _yuan_gather(tp: int) -> ParamAffineMap:
    return block_gather_map((8, 64), {r: [h for h in range(8) if h % tp == r] for r in range(tp)}, 8, 1)


LAYOUTS: dict[str, Callable[[int], ParamAffineMap]] = {
    "row_even": lambda tp: contiguous_split_map((8, 8), split(8, tp), 0),
    "row_uneven": lambda tp: contiguous_split_map((11, 8), split(11, tp), 0),
    "column": lambda tp: contiguous_split_map((8, 24), split(24, tp), 1),
    "replicated": lambda tp: replicated_map((5, 6), tp),
    "sub_params": lambda tp: sub_param_map((12, 8), (8, 4), [split(8, tp), split(4, tp)], 0),
    "bigcode": _bigcode,
    "yuan_gather": _yuan_gather,
}
"""The accepted layouts of facts §4.6 (DeepSpeed's executed-coverage suite), each as a builder of
the map at tensor-parallel degree ``tp``: the one copy the corpus generator, the peer tests and
the property tests draw from."""
