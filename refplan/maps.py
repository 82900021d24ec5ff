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
from dataclasses import FrozenInstanceError, dataclass
from functools import partial
from itertools import chain, product
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar
from weakref import ref as weak_ref

import numpy as np

from ._gc import cycle_collection_paused
from .box import row_major_strides, volume
from .errors import _HUGE_BITS, InvalidMapError, show_int, type_name

__all__ = [
    "AffinePiece",
    "MapContent",
    "ParallelLayout",
    "ParamAffineMap",
    "block_gather_map",
    "contiguous_split_map",
    "parallel_map",
    "parallel_maps",
    "parallel_pairs",
    "piece_arrays",
    "replicate",
    "replicated_map",
    "runs_map",
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
    except MemoryError:
        raise
    except Exception:  # an ``__index__`` that raises anything says "not an integer"
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
    exactly this class share their content. Every public way of
    making one (``AffinePiece(...)``, ``replace``, ``_replace``, ``_make``, copies, pickles) goes
    through the constructor's conversions and checks. This module's builders and readers make
    pieces of values they have already converted by the same rule (``_piece``, issue 27): each
    argument or document field is converted once, not once per piece it ends up in.
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


class _Show(reprlib.Repr):
    """``reprlib.Repr`` that words a huge integer by its length instead of failing on it."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _HUGE_BITS:
            return show_int(x)  # the one wording of a huge integer
        return super().repr_int(x, level)


_SHOW = _Show()
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
        return f"<{type_name(value)}>"


def is_int(value: Any) -> bool:
    """Whether ``value`` is exactly an integer by ``as_int``'s rule (never a ``bool`` or a float):
    the loaders' test, the same rule the constructors apply."""
    return type(value) is int or as_int(value) is not None


def parse_int_key(key: Any) -> int | None:
    """An integer object key (an int, or a ``LOCATION_KEY`` string, surrounding spaces allowed) as
    an int, or ``None`` when it is not one; the caller words the error."""
    if is_int(key):
        return operator.index(key)  # the integer rule's value, never ``__int__``'s
    if isinstance(key, str):
        text = key.strip()
        if LOCATION_KEY.fullmatch(text):
            return int(text)
    return None


def _int_list(value: Any, where: Callable[[], str], field: str = "") -> tuple[int, ...]:
    """A list of integers from a document, as a tuple of plain ints; ``where() + field`` names it
    (``where`` is only called to write an error). A JSON list of ints (the case of every file) is
    checked by one C pass over its types."""
    if type(value) is list and _INT_ONLY.issuperset(map(type, value)):  # the JSON fast path
        return tuple(value)
    if not isinstance(value, (list, tuple)) or not all(is_int(v) for v in value):
        raise InvalidMapError(f"{where()}{field}: expected a list of integers, got {describe(value)}")
    return tuple([v if type(v) is int else operator.index(v) for v in value])


def _offset_strides(value: Any, where: Callable[[], str], field: str) -> tuple[int, tuple[int, ...]]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not is_int(value[0]):
        raise InvalidMapError(f"{where()}{field}: expected [offset, [strides...]], got {describe(value)}")
    offset = value[0]
    return (offset if type(offset) is int else operator.index(offset)), _int_list(value[1], where, f"{field}[1]")


def _parse_piece(entry: Any, where: Callable[[], str]) -> AffinePiece:
    """One piece from its dict form; ``where`` names it, and is only called to build an error.

    Every field is checked here, by ``as_int``'s rule, with its path named; the piece is then made
    of the converted values directly (``_piece``), not converted a second time by
    ``AffinePiece(...)`` (a file of 10⁵ pieces spent most of its parsing there).
    """
    if not isinstance(entry, Mapping):
        raise InvalidMapError(f"{where()}: a piece must be an object, got {type(entry).__name__}")
    shape = entry.get("shape", _MISSING)
    source = entry.get("source", _MISSING)
    dest = entry.get("dest", _MISSING)
    locations = entry.get("locations", _MISSING)
    if shape is _MISSING or source is _MISSING or dest is _MISSING or locations is _MISSING:
        missing = [k for k in _PIECE_KEYS if k not in entry]
        raise InvalidMapError(f"{where()}: piece lacks key(s) {missing}")
    exact = _INT_ONLY.issuperset
    # The JSON case inline (lists of ints, ``[int, [ints]]``); anything else by the helpers, which
    # convert what is an integer by ``as_int``'s rule and name what is not.
    shape_t = tuple(shape) if type(shape) is list and exact(map(type, shape)) else _int_list(shape, where, ".shape")
    if type(source) is list and len(source) == 2 and type(source[0]) is int and type(source[1]) is list \
            and exact(map(type, source[1])):
        src_off, src_strides = source[0], tuple(source[1])
    else:
        src_off, src_strides = _offset_strides(source, where, ".source")
    if type(dest) is list and len(dest) == 2 and type(dest[0]) is int and type(dest[1]) is list \
            and exact(map(type, dest[1])):
        dst_off, dst_strides = dest[0], tuple(dest[1])
    else:
        dst_off, dst_strides = _offset_strides(dest, where, ".dest")
    listed = type(locations) is list and exact(map(type, locations))
    locations_t = tuple(locations) if listed else _int_list(locations, where, ".locations")
    held = frozenset(locations_t)
    if len(held) != len(locations_t):
        twice = sorted(v for v, n in Counter(locations_t).items() if n > 1)
        raise InvalidMapError(f"{where()}.locations: location(s) {describe(twice)} listed more than once")
    scale = entry.get("scale", 1.0)
    if type(scale) is not float:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise InvalidMapError(f"{where()}.scale: expected a number, got {describe(scale)}")
        try:
            scale = float(scale)
        except OverflowError:
            raise InvalidMapError(f"{where()}.scale: {describe(scale)} does not fit a float") from None
    if scale == 0.0:
        raise InvalidMapError(
            f"{where()}.scale: a zero scale is not invertible, so F could not be rebuilt from the shard")
    return _piece(shape_t, src_off, src_strides, dst_off, dst_strides, held, scale)


class _Unknown:
    """The type of ``UNKNOWN``: a content's slab structure not worked out yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __reduce__(self) -> str:
        return "UNKNOWN"  # unpickled as this module's one instance


UNKNOWN = _Unknown()

SlabSpan = tuple[int, int, tuple[int, ...], tuple[int, ...]]
"""One distinct box of a slab map along its axis: (first index, extent, the locations holding it
sorted, its shard strides)."""

SlabFacts = tuple[int | None, tuple[SlabSpan, ...]]
"""A slab map's structure: (axis, its distinct boxes by first index), the axis ``None`` when the
one box is all of F (its span is then along axis 0). ``planner._slab_structure`` defines when a
map is one; the builders that can tell from their arguments alone say so as they build
(``_split_copies``, ``replicated_map``, ``_widened_facts``), which spares the planner a pass over
every location of a map it sees once (every parameter's shape distinct). tests/test_slab_facts.py
holds every builder's record equal to what the planner works out from the pieces."""


class _ContentSlots:
    """``MapContent``'s slots, in a base of their own so that a builder can fill a new content in
    as an ``_OpenContent`` and then make it a ``MapContent`` (see ``_new_content``)."""

    __slots__ = ("__weakref__", "logical_shape", "pieces", "pieces_by_rank", "shard_shapes", "slabs")
    logical_shape: tuple[int, ...]
    shard_shapes: Mapping[int, tuple[int, ...]]
    pieces_by_rank: Mapping[int, tuple[AffinePiece, ...]]
    pieces: int
    slabs: SlabFacts | _Unknown | None
    """The map's slab structure (``SlabFacts``), ``None`` if it is not a slab map, or ``UNKNOWN``
    until someone works it out: a pure function of the content, so it is filled in at most once
    (by the builder that made the pieces, or by the planner's ``_slab_side`` the first time it
    looks) and never changes the content's meaning."""


class MapContent(_ContentSlots):
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

    __slots__ = ()

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
        _set(self, "slabs", UNKNOWN)

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to {name!r}: a map's content is immutable")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete {name!r}: a map's content is immutable")


_set = object.__setattr__


class _OpenContent(_ContentSlots):
    """A content being filled in by a builder: ``MapContent``'s layout without its refusing
    ``__setattr__``, for ``_new_content`` and ``_whole_on`` only. Never seen outside this module:
    it becomes a ``MapContent`` before anyone else holds it."""

    __slots__ = ()


def _new_content(
    logical_shape: tuple[int, ...],
    shard_shapes: dict[int, tuple[int, ...]],
    pieces_by_rank: dict[int, tuple[AffinePiece, ...]],
    pieces: int,
    slabs: SlabFacts | _Unknown | None,
) -> MapContent:
    """``MapContent(logical_shape, read-only views of the dicts, pieces)`` with its ``slabs``.

    A builder makes one per distinct map (tens of thousands for a model whose shapes are all
    distinct). ``MapContent`` refuses assignment, so its slots can only be written through their
    descriptors (``object.__setattr__`` or the slot's ``__set__``), a call each: 0.30 µs for the
    five, against 0.08 µs for plain attribute stores, which the interpreter specializes for a
    class that keeps ``object``'s ``__setattr__``. So the content is made as an ``_OpenContent``
    (the same slots, inherited from one base), filled in by plain stores, and then made a
    ``MapContent`` by assigning its ``__class__``, which CPython allows between two classes of one
    layout (it checks that, and raises otherwise; an audit hook sees an ``object.__setattr__``
    event): one object, of type ``MapContent`` exactly, before it leaves this function. About a
    tenth of building an expert's map.
    """
    made: MapContent = _OpenContent()  # type: ignore[assignment]  # one once its class is set
    made.logical_shape = logical_shape
    made.shard_shapes = MappingProxyType(shard_shapes)
    made.pieces_by_rank = MappingProxyType(pieces_by_rank)
    made.pieces = pieces
    made.slabs = slabs
    made.__class__ = MapContent
    return made


class _UnsharedContent(MapContent):
    """The content of a map that holds something other than exact ``AffinePiece`` pieces: its own,
    never shared, never recognized as equal to another map's (it is validated, and refused, alone)."""

    __slots__ = ()


class _Entry(weak_ref):  # type: ignore[type-arg]
    """A weak reference to a content that knows its key and its table, so the one module-level
    callback (``_forget``) can drop the entry: one C object per entry, no closure. A content a
    builder made is filed under its builder key (``_BUILT``) by the same entry (``built``): one
    weak reference per map, not two, for the collector to scan."""

    __slots__ = ("built", "key", "table")
    key: tuple[Any, ...]
    table: dict[tuple[Any, ...], _Entry]
    built: tuple[Any, ...] | None


_WeakTable = dict[tuple[Any, ...], _Entry]
_CONTENTS: _WeakTable = {}
"""Every content alive, by its key, held weakly: an entry goes when its content does.

A plain dict of weak references with a removal callback, not a ``WeakValueDictionary``: that
one's lookups and insertions are Python code (a ``KeyedRef`` made per entry, with a Python
``__init__``), which was a third of building a small map; these are a dict operation and one
weak reference made in C. Fewer long-lived objects per map also means less work for the
cyclic collector, which runs while users build their maps."""


_BUILT: _WeakTable = {}
"""The contents the builders made, by builder key, held weakly as ``_CONTENTS`` is (``_file_built``)."""


def _forget(gone: _Entry, _built: _WeakTable = _BUILT) -> None:
    """Drop a dead content's entries. It reads no module global when called: contents can die
    while the interpreter shuts down, after this module's globals were set to ``None``, and the
    lookup then printed "Exception ignored in: <function _forget ...>" for each at exit. So the
    builders' table is bound as a default, when the module is made."""
    table = gone.table
    if table.get(gone.key) is gone:  # not a newer entry made after this one died
        del table[gone.key]
    built = gone.built
    if built is not None and _built.get(built) is gone:
        del _built[built]


def _recall(table: _WeakTable, key: tuple[Any, ...]) -> MapContent | None:
    ref = table.get(key)
    return None if ref is None else ref()


def _keep(table: _WeakTable, key: tuple[Any, ...], content: MapContent) -> MapContent:
    """``content`` under ``key`` unless a live one is there already (which is returned instead)."""
    ref = table.get(key)
    found = None if ref is None else ref()
    if found is not None:
        return found  # type: ignore[no-any-return]
    table[key] = _entry(content, key, table)
    return content


def _entry(content: MapContent, key: tuple[Any, ...], table: _WeakTable) -> _Entry:
    entry = _Entry(content, _forget)
    entry.key = key
    entry.table = table
    entry.built = None
    return entry


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
    return _shared_content(logical_shape, shard_shapes, pieces_by_rank, len(kinds))


def _shared_content(
    logical_shape: tuple[int, ...],
    shard_shapes: dict[int, tuple[int, ...]],
    pieces_by_rank: dict[int, tuple[AffinePiece, ...]],
    count: int,
) -> MapContent:
    """The shared content of converted fields whose pieces are all exactly ``AffinePiece`` (the
    caller knows: ``_content`` has checked, a builder has made them), ``count`` of them."""
    return _filed(logical_shape, shard_shapes, pieces_by_rank, count)[0]


def _filed(
    logical_shape: tuple[int, ...],
    shard_shapes: dict[int, tuple[int, ...]],
    pieces_by_rank: dict[int, tuple[AffinePiece, ...]],
    count: int,
) -> tuple[MapContent, _Entry]:
    """``_shared_content`` with its ``_CONTENTS`` entry. The one place a content's key is made
    from its dicts, so a builder's map and the constructor's map of the same fields get the same
    content by the same key (``_whole_on`` writes the same key down directly; tests/test_build_fast.py
    holds every builder's content to be the constructor's, which computes it here).
    """
    # Keys and values apart (not ``items()``), each location's pieces spread into the key itself:
    # equal exactly when the item sequences are (the tuple of locations fixes how many follow),
    # with one tracked tuple per map instead of one pair per location or a tuple of the pieces,
    # long-lived objects the collector scans.
    key = (logical_shape, tuple(shard_shapes), tuple(shard_shapes.values()), tuple(pieces_by_rank),
           *pieces_by_rank.values())
    ref = _CONTENTS.get(key)
    if ref is not None:
        found: MapContent | None = ref()
        if found is not None:
            return found, ref
    found = _new_content(logical_shape, shard_shapes, pieces_by_rank, count, UNKNOWN)
    # Two threads building equal maps at once may still each keep a content of their own: that
    # loses sharing, never soundness (one object always means one content).
    ref = _CONTENTS[key] = _entry(found, key, _CONTENTS)
    return found, ref


class _MapSlot:
    """``ParamAffineMap``'s one slot, in a base of its own (see ``_OpenMap``)."""

    __slots__ = ("_content",)
    _content: MapContent


class ParamAffineMap(_MapSlot):
    """How one parameter is spread over locations: ``shard_shapes`` and ``pieces_by_rank``.

    Keys are *location* ids of this map, not process ranks: a source location 0 and a target
    location 0 are unrelated until ``TransferEndpoints`` binds them to processes.

    An immutable value: the fields are read-only (``shard_shapes`` and ``pieces_by_rank`` are
    read-only mappings), and every map equal to one already built shares that one's
    ``MapContent`` (``content``), so what the planner or the oracle validated for one map is what
    every map with the same ``content`` holds. Copies and pickles are rebuilt through the
    constructor.
    """

    __slots__ = ()

    def __init__(
        self,
        logical_shape: Sequence[int],
        shard_shapes: Mapping[int, Sequence[int]],
        pieces_by_rank: Mapping[int, Sequence[AffinePiece]],
    ) -> None:
        shards: dict[int, tuple[int, ...]] = {}
        for r, s in shard_shapes.items():
            key = _int(r, "ParamAffineMap.shard_shapes key")
            shards[key] = _ints(s, f"ParamAffineMap.shard_shapes[{show_int(key)}]")
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
        logical = _int_list(entry["logical_shape"], lambda: where, ".logical_shape")
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
                pieces.append(_parse_piece(p, partial(_piece_name, where, key, i)))
            pieces_by_rank[rank] = pieces
        return cls(logical, shard_shapes, pieces_by_rank)


def _piece_name(where: str, key: Any, index: int) -> str:
    return _field_name(where, key, f"pieces[{index}]")


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
#
# Why they do not go through ``AffinePiece(...)`` and ``ParamAffineMap(...)``: those convert every
# field of every piece (and re-check every holder of every piece), which made building a model's
# maps cost several times its planning (issue 27). A builder converts each *argument* once, by
# ``as_int``'s rule, naming it (``shape[0]: 4.5 is not an integer``); every value it then puts in
# a piece is an int it computed from converted ints, a tuple of them or one frozenset of holders
# shared by every piece it names. So the pieces are made as already-converted tuples
# (``_piece``), and the map's content is looked up by the same key as the constructor's
# (``_shared_content``): a builder's map *is* the constructor's map of the same fields, the same
# content object, which tests/test_build_fast.py checks on drawn layouts. Validation stays where
# it was (``frames``); only conversion is done once instead of per piece.
#
# The builders of whole layouts (contiguous, replicated, ``replicate``, ``parallel_map``) also
# remember which content their converted arguments built (``_BUILT``, held weakly like
# ``_CONTENTS``), so a model's repeated layouts are built once; a builder is a function of its
# converted arguments, so the remembered content is the one it would build again.


def _piece(
    shape: tuple[int, ...],
    source_offset: int,
    source_strides: tuple[int, ...],
    dest_offset: int,
    dest_strides: tuple[int, ...],
    locations: frozenset[int],
    scale: float = 1.0,
) -> AffinePiece:
    """A piece of already-converted fields, for the builders only (see above): no conversion."""
    fields = (shape, source_offset, source_strides, dest_offset, dest_strides, locations, scale)
    return tuple.__new__(AffinePiece, fields)


def _made(content: MapContent) -> ParamAffineMap:
    """A map of a content a builder has looked up (``_shared_content``) or remembered (``_BUILT``)."""
    made: ParamAffineMap = _OpenMap()  # type: ignore[assignment]  # ``_new_content``'s way
    made._content = content
    made.__class__ = ParamAffineMap
    return made


class _OpenMap(_MapSlot):
    """A map being made by a builder, as ``_OpenContent`` is a content (see ``_new_content``)."""

    __slots__ = ()


def _built(
    key: tuple[Any, ...] | None,
    logical: tuple[int, ...],
    shards: dict[int, tuple[int, ...]],
    held: dict[int, tuple[AffinePiece, ...]],
    count: int,
    slabs: SlabFacts | _Unknown | None = UNKNOWN,
) -> ParamAffineMap:
    """The map of a builder's converted fields, remembered under the builder's ``key`` if any,
    with the slab structure the builder knows of them (``slabs``), if it knows it."""
    content, entry = _filed(logical, shards, held, count)
    if not isinstance(slabs, _Unknown) and isinstance(content.slabs, _Unknown):
        _set(content, "slabs", slabs)
    if key is not None:
        _file_built(key, entry, content)
    return _made(content)


def _file_built(key: tuple[Any, ...], entry: _Entry, content: MapContent) -> None:
    """File ``content`` (whose ``_CONTENTS`` entry is ``entry``) under a builder's ``key`` too."""
    if entry.built is None:  # the content's one entry files it under the builder key as well
        entry.built = key
        _BUILT[key] = entry
    else:
        _keep(_BUILT, key, content)


def _remembered(key: tuple[Any, ...]) -> ParamAffineMap | None:
    # ``_recall`` written out: every builder call of a model's repeated layouts comes here first.
    ref = _BUILT.get(key)
    content = None if ref is None else ref()
    return None if content is None else _made(content)


_HOLDER_SETS: dict[frozenset[int], frozenset[int]] = {}
_HOLDER_BUDGET = [1 << 20]
"""Holder sets the builders made, one object per distinct set, up to about a million holders in
all (then new sets are simply not shared)."""


def _holders(locations: Iterable[int]) -> frozenset[int]:
    """The shared frozenset of these (converted) locations.

    A model's maps name the same few holder sets over and over ({0}, {1}, every DP copy of TP rank
    0, ...); sharing one object per set keeps the long-lived objects per map (which the cyclic
    collector scans while users build) and the memory per piece down, and makes comparing two
    contents' holders an identity test.
    """
    made = frozenset(locations)
    found = _HOLDER_SETS.get(made)
    if found is not None:
        return found
    if _HOLDER_BUDGET[0] >= len(made):
        _HOLDER_BUDGET[0] -= len(made) + 1
        _HOLDER_SETS[made] = made
    return made


def _axis(value: Any, ndim: int, what: str) -> int:
    """An axis argument by ``as_int``'s rule, counted from the end when negative (as an index)."""
    axis = _int(value, what)
    if not -ndim <= axis < ndim:
        raise InvalidMapError(f"{what}: {axis} is not an axis of a {ndim}-d shape")
    return axis % ndim


def _nonzero_scale(value: Any) -> float:
    scale = _scale(value)
    if scale == 0.0:
        raise InvalidMapError("a zero scale is not invertible, so F could not be rebuilt from the shard")
    return scale


def _with_extent(shape: tuple[int, ...], axis: int, extent: int) -> tuple[int, ...]:
    return (*shape[:axis], extent, *shape[axis + 1:])


def replicated_map(shape: Sequence[int], tp_degree: int, scale: float = 1.0) -> ParamAffineMap:
    """Every location ``0..tp_degree-1`` holds all of F as one piece naming all of them."""
    shape_t = _ints(shape, "shape")
    degree = _int(tp_degree, "tp_degree")
    scale_f = _nonzero_scale(scale)
    key = ("replicated", shape_t, degree, scale_f)
    found = _remembered(key)
    if found is not None:
        return found
    return _whole_on(shape_t, tuple(range(degree)), scale_f, key)


def _whole_on(
    shape: tuple[int, ...],
    order: tuple[int, ...],
    scale: float,
    key: tuple[Any, ...] | None,
    on: tuple[frozenset[int], tuple[int, ...], bool] | None = None,
) -> ParamAffineMap:
    """Every location of ``order`` (distinct, converted) holds all of F (converted ``shape``) as
    one shared piece naming all of them, in that order, remembered under the builder's ``key`` if
    any. ``on``: ``_on(order)``, when the caller has it already.

    Its content key (``_filed``'s) is written down directly instead of read back from the two
    dicts, and looked up before anything else is made: a whole map's content key is about as
    cheap to make as a builder key, so ``parallel_map``'s whole maps (every expert, every norm)
    are looked up by it alone (``key`` None): one table, one weak entry filed once. A model whose
    shapes are all distinct makes one of these per expert weight (tens of thousands): for one or
    two holders the key and the two dicts are written as displays (``dict.fromkeys`` of a 2-tuple
    cost twice a display), and a matrix's strides are made at once rather than looked up.
    """
    strides = (shape[1], 1) if len(shape) == 2 else _strides(shape)
    holders, ranked, _ = _on(order) if on is None else on
    one = (tuple.__new__(AffinePiece, (shape, 0, strides, 0, strides, holders, scale)),)
    n = len(order)
    if n == 1:  # an expert's one or two holders written out (``_filed``'s key of the two dicts)
        content_key: tuple[Any, ...] = (shape, order, (shape,), order, one)
    elif n == 2:
        content_key = (shape, order, (shape, shape), order, one, one)
    else:
        content_key = (shape, order, (shape,) * n, order, *((one,) * n))
    ref = _CONTENTS.get(content_key)
    content: MapContent | None = None if ref is None else ref()
    if content is None:
        # ``_new_content``, ``_whole_slab``, ``_entry`` and ``_made`` written out: for a model of
        # distinct shapes this branch runs once per map, and calling them cost a twelfth of building
        # its maps (9 % more instructions under callgrind for moe-model-distinct; docs/performance.md).
        held: dict[int, tuple[AffinePiece, ...]]
        if n == 1:
            at = order[0]
            shards = {at: shape}
            held = {at: one}
        elif n == 2:
            at, other = order
            shards = {at: shape, other: shape}
            held = {at: one, other: one}
        else:
            shards = dict.fromkeys(order, shape)
            held = dict.fromkeys(order, one)
        opened: MapContent = _OpenContent()  # type: ignore[assignment]  # ``_new_content``'s way
        opened.logical_shape = shape
        opened.shard_shapes = MappingProxyType(shards)
        opened.pieces_by_rank = MappingProxyType(held)
        opened.pieces = n
        opened.slabs = (None, ((0, shape[0], ranked, strides),)) if n and shape and scale == 1.0 else None
        opened.__class__ = MapContent
        content = opened
        ref = _Entry(content, _forget)
        ref.key = content_key
        ref.table = _CONTENTS
        ref.built = None
        _CONTENTS[content_key] = ref
    elif isinstance(content.slabs, _Unknown):  # the constructor's content of the same fields
        _set(content, "slabs", _whole_slab(shape, n, ranked, strides, scale))
    if key is not None:
        assert ref is not None  # found alive through it, or just made
        _file_built(key, ref, content)
    made: ParamAffineMap = _OpenMap()  # type: ignore[assignment]  # ``_new_content``'s way
    made._content = content
    made.__class__ = ParamAffineMap
    return made


def _whole_slab(
    shape: tuple[int, ...], n: int, ranked: tuple[int, ...], strides: tuple[int, ...], scale: float
) -> SlabFacts | None:
    """The slab record of all of F held by ``n`` locations (``ranked``, sorted): one box, a slab
    map of no axis, when it has a location, an axis and scale 1."""
    return (None, ((0, shape[0], ranked, strides),)) if n > 0 and shape and scale == 1.0 else None


_ON: dict[tuple[int, ...], tuple[frozenset[int], tuple[int, ...], bool]] = {}


def _on(order: tuple[int, ...]) -> tuple[frozenset[int], tuple[int, ...], bool]:
    """(the shared holder set, its locations sorted, whether none is named twice) of these
    (converted) locations, remembered: an expert's few holders are named by thousands of maps."""
    got = _ON.get(order)
    if got is None:
        if len(_ON) >= 4096:
            _ON.clear()
        holders = _holders(order)
        got = _ON[order] = (holders, tuple(sorted(holders)), len(holders) == len(order))
    return got


_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``row_major_strides(shape)`` (converted), remembered by the extents after the first, which
    are all they depend on: shapes that differ in their first extent (a model's rows) share them."""
    if not shape:
        return ()
    tail = shape[1:]
    got = _STRIDES.get(tail)
    if got is None:
        if len(_STRIDES) >= 4096:
            _STRIDES.clear()
        got = _STRIDES[tail] = row_major_strides(shape)
    return got


def contiguous_split_map(
    shape: Sequence[int], per_rank_sizes: Sequence[int], partition_dim: int
) -> ParamAffineMap:
    """Location r holds one contiguous block of ``per_rank_sizes[r]`` along ``partition_dim``."""
    shape_t = _ints(shape, "shape")
    sizes = _ints(per_rank_sizes, "per_rank_sizes")
    axis = _axis(partition_dim, len(shape_t), "partition_dim")
    key = ("contiguous", shape_t, sizes, axis)
    found = _remembered(key)
    if found is not None:
        return found
    return _split_copies(shape_t, sizes, axis, 1, None, key)


def _int_rows(values: Any, what: str) -> list[tuple[int, ...]]:
    """A sequence of integer sequences (widths per sub-parameter or segment), each converted."""
    try:
        rows = list(values)
    except TypeError:
        raise InvalidMapError(f"{what}: expected a sequence of integer sequences, got {describe(values)}") from None
    return [_ints(row, f"{what}[{i}]") for i, row in enumerate(rows)]


def sub_param_map(
    shape: Sequence[int],
    sub_dim_sizes: Sequence[int],
    shard_widths: Sequence[Sequence[int]],
    partition_dim: int,
) -> ParamAffineMap:
    """F is sub-parameters (e.g. Q, K, V) concatenated on ``partition_dim``, each split.

    ``shard_widths[i][r]`` is location r's width of sub-parameter i; a shard holds its slice of
    each sub-parameter in order. Zero widths give empty pieces, which the planner skips. One row
    of widths per sub-parameter, each naming every location (else ``InvalidMapError``).
    """
    shape_t = _ints(shape, "shape")
    sizes = _ints(sub_dim_sizes, "sub_dim_sizes")
    rows = _int_rows(shard_widths, "shard_widths")
    axis = _axis(partition_dim, len(shape_t), "partition_dim")
    if len(rows) != len(sizes) or not rows:
        raise InvalidMapError(
            f"sub_param_map: {len(rows)} rows of shard_widths for {len(sizes)} sub-parameters (one each, at least one)"
        )
    degree = len(rows[0])
    for index, row in enumerate(rows):
        if len(row) != degree:
            raise InvalidMapError(
                f"sub_param_map: shard_widths[{index}] has {len(row)} widths, shard_widths[0] {degree}"
            )
    strides = row_major_strides(shape_t)
    step = strides[axis]
    shard_shapes = {rank: _with_extent(shape_t, axis, sum(row[rank] for row in rows)) for rank in range(degree)}
    shard_strides = {rank: row_major_strides(shard) for rank, shard in shard_shapes.items()}
    holders = [_holders((rank,)) for rank in range(degree)]
    pieces: dict[int, list[AffinePiece]] = {rank: [] for rank in range(degree)}
    dest_start = [0] * degree
    sub_start = 0
    for sub_size, widths in zip(sizes, rows):
        src = sub_start
        for rank, width in enumerate(widths):
            dest = shard_strides[rank]
            pieces[rank].append(_piece(
                _with_extent(shape_t, axis, width), src * step, strides, dest_start[rank] * dest[axis], dest,
                holders[rank],
            ))
            src += width
            dest_start[rank] += width
        sub_start += sub_size
    held = {rank: tuple(ps) for rank, ps in pieces.items()}
    return _built(None, shape_t, shard_shapes, held, degree * len(rows))


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
    axis = _axis(partition_dim, len(shape_t), "partition_dim")
    degree = _int(tp_degree, "tp_degree")
    segs = [(_int(size, f"segments[{i}][0]"), bool(replicated)) for i, (size, replicated) in enumerate(segments)]
    rows = _int_rows(split_widths, "split_widths")
    ranks = range(degree)
    widths_of: list[tuple[int, ...] | None] = []
    split_index = 0
    for size, replicated in segs:
        if replicated:
            widths_of.append(None)
            continue
        if split_index >= len(rows):
            raise InvalidMapError(f"segmented_map: no split widths for the split segment of {size}")
        split = rows[split_index]
        split_index += 1
        if len(split) != degree or sum(split) != size:
            raise InvalidMapError(
                f"segmented_map: split widths {list(split)} do not account for a segment of {size} "
                f"across {degree} locations"
            )
        widths_of.append(split)
    strides = row_major_strides(shape_t)
    step = strides[axis]
    shard_shapes: dict[int, tuple[int, ...]] = {}
    for rank in ranks:
        extent = sum(size if w is None else w[rank] for (size, _), w in zip(segs, widths_of))
        shard_shapes[rank] = _with_extent(shape_t, axis, extent)
    shard_strides = {rank: row_major_strides(shard) for rank, shard in shard_shapes.items()}
    everyone = _holders(ranks)
    pieces: dict[int, list[AffinePiece]] = {r: [] for r in ranks}
    dest_start = [0] * degree
    src_start = 0
    for (size, _replicated), widths in zip(segs, widths_of):
        for rank in ranks:
            extent = size if widths is None else widths[rank]
            offset = src_start if widths is None else src_start + sum(widths[:rank])
            dest = shard_strides[rank]
            pieces[rank].append(_piece(
                _with_extent(shape_t, axis, extent), offset * step, strides, dest_start[rank] * dest[axis], dest,
                everyone if widths is None else _holders((rank,)),
            ))
            dest_start[rank] += extent
        src_start += size
    held = {rank: tuple(ps) for rank, ps in pieces.items()}
    return _built(None, shape_t, shard_shapes, held, len(ranks) * len(segs))


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
    block = _int(block_size, "block_size")
    axis = _axis(partition_dim, len(shape_t), "partition_dim")
    strides = row_major_strides(shape_t)
    step = strides[axis] * block
    shard_shapes: dict[int, tuple[int, ...]] = {}
    held: dict[int, tuple[AffinePiece, ...]] = {}
    count = 0
    for key, listed in block_ids_by_rank.items():
        rank = _int(key, "block_ids_by_rank key")
        ids = _ints(listed, f"block_ids_by_rank[{rank}]")
        if rank in held:
            raise InvalidMapError("ParamAffineMap: two keys name one location (e.g. 1 and numpy's 1)")
        shard = shard_shapes[rank] = _with_extent(shape_t, axis, len(ids) * block)
        dest_strides = row_major_strides(shard)
        dest_step = dest_strides[axis] * block
        holders = _holders((rank,))
        out: list[AffinePiece] = []
        dest_block = 0
        index = 0
        while index < len(ids):
            run = 1
            while index + run < len(ids) and ids[index + run] == ids[index + run - 1] + 1:
                run += 1
            out.append(_piece(
                _with_extent(shape_t, axis, run * block), ids[index] * step, strides, dest_block * dest_step,
                dest_strides, holders,
            ))
            dest_block += run
            index += run
        held[rank] = tuple(out)
        count += len(out)
    return _built(None, shape_t, shard_shapes, held, count)


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

    Linear in ``copies``: every copy of a location shares one tuple of pieces, and each distinct
    holder set is widened once (not once per piece and copy, which was quadratic).
    """
    count = _int(copies, "replicate: copies")
    if count < 1:
        raise InvalidMapError(f"replicate: copies must be at least 1, got {count}")
    content = tp_map.content
    ranks = tp_map.ranks
    names = None if location_of is None else _names(ranks, count, location_of)
    return _replicated(
        content.logical_shape, ranks, content.shard_shapes, content.pieces_by_rank, count, names,
        type(content) is MapContent, ("replicate", content, count, names), content.slabs,
    )


def _names(ranks: Sequence[int], copies: int, location_of: Callable[[int, int], int]) -> tuple[tuple[int, ...], ...]:
    """``location_of(rank, copy)`` of every location and copy, converted once: row i is ``ranks[i]``'s.

    A row of plain ints (what every caller's function returns) is checked by one C pass over its
    types; only a row holding something else is converted value by value, with the call named in
    an error. Wording that name for every value was most of ``replicate``'s time on a model of
    many experts (issue 27: building the 46 323-parameter MoE took 0.83 s with it, 0.65 s without,
    interleaved in one process)."""
    rows = []
    for rank in ranks:
        row = tuple([location_of(rank, copy) for copy in range(copies)])
        if not _INT_ONLY.issuperset(map(type, row)):
            row = tuple([_int(v, f"replicate: location_of({rank}, {copy})") for copy, v in enumerate(row)])
        rows.append(row)
    return tuple(rows)


def _replicated(
    logical: tuple[int, ...],
    ranks: Sequence[int],
    shard_of: Mapping[int, tuple[int, ...]],
    pieces_of: Mapping[int, Sequence[AffinePiece]],
    copies: int,
    names: tuple[tuple[int, ...], ...] | None,
    exact: bool,
    key: tuple[Any, ...],
    slabs: SlabFacts | _Unknown | None = UNKNOWN,
) -> ParamAffineMap:
    """``replicate`` of the map with these fields (``ranks`` sorted): one pass, no intermediate map.

    ``exact``: the pieces are exactly ``AffinePiece`` (a shared content's), so each is re-made with
    its new holders as a converted tuple and the result remembered under ``key``; otherwise every
    piece goes through the constructor, as a map of unknown pieces must. ``slabs``: the input
    map's slab structure if known; the result's is the same boxes, each held by every copy of
    its holders (``_widened_facts``).
    """
    if exact:
        found = _remembered(key)
        if found is not None:
            return found
    width = len(ranks)
    index = {rank: i for i, rank in enumerate(ranks)}
    widened: dict[frozenset[int], frozenset[int]] = {}

    def holders(named: frozenset[int]) -> frozenset[int]:
        got = widened.get(named)
        if got is None:
            positions = [index[loc] for loc in named if loc in index]
            if names is None:
                got = _holders([copy * width + i for copy in range(copies) for i in positions])
            else:
                got = _holders([loc for i in positions for loc in names[i]])
            widened[named] = got
        return got

    shards: dict[int, tuple[int, ...]] = {}
    held: dict[int, tuple[AffinePiece, ...]] = {}
    total = 0
    for i, rank in enumerate(ranks):
        if exact:
            pieces = tuple([_piece(p[0], p[1], p[2], p[3], p[4], holders(p[5]), p[6]) for p in pieces_of.get(rank, ())])
        else:
            pieces = tuple([
                AffinePiece(p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides,
                            holders(p.locations), p.scale)
                for p in pieces_of.get(rank, ())
            ])
        shard = shard_of.get(rank)
        for copy in range(copies):
            new = copy * width + i if names is None else names[i][copy]
            if new in held:
                raise InvalidMapError(f"replicate: location_of maps two (location, copy) pairs to {new}")
            if shard is not None:
                shards[new] = shard
            held[new] = pieces
        total += len(pieces) * copies
    if not exact:
        return ParamAffineMap(logical, shards, held)
    if isinstance(slabs, tuple):
        slabs = _widened_facts(slabs, holders)
    return _built(key, logical, shards, held, total, slabs)


def _widened_facts(slabs: SlabFacts, holders: Callable[[frozenset[int]], frozenset[int]]) -> SlabFacts:
    """The slab structure of a slab map replicated (``_replicated``), from the input's: the same
    boxes, each held by its pieces' widened holder set (``holders``, the function that made
    them). Still a slab map: every new location holds its TP location's one piece, which names
    it (each copy of every location the piece named); the holder sets stay one per box and, with
    distinct new locations, add up to the new locations (copies times the old ones)."""
    axis, spans = slabs
    return axis, tuple([
        (first, size, tuple(sorted(holders(frozenset(named)))), strides) for first, size, named, strides in spans
    ])


def parallel_map(
    shape: Sequence[int],
    tp: int = 1,
    partition_dim: int = 0,
    copies: int = 1,
    *,
    sizes: Sequence[int] | None = None,
    location_of: Callable[[int, int], int] | None = None,
) -> ParamAffineMap:
    """A TP × DP (× EP) layout in one pass: F split ``tp`` ways along ``partition_dim`` (DeepSpeed's
    uneven ``split``, or explicit ``sizes``), each shard held by ``copies`` locations.

    Equal to ``replicate(contiguous_split_map(shape, sizes or split(shape[partition_dim], tp),
    partition_dim), copies, location_of)`` (same content object), without building the TP map
    between. The default location of TP rank t's copy c is ``c * tp + t`` (TP innermost, Megatron's
    order). An expert weight under EP × DP is ``parallel_map(shape, copies=dp, location_of=lambda
    _t, c: owners[c])``: whole on each of its owners. A model's worth of these is cheaper through
    ``parallel_maps``.
    """
    shape_t = _ints(shape, "shape")
    axis = _axis(partition_dim, len(shape_t), "partition_dim")
    if sizes is None:
        degree = _int(tp, "tp")
        if degree < 1:
            raise InvalidMapError(f"parallel_map: tp must be at least 1, got {degree}")
        sizes_t = _even(shape_t[axis], degree)
    else:
        sizes_t = _ints(sizes, "sizes")
    count = _int(copies, "copies")
    if count < 1:
        raise InvalidMapError(f"parallel_map: copies must be at least 1, got {count}")
    names = None if location_of is None else _names(range(len(sizes_t)), count, location_of)
    return _parallel(shape_t, sizes_t, axis, count, names)


def _even(extent: int, degree: int) -> tuple[int, ...]:
    # One TP rank holds the whole axis (``split``'s answer), as every expert and norm does.
    return (extent,) if degree == 1 else tuple(split(extent, degree))


def _parallel(
    shape: tuple[int, ...], sizes: tuple[int, ...], axis: int, count: int, names: tuple[tuple[int, ...], ...] | None
) -> ParamAffineMap:
    """``parallel_map`` of converted arguments (``names[t][c]``: TP rank t's copy c, or ``None``
    for the default ``c * tp + t``), remembered under one key whichever front door built it."""
    if len(sizes) == 1 and sizes[0] == shape[axis]:  # one TP rank: whole copies
        whole = _whole_copies((1, axis, count, names))
        if whole is not None and (not whole[2] or shape[axis] > 0):
            return _whole_on(shape, whole[0], 1.0, None, whole[1])
    key = ("parallel", shape, sizes, axis, count, names)
    found = _remembered(key)
    if found is not None:
        return found
    return _split_copies(shape, sizes, axis, count, names, key)


def _split_copies(
    shape: tuple[int, ...], sizes: tuple[int, ...], axis: int, count: int, names: tuple[tuple[int, ...], ...] | None,
    key: tuple[Any, ...],
) -> ParamAffineMap:
    """``replicate(contiguous_split_map(shape, sizes, axis), count, names)``'s content (converted
    arguments) in one pass, and ``contiguous_split_map``'s itself (``count`` 1): TP rank t holds
    rows ``sum(sizes[:t]) ..`` of ``axis`` as one piece, made once and shared by its ``count``
    locations (``names[t]``, or ``c * tp + t``), in ``_replicated``'s order (TP rank, then copy).
    With them the slab record: TP rank t's box is ``[sum(sizes[:t]), +sizes[t])`` along ``axis``,
    held by its locations (sorted); a slab map exactly when every size is positive and they sum to
    F's extent (one size: the whole of F, of no axis)."""
    strides = _strides(shape)
    step = strides[axis]
    tp = len(sizes)
    shards: dict[int, tuple[int, ...]] = {}
    held: dict[int, tuple[AffinePiece, ...]] = {}
    spans: list[SlabSpan] = []
    start = 0
    for t, size in enumerate(sizes):
        shard = _with_extent(shape, axis, size)
        # Row-major strides do not depend on the first extent: a row split keeps F's strides.
        shard_strides = strides if axis == 0 else _strides(shard)
        where = tuple(range(t, count * tp, tp)) if names is None else names[t]
        holders, ranked, _ = _on(where)
        one = (tuple.__new__(AffinePiece, (shard, start * step, strides, 0, shard_strides, holders, 1.0)),)
        for location in where:
            if location in held:
                raise InvalidMapError(f"replicate: location_of maps two (location, copy) pairs to {location}")
            shards[location] = shard
            held[location] = one
        spans.append((start, size, ranked, shard_strides))
        start += size
    slabs: SlabFacts | None = None
    if sizes and min(sizes) > 0 and start == shape[axis]:
        slabs = (axis, tuple(spans)) if tp > 1 else (None, ((0, shape[0], spans[0][2], strides),))
    return _built(key, shape, shards, held, tp * count, slabs)


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """One side of a parameter's TP × DP (× EP) layout, apart from its shape: what ``parallel_map``
    takes besides the shape, as a value that a model's parameters share.

    ``locations[c][t]``: the location of TP rank ``t``'s shard in copy ``c`` (``copies`` rows of
    ``tp`` locations); ``None`` for Megatron's order ``c * tp + t``. An expert weight under EP x DP
    is ``ParallelLayout(copies=dp, locations=[[owner] for owner in owners])``. The fields are
    checked here, where they are written, and converted again by ``parallel_maps`` (once per
    layout object per call), so a layout altered after construction cannot slip an unconverted
    value into a map.
    """

    tp: int = 1
    partition_dim: int = 0
    copies: int = 1
    locations: Sequence[Sequence[int]] | None = None

    def __post_init__(self) -> None:
        _layout_args(self, "ParallelLayout")


def _layout_args(layout: ParallelLayout, what: str) -> tuple[int, int, int, tuple[tuple[int, ...], ...] | None]:
    """(tp, partition_dim as given, copies, names with ``names[t][c]``; ``None`` when they are the
    default order), each field converted by ``as_int``'s rule and named in an error."""
    degree = _int(layout.tp, f"{what}.tp")
    if degree < 1:
        raise InvalidMapError(f"{what}.tp must be at least 1, got {degree}")
    dim = _int(layout.partition_dim, f"{what}.partition_dim")
    count = _int(layout.copies, f"{what}.copies")
    if count < 1:
        raise InvalidMapError(f"{what}.copies must be at least 1, got {count}")
    if layout.locations is None:
        return degree, dim, count, None
    rows = _int_rows(layout.locations, f"{what}.locations")
    if len(rows) != count or any(len(row) != degree for row in rows):
        raise InvalidMapError(f"{what}.locations: expected {count} copies of {degree} locations (copies x tp), "
                              f"got {[len(row) for row in rows]}")
    names = tuple(zip(*rows, strict=True))
    if names == tuple(tuple(range(t, count * degree, degree)) for t in range(degree)):
        return degree, dim, count, None
    return degree, dim, count, names


def parallel_maps(params: Iterable[tuple[Sequence[int], ParallelLayout]]) -> list[ParamAffineMap]:
    """``parallel_map`` of every ``(shape, layout)``, in order: a model's maps in one call.

    Each map is equal to (the same content object as) ``parallel_map(shape, layout.tp,
    layout.partition_dim, layout.copies, location_of=lambda t, c: layout.locations[c][t])``. Why a
    batch: a model names a few layouts for thousands of parameters, so each layout object's fields
    are converted once per call instead of once per parameter; and building allocates a few
    long-lived objects per map, which the cyclic collector would re-scan again and again as the
    batch grows (two thirds of building 22 458 expert maps of distinct shapes), so it is paused for
    the call, as the planner pauses it (nothing here makes a reference cycle), and what the call
    made is scanned once at its end (``_gc``). ``params`` may be a generator: its items are then
    made inside the pause too. A bad item is refused naming its index; nothing is returned then.
    """
    build = _batch("parallel_maps")
    out: list[ParamAffineMap] = []
    with cycle_collection_paused():
        for i, item in enumerate(params):
            try:
                shape, layout = item
            except (TypeError, ValueError):
                raise InvalidMapError(f"parallel_maps: params[{i}] is not a (shape, ParallelLayout) pair: "
                                      f"{describe(item)}") from None
            out.append(build(shape, layout, i, ""))
    return out


def parallel_pairs(
    params: Iterable[tuple[str, Sequence[int], ParallelLayout, ParallelLayout]],
) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
    """A sync's ``{name: (target map, source map)}``, what ``plan_transfers`` takes, from ``(name,
    shape, target layout, source layout)`` per parameter: ``parallel_maps``'s maps, in one pass
    with the dict itself (everything the call makes is made while the collector is paused, and
    scanned once at the end). A name given twice is refused, naming both items' indices."""
    build = _batch("parallel_pairs")
    out: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    with cycle_collection_paused():
        for i, item in enumerate(params):
            try:
                name, shape, target, source = item
            except (TypeError, ValueError):
                raise InvalidMapError(f"parallel_pairs: params[{i}] is not a (name, shape, target ParallelLayout, "
                                      f"source ParallelLayout) tuple: {describe(item)}") from None
            if type(name) is not str:
                raise InvalidMapError(f"parallel_pairs: params[{i}]'s name {describe(name)} is not a str")
            if name in out:
                at = next(j for j, n in enumerate(out) if n == name)
                raise InvalidMapError(f"parallel_pairs: params[{i}] names {name!r}, as params[{at}] did")
            out[name] = (build(shape, target, i, " target"), build(shape, source, i, " source"))
    return out


_Args = tuple[int, int, int, tuple[tuple[int, ...], ...] | None]


_Whole = tuple[tuple[int, ...], tuple[frozenset[int], tuple[int, ...], bool], bool]


def _whole_copies(args: _Args) -> _Whole | None:
    """When a layout's maps (converted ``args``) are whole copies made by ``_whole_on``: (the
    locations in order, their ``_on``, whether an extent of 0 on the split axis sends a map to the
    general path instead); ``None`` otherwise. One whole shard held ``count`` > 1 times at the
    default locations is every location 0..count-1 holding all of F (``replicated_map``'s
    content); all of F on each of ``count`` distinct named locations is an expert under EP x DP.
    One copy at the default location, or a name given twice (refused as ``replicate`` refuses
    it), take the general path. ``_parallel`` asks per map, ``parallel_maps`` once per layout."""
    degree, _, count, names = args
    if degree != 1:
        return None
    if names is None:
        if count < 2:
            return None
        order = tuple(range(count))
        return order, _on(order), False
    on = _on(names[0])
    return (names[0], on, True) if on[2] else None


def _batch(caller: str) -> Callable[[Any, Any, int, str], ParamAffineMap]:
    """One call's builder of ``(shape, layout)`` maps: each layout object's fields converted once
    (the object kept, so its id cannot be reused during the call), ``_ints`` and ``_axis`` inline
    for a tuple of ints and an axis in range; an error names ``caller``, the item and the side, and
    is only worded when one is raised."""
    seen: dict[int, tuple[ParallelLayout, _Args, _Whole | None]] = {}
    ints = _INT_ONLY.issuperset

    def build(shape: Any, layout: Any, i: int, side: str) -> ParamAffineMap:
        got = seen.get(id(layout))
        if got is None:
            if not isinstance(layout, ParallelLayout):
                raise InvalidMapError(f"{caller}: params[{i}]'s{side} layout is a {type(layout).__name__}, "
                                      "not a ParallelLayout")
            args = _layout_args(layout, f"{caller}: params[{i}]{side}")
            got = seen[id(layout)] = (layout, args, _whole_copies(args))
        degree, dim, count, names = got[1]
        shape_t = shape if type(shape) is tuple and ints(map(type, shape)) else _ints(
            shape, f"{caller}: params[{i}] shape")
        ndim = len(shape_t)
        axis = dim % ndim if -ndim <= dim < ndim else _axis(dim, ndim, f"{caller}: params[{i}]{side} partition_dim")
        whole = got[2]
        if whole is not None and (not whole[2] or shape_t[axis] > 0):
            return _whole_on(shape_t, whole[0], 1.0, None, whole[1])  # ``_parallel``'s first case, known per layout
        return _parallel(shape_t, _even(shape_t[axis], degree), axis, count, names)

    return build


def runs_map(
    logical_shape: Sequence[int], holdings: Mapping[int, Sequence[Sequence[tuple[int, int]]]]
) -> ParamAffineMap:
    """The map of ``holdings``: location -> per axis of F, the runs ``(start, length)`` of F indices
    it holds, in the order its (dense, row-major) shard stores them.

    Every combination of one run per axis is a piece (the product of the runs), and locations
    with identical holdings are replicas that name each other, in the order given. This is the
    shape of every placement-described layout (DTensor's ``Shard``/``Replicate``/``_StridedShard``
    on a mesh, DCP's chunks, Megatron's sharded tensors), built in one pass: each start and
    length converted once by ``as_int``'s rule (refused naming ``holdings[location][axis][run]``),
    one shared holder set per distinct holding. It does not validate the geometry (overlaps,
    bounds, coverage): that stays ``frames.normalize``'s, which the callers run.
    """
    logical = _ints(logical_shape, "logical_shape")
    strides = row_major_strides(logical)
    converted: dict[int, tuple[tuple[tuple[int, int], ...], ...]] = {}
    for key, holding in holdings.items():
        location = _int(key, "holdings key")
        if location in converted:
            raise InvalidMapError("ParamAffineMap: two keys name one location (e.g. 1 and numpy's 1)")
        converted[location] = _holding(holding, len(logical), f"holdings[{location}]")
    named: dict[tuple[tuple[tuple[int, int], ...], ...], list[int]] = {}
    for location, holding in converted.items():
        named.setdefault(holding, []).append(location)
    replicas = {holding: _holders(locations) for holding, locations in named.items()}
    shards: dict[int, tuple[int, ...]] = {}
    held: dict[int, tuple[AffinePiece, ...]] = {}
    count = 0
    for location, holding in converted.items():
        shard = tuple([sum([length for _, length in runs]) for runs in holding])
        shards[location] = shard
        if volume(shard) == 0:  # an empty shard holds nothing; it stays a (skipped) location
            held[location] = ()
            continue
        shard_strides = row_major_strides(shard)
        # Per axis: (F offset, shard offset, length) of each run, the offsets already strided.
        axes = []
        for axis, runs in enumerate(holding):
            step, local_step, at, out = strides[axis], shard_strides[axis], 0, []
            for start, length in runs:
                out.append((start * step, at * local_step, length))
                at += length
            axes.append(out)
        holders = replicas[holding]
        pieces = [
            _piece(tuple([c[2] for c in choice]), sum([c[0] for c in choice]), strides,
                   sum([c[1] for c in choice]), shard_strides, holders)
            for choice in product(*axes)
        ]
        held[location] = tuple(pieces)
        count += len(pieces)
    return _built(None, logical, shards, held, count)


def _holding(value: Any, ndim: int, what: str) -> tuple[tuple[tuple[int, int], ...], ...]:
    """One location's runs per axis, converted (the common case, plain int pairs, by one test)."""
    try:
        axes = list(value)
    except TypeError:
        raise InvalidMapError(f"{what}: expected runs per axis, got {describe(value)}") from None
    if len(axes) != ndim:
        raise InvalidMapError(f"{what}: runs for {len(axes)} axes of a {ndim}-d tensor")
    out = []
    for axis, runs in enumerate(axes):
        try:
            pairs = list(runs)
        except TypeError:
            raise InvalidMapError(
                f"{what}[{axis}]: expected a sequence of (start, length), got {describe(runs)}"
            ) from None
        converted = []
        for index, run in enumerate(pairs):
            if type(run) is tuple and len(run) == 2 and type(run[0]) is int and type(run[1]) is int:
                converted.append(run)
                continue
            if isinstance(run, (str, bytes)) or not isinstance(run, Sequence) or len(run) != 2:
                raise InvalidMapError(f"{what}[{axis}][{index}]: expected (start, length), got {describe(run)}")
            converted.append((_int(run[0], f"{what}[{axis}][{index}][0]"), _int(run[1], f"{what}[{axis}][{index}][1]")))
        out.append(tuple(converted))
    return tuple(out)


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
