"""The oracle's own reading of a map: validation, derived its own way, and the pieces as boxes.

Why its own: the planner validates maps in ``frames`` (rules R1–R15, one rule per function, array
fast path for big locations). The oracle must not lean on that code, or a mistake there would
pass both. So this module states the rules in a different shape — one plain loop over the pieces
with the scalar row-major decode of ``box``, then the tiling and holder checks as box queries —
and shares only ``box``'s arithmetic (the trusted base named in ``proofs/theorem3.md``).

There is no array decode of pieces here on purpose: the loop is the obviously correct form, and
its measured cost on 10⁵ pieces (``refplan bench``'s ``moe-gather-100000``) stays a fraction of
the planner's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from .. import limits
from ..box import (
    Box,
    covers,
    decode_row_major,
    overlap_volumes,
    overlap_witnesses,
    overlapping_pair_array,
    row_major_strides,
    volume,
)
from ..errors import InvalidMapError, UnsupportedLayoutError, show_int, show_ints, show_list
from ..limits import MAX_COORDINATE
from ..maps import AffinePiece, MapContent, ParamAffineMap
from . import small
from .verdict import TooLarge

__all__ = [
    "Array",
    "Held",
    "Layout",
    "MapLike",
    "as_map",
    "holders_of",
    "logical_at",
    "nonempty",
    "piece_tables",
    "rm",
    "row_major_offset",
    "row_major_on",
    "validate_map",
    "validated",
]

Array = np.ndarray[Any, Any]
MapLike = ParamAffineMap | Mapping[str, Any]


@dataclass(frozen=True)
class Held:
    """One non-empty piece: ``logical`` is its box in F, ``local`` its box in the shard."""

    location: int
    index: int
    logical: Box
    local: Box
    locations: frozenset[int]


class Layout:
    """A validated map: shard shapes and, per location with a shard, its non-empty pieces.

    ``held`` may be given as a function that builds it: ``oracle.small.read_map`` reads a small
    map without making a ``Held`` per piece (its plan judgement reads ``plain``), and only a plan
    that goes to the general path (or a report) needs them, so they are built on first use.
    """

    __slots__ = ("_build", "_held", "logical_shape", "plain", "shards", "side", "tables")

    def __init__(
        self,
        side: str,
        logical_shape: tuple[int, ...],
        shards: dict[int, tuple[int, ...]],
        held: dict[int, list[Held]] | Callable[[], dict[int, list[Held]]],
        plain: dict[int, small.Place] | None = None,
    ) -> None:
        self.side = side
        self.logical_shape = logical_shape
        self.shards = shards
        self._held: dict[int, list[Held]] | None = None if callable(held) else held
        self._build: Callable[[], dict[int, list[Held]]] | None = held if callable(held) else None
        # ``piece_tables`` of this layout, built on first use: a batch judges every layer's plan
        # against the same remembered layout, so its arrays are built once, not once per parameter.
        self.tables: tuple[Array, ...] | None = None
        # Per location, what ``oracle.small.judge`` reads for each segment (``small.Place``): set
        # for a map ``oracle.small.read_map`` read; a layout without it is judged by the general path.
        self.plain = plain

    @property
    def held(self) -> dict[int, list[Held]]:
        if self._held is None:
            assert self._build is not None
            self._held = self._build()
            self._build = None
        return self._held

    def _fields(self) -> tuple[Any, ...]:
        return (self.side, self.logical_shape, self.shards, self.held)

    def __eq__(self, other: object) -> bool:
        """Equal when they describe the same map on the same side: side, F, shards and pieces
        (not the arrays or the small path's places, which are derived from those)."""
        if not isinstance(other, Layout):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable (built on first use), like the dataclass it was

    def __repr__(self) -> str:
        return (f"Layout(side={self.side!r}, logical_shape={self.logical_shape!r}, shards={self.shards!r}, "
                f"held={self.held!r})")


@functools.lru_cache(maxsize=4096)
def rm(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, cached: plans name the same few shard shapes 10⁵ times."""
    return row_major_strides(shape)


def row_major_on(strides: Sequence[int], extent: Sequence[int], shape: tuple[int, ...]) -> bool:
    """Whether ``strides`` are ``shape``'s row-major strides on every axis the extent moves along."""
    return all(s == r for s, r, e in zip(strides, rm(shape), extent) if e > 1)


def inside(box: Box, shape: Sequence[int]) -> bool:
    """Whether ``box`` lies in the dense tensor of ``shape`` (every axis within ``[0, size)``)."""
    return all(o >= 0 and o + e <= s for o, e, s in zip(box.origin, box.extent, shape))


def nonempty(shape: Sequence[int]) -> bool:
    """Whether a shape holds at least one element (every extent positive)."""
    return all(s > 0 for s in shape)


def _tagged(tag: int, box: Box) -> Box:
    """``box`` with a leading axis holding ``tag``: one k-d query then keeps locations apart."""
    return Box((tag, *box.origin), (1, *box.extent))


class _PieceName:
    """``"{side} map, location {loc}, piece {index}"``, formatted only when a message needs it."""

    __slots__ = ("index", "loc", "side")

    def __init__(self, side: str, loc: int, index: int) -> None:
        self.side = side
        self.loc = loc
        self.index = index

    def __str__(self) -> str:
        return f"{self.side} map, location {self.loc}, piece {self.index}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def validate_map(m: ParamAffineMap, side: str) -> Layout:
    """Check one map and return its pieces as boxes; raise the map's error class otherwise.
    Every rule, the region rules (R24-R26, ``_validate_parts``' second part) last."""
    layout, regions = _validate_parts(m, side)
    regions()
    return layout


def _no_regions() -> None:
    """The region rules of a map ``oracle.small.read_map`` read: it reads only maps that pass."""


def _validate_parts(m: ParamAffineMap, side: str) -> tuple[Layout, Callable[[], None]]:
    """``validate_map`` in two parts: every rule of the map alone but the region rules, then (the
    function returned) R24 and R25 for a source map, R26 for a target map, which
    spec/validation.md's order puts after *both* maps' other rules (step 4). Run in one go, a
    source map's coverage fault was named before a target map's stride fault, which the planner
    names first (an outside probe, 2026-12-07).

    Why each rule: pieces must be boxes on both sides or "which logical element sits at this
    address" is not a translation; Premise A (disjoint local boxes that account for the shard)
    makes it a function of the address; disjoint logical boxes within a location make volume sums
    exact in the holder check; exact ``locations`` and source regions that are disjoint or equal
    are what the source map asserts about replicas; coverage of F on both sides means the
    transfer is total. The plan check needs only Premise A and the piece boxes, but a map that
    contradicts itself may describe a corrupt checkpoint, so no plan is judged against it.

    A small plain map is read by ``oracle.small.read_map`` instead, which accepts only maps that
    pass every rule here and returns ``None`` for anything else; the loop below then decides and
    words the error.
    """
    plain = small.read_map(m)
    if plain is not None:
        read_shards = {loc: place[0] for loc, place in plain.items()}
        return Layout(side, tuple(m.logical_shape), read_shards, functools.partial(_held, plain), plain), _no_regions
    logical = tuple(m.logical_shape)
    ndim = len(logical)
    if any(s < 0 for s in logical):
        raise InvalidMapError(f"{side} map: logical shape {show_ints(logical)} has a negative extent")
    # Past int64 (one extent, or the volume) is more than this oracle can address, not a broken
    # map: unverifiable. Each extent on its own too, since an empty F (a zero extent) can list any other.
    if any(s > MAX_COORDINATE for s in logical):
        raise TooLarge(f"{side} map: logical shape {show_ints(logical)} has an extent above 2**62")
    if volume(logical) >= MAX_COORDINATE:
        raise TooLarge(f"{side} map: logical shape {logical} has {volume(logical)} elements, at least 2**62 "
                       "(the oracle addresses fewer)")
    # Location ids go into the same int64 columns as coordinates (``check_plan``'s rows, the cuts).
    bad = [loc for loc in m.ranks if not -MAX_COORDINATE <= loc <= MAX_COORDINATE]
    if bad:
        huge = show_int(min(bad))
        raise InvalidMapError(f"{side} map, location {huge}: location id {huge} is above 2**62 in magnitude")
    shards: dict[int, tuple[int, ...]] = {}
    held: dict[int, list[Held]] = {}
    for loc in m.ranks:
        shard = m.shard_shapes.get(loc)
        if shard is not None:
            if len(shard) != ndim:
                raise UnsupportedLayoutError(
                    f"{side} map, location {loc}: shard shape {show_ints(shard)} has a different number of axes "
                    f"than the logical shape {logical}"
                )
            if any(s < 0 for s in shard):
                raise InvalidMapError(
                    f"{side} map, location {loc}: shard shape {show_ints(shard)} has a negative extent"
                )
            if any(s > MAX_COORDINATE for s in shard):  # as for F
                raise TooLarge(f"{side} map, location {loc}: shard shape {show_ints(shard)} has an extent above 2**62")
            if volume(shard) >= MAX_COORDINATE:
                raise TooLarge(f"{side} map, location {loc}: shard shape {shard} has {volume(shard)} elements, at "
                               "least 2**62 (the oracle addresses fewer)")
        if shard is None and loc in m.pieces_by_rank:
            # R5 before any rule on the pieces, as in the planner: listing pieces, even none,
            # without a shard shape is a broken map. Named at the first non-empty piece, if any.
            listed = m.pieces_by_rank[loc]
            first = next((i for i, p in enumerate(listed) if isinstance(p, AffinePiece) and nonempty(p.shape)), None)
            if first is not None:
                raise InvalidMapError(
                    f"{_PieceName(side, loc, first)}: location {loc} lists a non-empty piece but has no shard shape"
                )
            raise InvalidMapError(f"{side} map, location {loc}: lists pieces (none non-empty) but has no shard shape")
        # An empty shard's pieces are held to R7 and R8 only, and must be empty (R6), as in the planner.
        real_shard = shard is not None and nonempty(shard)
        listed = m.pieces_by_rank.get(loc, ())
        if real_shard and all(isinstance(p, AffinePiece) for p in listed) and not any(
            nonempty(p.shape) for p in listed
        ):
            # R4 per location, before its pieces' rules (spec/validation.md's order, the planner's):
            # found by the tiling's volumes after every piece before, so a later piece's fault was
            # named instead of this one (an outside probe, 2026-12-07).
            raise InvalidMapError(
                f"{side} map, location {loc}: a nonempty shard {shard} must hold at least one non-empty piece"
            )
        out: list[Held] = []
        for index, p in enumerate(m.pieces_by_rank.get(loc, ())):
            where = _PieceName(side, loc, index)
            if not isinstance(p, AffinePiece):
                raise InvalidMapError(f"{where}: expected an AffinePiece, got {type(p).__name__}")
            if len(p.shape) != ndim:
                raise InvalidMapError(f"{where}: shape {show_ints(p.shape)} does not have the {ndim} axes of {logical}")
            if any(e < 0 for e in p.shape):
                raise InvalidMapError(f"{where}: shape {show_ints(p.shape)} has a negative extent")
            if any(e > MAX_COORDINATE for e in p.shape):  # R8's bound, before R12 skips an empty piece
                raise InvalidMapError(f"{where}: shape {show_ints(p.shape)} has an extent above 2**62")
            if not real_shard:
                if nonempty(p.shape):
                    raise InvalidMapError(
                        f"{where}: the empty shard {show_ints(shard or ())} cannot hold a non-empty piece of shape "
                        f"{show_ints(p.shape)}"
                    )
                continue
            # R9-R11 hold for every piece of a non-empty shard, empty ones too, as in the planner
            # (and in DeepSpeed's, affine_transfer.py:256-261): an empty piece cannot make a plan
            # wrong, but a map that breaks them is one no planner plans, so it is not judged.
            if not p.locations:
                raise InvalidMapError(f"{where}: names no holder (empty locations)")
            if p.scale != 1.0:
                raise UnsupportedLayoutError(f"{where}: scale {p.scale} != 1; a byte copy cannot rescale")
            if len(p.source_strides) != ndim or len(p.dest_strides) != ndim:
                raise InvalidMapError(
                    f"{where}: stride vector length does not match the {ndim} axes of the piece"
                )
            if not nonempty(p.shape):
                continue  # empty pieces hold nothing; builders give them offsets one past the end
            assert shard is not None  # real_shard
            if not row_major_on(p.source_strides, p.shape, logical):
                raise UnsupportedLayoutError(
                    f"{where}: source strides {show_ints(p.source_strides)} are not the row-major strides of "
                    f"{logical} on the piece's axes (a permutation or a gap)"
                )
            if not row_major_on(p.dest_strides, p.shape, shard):
                raise UnsupportedLayoutError(
                    f"{where}: dest strides {show_ints(p.dest_strides)} are not the row-major strides of shard "
                    f"{shard}"
                )
            origin = decode_row_major(p.source_offset, logical)
            if origin is None:
                raise InvalidMapError(
                    f"{where}: source offset {show_int(p.source_offset)} is not a coordinate of {logical}"
                )
            box = Box(origin, p.shape)
            if not inside(box, logical):
                raise InvalidMapError(f"{where}: logical box {box} lies outside the logical parameter {logical}")
            local_origin = decode_row_major(p.dest_offset, shard)
            if local_origin is None:
                raise InvalidMapError(
                    f"{where}: dest offset {show_int(p.dest_offset)} is not a coordinate of shard {shard}"
                )
            local = Box(local_origin, p.shape)
            if not inside(local, shard):
                raise InvalidMapError(f"{where}: local box {local} lies outside the shard {shard}")
            out.append(Held(loc, index, box, local, p.locations))
        if shard is not None:
            shards[loc] = shard
            held[loc] = out
    layout = Layout(side, logical, shards, held)
    _check_tiling(layout)
    return layout, _check_holders(layout)


def _held(plain: dict[int, small.Place]) -> dict[int, list[Held]]:
    """``Layout.held`` of a map ``oracle.small.read_map`` read, made when first asked for."""
    return {
        loc: [
            Held(loc, index, Box(origin, shape), Box(local, shape), declared)
            for index, (origin, local, shape, declared) in enumerate(place[2])
        ]
        for loc, place in plain.items()
    }


def _slabs(boxes: Sequence[Box]) -> bool:
    """Whether the boxes are pairwise disjoint because their spans on axis 0 are (a sufficient
    test, exact when true: sorted by start, each span ends before the next begins). Empty boxes
    are never passed here (empty pieces are dropped), and a 0-axis box list has at most one."""
    if len(boxes) < 2:
        return True
    if not boxes[0].origin:
        return False
    spans = sorted([(b.origin[0], b.origin[0] + b.extent[0]) for b in boxes])
    return all(end <= start for (_, end), (start, _) in pairwise(spans))


def validated(m: ParamAffineMap, side: str, layouts: dict[Any, Layout] | None) -> Layout:
    """``validate_map``, remembered per batch for small maps with exactly the same content.

    Layers of a model share their maps; validation reads only the map's content (shapes, pieces
    field by field, dict order) and the side, so an identical map gets the identical layout.
    Only maps that passed are remembered; anything unusual (a subclass, a big map, a content
    that is not a shared ``MapContent``) is validated afresh.
    """
    layout, regions = validated_parts(m, side, layouts)
    regions()
    return layout


def validated_parts(m: ParamAffineMap, side: str, layouts: dict[Any, Layout] | None
                    ) -> tuple[Layout, Callable[[], None]]:
    """``validated`` in ``_validate_parts``' two parts; a layout is remembered once both passed."""
    key: Any = None
    if layouts is not None and type(m) is ParamAffineMap:
        content = m.content
        # Maps are hash-consed as they are built: every map with this exact content (shapes,
        # pieces field by field, dict order; every piece exactly an AffinePiece) shares this one
        # immutable object, so the identity is the content. Anything else (a subclass, a map
        # holding a plain tuple where a piece belongs, a forced content) is validated afresh.
        if type(content) is MapContent and content.pieces <= limits.REMEMBER_PIECES:
            key = (side, content)
            found = layouts.get(key)
            if found is not None:
                return found, _no_regions
    layout, regions = _validate_parts(m, side)
    if key is None or layouts is None:
        return layout, regions

    def then_remember() -> None:
        regions()
        layouts[key] = layout

    return layout, then_remember



def _check_tiling(layout: Layout) -> None:
    """Premise A per location (local boxes disjoint, volumes = shard numel), and disjoint
    logical boxes within a location. One tagged k-d query each covers all locations at once."""
    side = layout.side
    locs = sorted(layout.held)
    flat = [h for loc in locs for h in layout.held[loc]]
    tag = {loc: i for i, loc in enumerate(locs)}
    for attr, what in (("local", "the same shard addresses"), ("logical", "overlapping logical pieces")):
        if all(_slabs([getattr(h, attr) for h in layout.held[loc]]) for loc in locs):
            continue  # within each location the boxes are disjoint slabs: no pair can overlap
        # The least pair, from witnesses that hold it without listing n(n-1)/2 pairs of n equal
        # pieces (5.2 s for 2 000 pieces on the same shard addresses before: an outside probe).
        pairs = overlap_witnesses([_tagged(tag[h.location], getattr(h, attr)) for h in flat])
        if pairs.size:
            a, b = flat[int(pairs[0, 0])], flat[int(pairs[0, 1])]
            common = getattr(a, attr).intersect(getattr(b, attr))
            raise InvalidMapError(
                f"{side} map, location {a.location}: pieces {a.index} and {b.index} hold {what} "
                f"({attr} boxes {getattr(a, attr)} and {getattr(b, attr)} share {common})"
            )
    for loc in locs:
        total = sum(h.local.volume for h in layout.held[loc])
        numel = volume(layout.shards[loc])
        if total != numel:
            raise InvalidMapError(
                f"{side} map, location {loc}: the pieces account for {total} of the {numel} elements "
                f"of shard {layout.shards[loc]}"
            )


def _declaring_other(held: list[Held], holders: frozenset[int]) -> set[int]:
    """The ids of the declared-locations objects among ``held`` that are not ``holders``, each
    object compared once.

    Why by object: the k replicas of a box usually share one declared set (map builders share
    them), and comparing each piece's set of k locations with the box's holders cost k² — 8 192
    replicas of one box, 0.43 s of a 9 s verdict, growing fourfold per doubling."""
    other: set[int] = set()
    seen: set[int] = set()
    for h in held:
        key = id(h.locations)  # the object is alive (``h`` holds it) while its id is in these sets
        if key not in seen:
            seen.add(key)
            if h.locations != holders:
                other.add(key)
    return other


def _check_holders(layout: Layout) -> Callable[[], None]:
    """Declared ``locations`` are exact; returned, the side's region rules, for later (step 4).

    For each distinct logical box, the locations touching it (holding it, or holding a box that
    overlaps it) must be exactly what every piece with that box declares, and each declared
    location must hold all of it (volumes of its overlaps; exact because a location's logical
    boxes are disjoint). Source boxes must be disjoint or equal (replicas cut at different
    boundaries cannot be served by box copies) and cover F; target boxes must cover F.
    """
    side = layout.side
    by_box: dict[Box, list[Held]] = {}
    for loc in sorted(layout.held):
        for h in layout.held[loc]:
            by_box.setdefault(h.logical, []).append(h)
    distinct = sorted(by_box)
    pairs = np.empty((0, 2), dtype=np.int64) if _slabs(distinct) else overlapping_pair_array(distinct)
    holders = [frozenset([h.location for h in by_box[d]]) for d in distinct]
    # the holders are listed for the query only when some boxes overlap (the usual map has none)
    shares = overlap_volumes(distinct, [sorted(h) for h in holders] if pairs.size else [], pairs)
    for k, box in enumerate(distinct):
        mine = by_box[box]
        covered = shares(k)
        if not covered and not _declaring_other(mine, holders[k]):
            continue  # nothing else touches the box and every piece declares exactly its holders
        touching = set(holders[k]) | set(covered)
        other = _declaring_other(by_box[box], frozenset(touching))
        for h in by_box[box]:
            if id(h.locations) in other:
                raise InvalidMapError(
                    f"{side} map, location {h.location}, piece {h.index}: logical box {box} declares "
                    f"locations {show_list(sorted(h.locations))}, but the locations holding part of it are "
                    f"{sorted(touching)} (different locations)"
                )
        for loc in sorted(touching - holders[k]):
            if covered.get(loc, 0) != box.volume:
                raise InvalidMapError(
                    f"{side} map: location {loc} is declared a holder of logical box {box} but does not "
                    f"hold all of it ({covered.get(loc, 0)} of {box.volume} elements)"
                )
    first = (int(pairs[0, 0]), int(pairs[0, 1])) if pairs.size else None
    del pairs, shares  # the region rules need the first overlapping pair only

    def regions() -> None:
        """R24 and R25 (source: distinct boxes disjoint, covering F) or R26 (target: covering F)."""
        whole = Box((0,) * len(layout.logical_shape), layout.logical_shape)
        if side == "source":
            if first is not None:
                i, j = first
                raise UnsupportedLayoutError(
                    f"source map: logical boxes {distinct[i]} and {distinct[j]} overlap without being equal "
                    "(replicas cut at different piece boundaries); box copies cannot choose between them"
                )
            total = sum(b.volume for b in distinct)
            if total != whole.volume:
                gap = covers(whole, distinct)
                raise InvalidMapError(
                    f"source map: source pieces cover {total} of the {whole.volume} elements of F"
                    + (f"; {gap} is held by nobody" if gap is not None else "")
                )
        else:
            gap = covers(whole, distinct)
            if gap is not None:
                raise InvalidMapError(f"target map: target pieces do not cover F; {gap} is held by no target location")

    return regions


def as_map(value: MapLike, side: str) -> ParamAffineMap:
    """A map given as a ``ParamAffineMap`` or as its dict form (DeepSpeed's), as a ``ParamAffineMap``;
    a malformed dict raises ``InvalidMapError``, which the caller turns into ``invalid_map``."""
    if isinstance(value, ParamAffineMap):
        return value
    return ParamAffineMap.from_dict(value, f"{side} map")


def row_major_offset(coord: Sequence[int], shape: Sequence[int]) -> int:
    """The row-major address of ``coord`` in ``shape`` (for counterexample reports)."""
    return sum(c * s for c, s in zip(coord, rm(tuple(shape))))


def logical_at(layout: Layout, loc: int, coord: Sequence[int]) -> tuple[int, ...] | None:
    """The logical element a shard coordinate holds (one linear scan; used for one report)."""
    for h in layout.held.get(loc, ()):
        o, e = h.local.origin, h.local.extent
        if all(oi <= c < oi + ei for c, oi, ei in zip(coord, o, e)):
            return tuple(lo + c - oi for lo, c, oi in zip(h.logical.origin, coord, o))
    return None


def holders_of(layout: Layout, logical: Sequence[int]) -> list[int]:
    """Locations whose pieces hold a logical element (one linear scan; used for one report)."""
    point = Box(tuple(logical), (1,) * len(logical))
    return sorted({h.location for hs in layout.held.values() for h in hs if h.logical.contains(point)})


def piece_tables(layout: Layout) -> tuple[Array, ...]:
    """Every held piece as arrays: location, local origin, extent, logical origin (pieces sorted
    by location), then the distinct locations with each one's first piece and piece count."""
    if layout.tables is not None:
        return layout.tables
    flat = [h for loc in sorted(layout.held) for h in layout.held[loc]]
    ndim = len(layout.logical_shape)
    loc = np.asarray([h.location for h in flat], dtype=np.int64)
    local = np.asarray([h.local.origin for h in flat], dtype=np.int64).reshape(len(flat), ndim)
    ext = np.asarray([h.local.extent for h in flat], dtype=np.int64).reshape(len(flat), ndim)
    logical = np.asarray([h.logical.origin for h in flat], dtype=np.int64).reshape(len(flat), ndim)
    locs, first, count = np.unique(loc, return_index=True, return_counts=True)
    layout.tables = (loc, local, ext, logical, locs, first, count)
    return layout.tables


