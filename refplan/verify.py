"""The independent oracle: is this plan a correct transfer between these two maps?

``verify_plan(target_map, source_map, plan)`` judges any plan — one of ours, or a foreign one given
as segment dicts (DeepSpeed's ``TransferPlan.to_dict()``) — and answers a ``Verdict``:

- ``ok``: every segment reads and writes inside its shards; every target shard address is written
  exactly once; and every written element receives the logical element the target map puts there,
  read from a source location whose own pieces hold that element.
- ``invalid``: a concrete counterexample (parameter, target location and offset, the logical
  coordinate that belongs there, the segment(s), and why).
- ``unverifiable``: part of the plan is outside what this oracle can reason about (a segment that
  is not a box in its shard, in bulk beyond the element-level fallback budget, or coordinates too
  large for exact int64 arithmetic). It never says ``ok`` for what it did not check.
- ``invalid_map``: a map is itself invalid (``map_error`` names the error class and message), so
  the plan was not judged. A map error is a property of the input, not of the plan, which is why it
  is its own status (the CLI exits 2, "bad input", for it).

A malformed plan (not parseable as segments) is an ``invalid`` verdict with reason
``malformed plan: ...``; ``verify_plan`` does not raise on plan or map input.

Why it is written the way it is: this module shares **no logic** with the planner (``frames``,
``regions``, ``check``, ``planner``, ``policies`` are not imported). It re-derives every premise
from the raw maps with its own code, so a reasoning bug in the planner cannot hide in the oracle
too. It does **no per-element work** on its fast path and **no all-pairs loops**: boxes are
compared through ``box.overlapping_pairs`` (k-d partition, output-sensitive) and ``box.covers``,
so cost grows with pieces, segments and their actual intersections, never with tensor size.
Only segments that are not boxes in their shards are expanded to elements, and only under
``fallback_elements``.

The argument, in the order the checks run:

1. Maps (``_validate_map``, both sides): pieces are boxes in F and in their shard (row-major
   strides on axes of size > 1, offsets that decode to coordinates, boxes inside); per location
   the local boxes are disjoint and account for the whole shard (Premise A: every shard address
   belongs to exactly one piece, so "what a shard address holds" is a function); logical boxes
   within a location are disjoint; declared ``locations`` are exact; source boxes are disjoint or
   equal and cover F; target boxes cover F.
2. Segments: known locations, stride vectors of the right length, positive extents, non-negative
   strides, and both footprints inside their shards. A segment whose strides are the shard's
   row-major strides and whose offset decodes to a coordinate with the box inside the shard *is*
   that box; address ``k`` of the segment is then coordinate ``origin + k`` on both sides.
3. Exactly once: per target location the segments' write boxes are pairwise disjoint, and their
   volumes sum to the shard numel (disjoint + inside + full volume = exact tiling).
4. Same element from a real holder: each write box is cut by the target location's pieces, each
   cut is carried to the read box by the segment's translation, and cut again by the source
   location's pieces. On each final sub-box both maps are translations, so the target's logical
   origin equals the source's logical origin iff every element of the sub-box is right. The source
   piece belongs to the location the segment reads, so that location really holds the element.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

import numpy as np

from ._gc import cycle_collection_paused
from .box import Box, covers, overlapping_pairs, row_major_strides, volume
from .errors import AffineTransferError, InputFileError, InvalidMapError, UnsupportedLayoutError
from .files import check_keys, load_json, parse_plans, read_maps
from .maps import AffinePiece, ParamAffineMap, piece_arrays
from .plan import TransferPlan, TransferSegment

__all__ = [
    "FALLBACK_MAX_ELEMENTS",
    "MAX_COORDINATE",
    "BatchVerdict",
    "Verdict",
    "run_verify_cli",
    "verify_plan",
    "verify_plans",
]

FALLBACK_MAX_ELEMENTS = 1 << 16
"""Elements, over the whole plan, that non-box segments may expand to before the verdict is
``unverifiable``. Expansion is exact but costs memory and time per element (and the resulting
row runs go through the same box checks), so it is kept for small odd segments only."""

MAX_COORDINATE = 1 << 62
"""Largest logical or shard numel the oracle reasons about: coordinates travel through int64
numpy arrays, and this bound keeps every sum of two coordinates exact."""

Status = Literal["ok", "invalid", "unverifiable", "invalid_map"]
Array = np.ndarray[Any, Any]
MapLike = ParamAffineMap | Mapping[str, Any]
PlanLike = TransferPlan | Mapping[str, Any] | Sequence[Any]

_SEVERITY: dict[str, int] = {"ok": 0, "unverifiable": 1, "invalid": 2, "invalid_map": 3}
_EXIT: dict[str, int] = {"ok": 0, "invalid": 1, "invalid_map": 2, "unverifiable": 3}


# ---------------------------------------------------------------------------------------------
# Verdicts


@dataclass(frozen=True)
class Verdict:
    """The oracle's answer for one parameter.

    For ``invalid`` the counterexample fields say where: ``target_location`` and
    ``target_offset`` (an element address in that target shard; for a segment that writes outside
    its shard, the offending address), ``logical_coordinate`` (the element of F the target map puts
    there, when there is one), ``segments`` (plan indices involved) and ``reason``. ``map_error``
    is set for ``invalid_map``. ``checked_segments`` counts the segments examined;
    ``fallback_elements`` the elements the element-level fallback expanded.
    """

    status: Status
    parameter: str | None = None
    reason: str = ""
    target_location: int | None = None
    target_offset: int | None = None
    logical_coordinate: tuple[int, ...] | None = None
    segments: tuple[int, ...] = ()
    map_error: str | None = None
    checked_segments: int = 0
    fallback_elements: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "parameter": self.parameter,
            "reason": self.reason,
            "target_location": self.target_location,
            "target_offset": self.target_offset,
            "logical_coordinate": None if self.logical_coordinate is None else list(self.logical_coordinate),
            "segments": list(self.segments),
            "map_error": self.map_error,
            "checked_segments": self.checked_segments,
            "fallback_elements": self.fallback_elements,
        }

    def __str__(self) -> str:
        name = f"parameter {self.parameter!r}: " if self.parameter is not None else ""
        where: list[str] = []
        if self.target_location is not None:
            where.append(f"target location {self.target_location}")
        if self.target_offset is not None:
            where.append(f"offset {self.target_offset}")
        if self.logical_coordinate is not None:
            where.append(f"logical {self.logical_coordinate}")
        if self.segments:
            where.append("segment" + ("s " if len(self.segments) > 1 else " ") + ", ".join(map(str, self.segments)))
        at = f" [{'; '.join(where)}]" if where else ""
        detail = self.map_error if self.status == "invalid_map" and self.map_error else self.reason
        return f"{self.status}: {name}{detail}{at}"

    def with_parameter(self, parameter: str | None) -> Verdict:
        return Verdict(
            self.status, parameter, self.reason, self.target_location, self.target_offset,
            self.logical_coordinate, self.segments, self.map_error, self.checked_segments,
            self.fallback_elements,
        )


@dataclass(frozen=True)
class BatchVerdict:
    """Verdicts for a batch of parameters; ``status`` is the worst one
    (``invalid_map`` > ``invalid`` > ``unverifiable`` > ``ok``)."""

    status: Status
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def exit_code(self) -> int:
        """0 ok, 1 invalid, 2 invalid map (bad input), 3 unverifiable."""
        return _EXIT[self.status]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(_SEVERITY, 0)
        for verdict in self.verdicts.values():
            out[verdict.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "counts": self.counts(),
            "parameters": {name: self.verdicts[name].to_dict() for name in sorted(self.verdicts)},
        }

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items() if n)
        lines = [f"refplan verify: {len(self.verdicts)} parameter(s): {counts or 'none'} -> {self.status}"]
        for name in sorted(self.verdicts):
            lines.append(f"  {self.verdicts[name]}")
        return "\n".join(lines)


def _worst(statuses: Iterable[str]) -> Status:
    worst: Status = "ok"
    for status in statuses:
        if _SEVERITY[status] > _SEVERITY[worst]:
            worst = status  # type: ignore[assignment]
    return worst


class _TooLarge(Exception):
    """Coordinates beyond ``MAX_COORDINATE``: the oracle cannot reason exactly, so unverifiable."""


# ---------------------------------------------------------------------------------------------
# Maps: the oracle's own validation (independent of frames.py on purpose)


@dataclass(frozen=True)
class _Held:
    """One non-empty piece: ``logical`` is its box in F, ``local`` its box in the shard."""

    location: int
    index: int
    logical: Box
    local: Box
    locations: frozenset[int]


@dataclass
class _Layout:
    """A validated map: shard shapes and, per location with a shard, its non-empty pieces."""

    side: str
    logical_shape: tuple[int, ...]
    shards: dict[int, tuple[int, ...]]
    held: dict[int, list[_Held]]
    # ``_pieces`` of this layout, built on first use: a batch judges every layer's plan against
    # the same remembered layout, so its arrays are built once, not once per parameter.
    tables: tuple[Array, ...] | None = field(default=None, compare=False, repr=False)


@functools.lru_cache(maxsize=4096)
def _rm(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, cached: plans name the same few shard shapes 10⁵ times."""
    return row_major_strides(shape)


def _decode(offset: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Coordinate of row-major ``offset`` in a non-empty ``shape``, or ``None`` if it is not one."""
    if offset < 0:
        return None
    coord = []
    rest = offset
    for stride, size in zip(_rm(shape), shape):
        q, rest = divmod(rest, stride)
        if q >= size:
            return None
        coord.append(q)
    return tuple(coord) if rest == 0 else None


def _box_origin(offset: int, shape: tuple[int, ...], extent: Sequence[int]) -> tuple[int, ...] | None:
    """``_decode(offset, shape)`` if that box of ``extent`` (all positive) lies inside ``shape``, else None.

    One pass for the two checks the plan's fast path makes on every segment side.
    """
    if offset < 0:
        return None
    coord = []
    rest = offset
    for stride, size, e in zip(_rm(shape), shape, extent):
        q, rest = divmod(rest, stride)
        if q + e > size:  # also catches q >= size, as e >= 1
            return None
        coord.append(q)
    return tuple(coord) if rest == 0 else None


def _row_major_on(strides: Sequence[int], extent: Sequence[int], shape: tuple[int, ...]) -> bool:
    """Whether ``strides`` are ``shape``'s row-major strides on every axis the extent moves along."""
    return all(s == r for s, r, e in zip(strides, _rm(shape), extent) if e > 1)


def _inside(box: Box, shape: Sequence[int]) -> bool:
    return all(o >= 0 and o + e <= s for o, e, s in zip(box.origin, box.extent, shape))


def _nonempty(shape: Sequence[int]) -> bool:
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


_ARRAY_PIECES = 16
_ARRAY_SEGMENTS = 128
"""Pieces of a location, and the segments of a plan, are decoded on arrays from this many on:
numpy's fixed cost per call outweighs the per-item loops below that (measured crossovers). Both
paths decide the same (tests/test_fast_paths.py and the ``fast_path`` tests of
tests/test_verify.py run both)."""


def _plain_pieces(
    pieces: Sequence[Any], logical: tuple[int, ...], shard: tuple[int, ...]
) -> list[tuple[int, Any, Box, Box]] | None:
    """(index, piece, logical box, local box) of every piece, if all are plainly valid; else ``None``.

    "Plain": the piece's axes match, every extent is positive, it names holders, scale 1, its
    stride vectors *are* the row-major strides of F and of the shard, its offsets decode to
    coordinates and its boxes lie inside. Each of these implies the corresponding rule of the
    per-piece loop in ``_validate_map`` passes, which would then build the same boxes; one piece
    that is anything else (an error, an empty piece, a size-1 axis with another stride) sends the
    whole location through that loop, which decides and writes the messages.
    """
    ndim = len(logical)
    if ndim == 0 or len(shard) != ndim or not _nonempty(logical) or not _nonempty(shard):
        return None
    l_strides = _rm(logical)
    s_strides = _rm(shard)
    for p in pieces:
        if (
            len(p.shape) != ndim
            or p.source_strides != l_strides
            or p.dest_strides != s_strides
            or p.scale != 1.0
            or not p.locations
        ):
            return None
    # Decoding is arithmetic on all pieces at once: for 0 <= x < numel, the coordinate of a
    # row-major offset x on each axis is (x // stride) % size. Every bound is below 2**62
    # (``_validate_map`` refused larger shapes), so an int64 sum of a coordinate and an extent
    # cannot overflow; an offset or extent that does not fit int64 is not plain.
    arrays = piece_arrays(pieces, ndim)  # every shape has ndim axes (checked above)
    if arrays is None:
        return None
    ext, src, dst = arrays
    l_shape = np.asarray(logical, dtype=np.int64)
    s_shape = np.asarray(shard, dtype=np.int64)
    if not (
        bool(np.all((ext > 0) & (ext <= MAX_COORDINATE)))
        and bool(np.all((src >= 0) & (src < volume(logical))))
        and bool(np.all((dst >= 0) & (dst < volume(shard))))
    ):
        return None
    origin = (src[:, None] // np.asarray(l_strides, dtype=np.int64)) % l_shape
    local = (dst[:, None] // np.asarray(s_strides, dtype=np.int64)) % s_shape
    if not (bool(np.all(origin + ext <= l_shape)) and bool(np.all(local + ext <= s_shape))):
        return None
    return [
        (index, p, Box(tuple(o), p.shape), Box(tuple(q), p.shape))
        for index, (p, o, q) in enumerate(zip(pieces, origin.tolist(), local.tolist()))
    ]


def _validate_map(m: ParamAffineMap, side: str) -> _Layout:
    """Check one map and return its pieces as boxes; raise the map's error class otherwise.

    Why each rule: pieces must be boxes on both sides or "which logical element sits at this
    address" is not a translation; Premise A (disjoint local boxes that account for the shard)
    makes it a function of the address; disjoint logical boxes within a location make volume sums
    exact in the holder check; exact ``locations`` and source regions that are disjoint or equal
    are what the source map asserts about replicas; coverage of F on both sides means the
    transfer is total. The plan check needs only Premise A and the piece boxes, but a map that
    contradicts itself may describe a corrupt checkpoint, so no plan is judged against it.
    """
    logical = tuple(m.logical_shape)
    ndim = len(logical)
    if any(s < 0 for s in logical):
        raise InvalidMapError(f"{side} map: logical shape {logical} has a negative extent")
    if volume(logical) >= MAX_COORDINATE:
        raise _TooLarge(f"{side} map: logical shape {logical} exceeds {MAX_COORDINATE} elements")
    shards: dict[int, tuple[int, ...]] = {}
    held: dict[int, list[_Held]] = {}
    for loc in m.ranks:
        shard = m.shard_shapes.get(loc)
        if shard is not None:
            if len(shard) != ndim:
                raise UnsupportedLayoutError(
                    f"{side} map, location {loc}: shard shape {shard} has a different number of axes "
                    f"than the logical shape {logical}"
                )
            if any(s < 0 for s in shard):
                raise InvalidMapError(f"{side} map, location {loc}: shard shape {shard} has a negative extent")
            if volume(shard) >= MAX_COORDINATE:
                raise _TooLarge(f"{side} map, location {loc}: shard shape {shard} exceeds {MAX_COORDINATE}")
        out: list[_Held] = []
        pieces = m.pieces_by_rank.get(loc, ())
        plain = _plain_pieces(pieces, logical, shard) if shard is not None and len(pieces) >= _ARRAY_PIECES else None
        if plain is not None:  # every piece is a plain box on both sides: nothing below can fail
            out = [_Held(loc, index, box, local, p.locations) for index, p, box, local in plain]
            pieces = ()
        for index, p in enumerate(pieces):
            where = _PieceName(side, loc, index)
            if len(p.shape) != ndim:
                raise InvalidMapError(f"{where}: shape {p.shape} does not have the {ndim} axes of {logical}")
            if any(e < 0 for e in p.shape):
                raise InvalidMapError(f"{where}: shape {p.shape} has a negative extent")
            if not _nonempty(p.shape):
                continue  # empty pieces hold nothing; builders give them offsets one past the end
            if shard is None:
                raise InvalidMapError(f"{where}: location {loc} lists a non-empty piece but has no shard shape")
            if not p.locations:
                raise InvalidMapError(f"{where}: names no holder (empty locations)")
            if p.scale != 1.0:
                raise UnsupportedLayoutError(f"{where}: scale {p.scale} != 1; a byte copy cannot rescale")
            if len(p.source_strides) != ndim or len(p.dest_strides) != ndim:
                raise InvalidMapError(
                    f"{where}: stride vector length does not match the {ndim} axes of the piece"
                )
            if not _row_major_on(p.source_strides, p.shape, logical):
                raise UnsupportedLayoutError(
                    f"{where}: source strides {p.source_strides} are not the row-major strides of "
                    f"{logical} on the piece's axes (a permutation or a gap)"
                )
            if not _row_major_on(p.dest_strides, p.shape, shard):
                raise UnsupportedLayoutError(
                    f"{where}: dest strides {p.dest_strides} are not the row-major strides of shard {shard}"
                )
            origin = _decode(p.source_offset, logical) if _nonempty(logical) else None
            if origin is None:
                raise InvalidMapError(f"{where}: source offset {p.source_offset} is not a coordinate of {logical}")
            box = Box(origin, p.shape)
            if not _inside(box, logical):
                raise InvalidMapError(f"{where}: logical box {box} lies outside the logical parameter {logical}")
            local_origin = _decode(p.dest_offset, shard) if _nonempty(shard) else None
            if local_origin is None:
                raise InvalidMapError(f"{where}: dest offset {p.dest_offset} is not a coordinate of shard {shard}")
            local = Box(local_origin, p.shape)
            if not _inside(local, shard):
                raise InvalidMapError(f"{where}: local box {local} lies outside the shard {shard}")
            out.append(_Held(loc, index, box, local, p.locations))
        if shard is not None:
            shards[loc] = shard
            held[loc] = out
    layout = _Layout(side, logical, shards, held)
    _check_tiling(layout)
    _check_holders(layout)
    return layout


def _slabs(boxes: Sequence[Box]) -> bool:
    """Whether the boxes are pairwise disjoint because their spans on axis 0 are (a sufficient
    test, exact when true: sorted by start, each span ends before the next begins). Empty boxes
    are never passed here (empty pieces are dropped), and a 0-axis box list has at most one."""
    if len(boxes) < 2:
        return True
    if not boxes[0].origin:
        return False
    n = len(boxes)
    if n < _ARRAY_PIECES:  # numpy's fixed cost per call is more than sorting a few spans
        spans = sorted([(b.origin[0], b.origin[0] + b.extent[0]) for b in boxes])
        return all(end <= start for (_, end), (start, _) in pairwise(spans))
    start = np.fromiter((b.origin[0] for b in boxes), dtype=np.int64, count=n)
    end = start + np.fromiter((b.extent[0] for b in boxes), dtype=np.int64, count=n)
    order = np.argsort(start, kind="stable")
    return bool(np.all(end[order[:-1]] <= start[order[1:]]))


_REMEMBER_PIECES = 256


def _validated(m: ParamAffineMap, side: str, layouts: dict[Any, _Layout] | None) -> _Layout:
    """``_validate_map``, remembered per batch for small maps with exactly the same content.

    Layers of a model share their maps; validation reads only the map's content (shapes, pieces
    field by field, dict order) and the side, so an identical map gets the identical layout.
    Only maps that passed are remembered; anything unusual (a subclass, a big map, something
    unhashable) is validated afresh.
    """
    key: Any = None
    if layouts is not None and type(m) is ParamAffineMap:
        pieces = m.pieces_by_rank
        if sum(len(v) for v in pieces.values()) <= _REMEMBER_PIECES and all(
            type(p) is AffinePiece for v in pieces.values() for p in v
        ):
            key = (side, m.logical_shape, tuple(m.shard_shapes.items()), tuple(pieces.items()))
            try:
                found = layouts.get(key)
            except TypeError:
                key = found = None
            if found is not None:
                return found
    layout = _validate_map(m, side)
    if key is not None and layouts is not None:
        layouts[key] = layout
    return layout


def _check_tiling(layout: _Layout) -> None:
    """Premise A per location (local boxes disjoint, volumes = shard numel), and disjoint
    logical boxes within a location. One tagged k-d query each covers all locations at once."""
    side = layout.side
    locs = sorted(layout.held)
    flat = [h for loc in locs for h in layout.held[loc]]
    tag = {loc: i for i, loc in enumerate(locs)}
    for attr, what in (("local", "the same shard addresses"), ("logical", "overlapping logical pieces")):
        if all(_slabs([getattr(h, attr) for h in layout.held[loc]]) for loc in locs):
            continue  # within each location the boxes are disjoint slabs: no pair can overlap
        pairs = overlapping_pairs([_tagged(tag[h.location], getattr(h, attr)) for h in flat])
        if pairs:
            i, j = min(pairs)
            a, b = flat[i], flat[j]
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


def _check_holders(layout: _Layout) -> None:
    """Declared ``locations`` are exact, and the side's coverage rules hold.

    For each distinct logical box, the locations touching it (holding it, or holding a box that
    overlaps it) must be exactly what every piece with that box declares, and each declared
    location must hold all of it (volumes of its overlaps; exact because a location's logical
    boxes are disjoint). Source boxes must be disjoint or equal (replicas cut at different
    boundaries cannot be served by box copies) and cover F; target boxes must cover F.
    """
    side = layout.side
    by_box: dict[Box, list[_Held]] = {}
    for loc in sorted(layout.held):
        for h in layout.held[loc]:
            by_box.setdefault(h.logical, []).append(h)
    distinct = sorted(by_box)
    pairs = [] if _slabs(distinct) else sorted(overlapping_pairs(distinct))
    neighbours: list[list[int]] = [[] for _ in distinct]
    for i, j in pairs:
        neighbours[i].append(j)
        neighbours[j].append(i)
    holders = [frozenset([h.location for h in by_box[d]]) for d in distinct]
    for k, box in enumerate(distinct):
        mine = by_box[box]
        if not neighbours[k] and (
            mine[0].locations == holders[k] if len(mine) == 1 else all(h.locations == holders[k] for h in mine)
        ):
            continue  # nothing else touches the box and every piece declares exactly its holders
        touching = set(holders[k])
        covered: dict[int, int] = {}
        for j in neighbours[k]:
            touching |= holders[j]
            common = box.intersect(distinct[j])
            share = common.volume if common is not None else 0
            for loc in holders[j]:
                covered[loc] = covered.get(loc, 0) + share
        for h in by_box[box]:
            if h.locations != touching:
                raise InvalidMapError(
                    f"{side} map, location {h.location}, piece {h.index}: logical box {box} declares "
                    f"locations {sorted(h.locations)}, but the locations holding part of it are "
                    f"{sorted(touching)} (different locations)"
                )
        for loc in sorted(touching - holders[k]):
            if covered.get(loc, 0) != box.volume:
                raise InvalidMapError(
                    f"{side} map: location {loc} is declared a holder of logical box {box} but does not "
                    f"hold all of it ({covered.get(loc, 0)} of {box.volume} elements)"
                )
    whole = Box((0,) * len(layout.logical_shape), layout.logical_shape)
    if side == "source":
        if pairs:
            i, j = pairs[0]
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


def _as_map(value: MapLike, side: str) -> ParamAffineMap:
    if isinstance(value, ParamAffineMap):
        return value
    return ParamAffineMap.from_dict(value, f"{side} map")


# ---------------------------------------------------------------------------------------------
# Plans


def _parse_plan(plan: PlanLike) -> tuple[list[TransferSegment], tuple[int, ...] | None]:
    """Segments and the plan's logical shape (``None`` for a bare segment list)."""
    if isinstance(plan, TransferPlan):
        return list(plan.segments), tuple(plan.logical_shape)
    if isinstance(plan, Mapping):
        if "segments" not in plan:
            raise InvalidMapError("plan: expected {logical_shape, segments}")
        shape: tuple[int, ...] | None = None
        if "logical_shape" in plan:
            raw = plan["logical_shape"]
            if not isinstance(raw, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in raw
            ):
                raise InvalidMapError("plan.logical_shape: expected a list of integers")
            shape = tuple(raw)
        segs, _ = _parse_plan(plan["segments"])
        return segs, shape
    if isinstance(plan, (str, bytes)) or not isinstance(plan, Sequence):
        raise InvalidMapError(
            f"plan: expected a TransferPlan, a plan dict or a list of segments, got {type(plan).__name__}"
        )
    out = [
        s if isinstance(s, TransferSegment) else TransferSegment.from_dict(s, f"segments[{i}]")
        for i, s in enumerate(plan)
    ]
    return out, None


def _addresses(offset: int, shape: Sequence[int], strides: Sequence[int]) -> Array:
    """Flat address of every element of a strided view, in row-major order of its index."""
    addr = np.full((1,) * len(shape), offset, dtype=np.int64)
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        step_shape = [1] * len(shape)
        step_shape[axis] = size
        addr = addr + (np.arange(size, dtype=np.int64) * stride).reshape(step_shape)
    return np.broadcast_to(addr, tuple(shape)).reshape(-1)


def _row_major_offset(coord: Sequence[int], shape: Sequence[int]) -> int:
    return sum(c * s for c, s in zip(coord, _rm(tuple(shape))))


def _logical_at(layout: _Layout, loc: int, coord: Sequence[int]) -> tuple[int, ...] | None:
    """The logical element a shard coordinate holds (one linear scan; used for one report)."""
    for h in layout.held.get(loc, ()):
        o, e = h.local.origin, h.local.extent
        if all(oi <= c < oi + ei for c, oi, ei in zip(coord, o, e)):
            return tuple(lo + c - oi for lo, c, oi in zip(h.logical.origin, coord, o))
    return None


def _holders_of(layout: _Layout, logical: Sequence[int]) -> list[int]:
    """Locations whose pieces hold a logical element (one linear scan; used for one report)."""
    point = Box(tuple(logical), (1,) * len(logical))
    return sorted({h.location for hs in layout.held.values() for h in hs if h.logical.contains(point)})


def _structural(index: int, seg: TransferSegment, src: _Layout, tgt: _Layout) -> Verdict | None:
    """Checks that need no geometry: known locations, stride lengths, extents, footprints.

    A footprint outside the shard is reported with a concrete element: the index whose address is
    the out-of-range extreme, and the target address that index writes.
    """
    s_shard = src.shards.get(seg.source_rank)
    t_shard = tgt.shards.get(seg.target_rank)

    def bad(reason: str, offset: int | None = None) -> Verdict:
        logical = None
        if offset is not None and t_shard is not None and 0 <= offset < volume(t_shard):
            coord = _decode(offset, t_shard)
            logical = None if coord is None else _logical_at(tgt, seg.target_rank, coord)
        return Verdict(
            "invalid", reason=f"segment {index}: {reason}", target_location=seg.target_rank,
            target_offset=offset, logical_coordinate=logical, segments=(index,), checked_segments=index + 1,
        )

    if s_shard is None:
        return bad(f"reads from source location {seg.source_rank}, which has no shard in the source map")
    if t_shard is None:
        return bad(f"writes to target location {seg.target_rank}, which has no shard in the target map")
    ndim = len(seg.shape)
    if len(seg.source_strides) != ndim or len(seg.target_strides) != ndim:
        return bad(f"stride vector length does not match shape {seg.shape}")
    if not _nonempty(seg.shape):
        return bad(f"shape {seg.shape} has an extent that is not positive (an executor refuses it)")
    if any(s < 0 for s in (*seg.source_strides, *seg.target_strides)):
        return bad("negative strides are not executable (as_strided refuses them)")
    for side, offset, strides, shard in (
        ("reads", seg.source_offset, seg.source_strides, s_shard),
        ("writes", seg.target_offset, seg.target_strides, t_shard),
    ):
        reach = sum((e - 1) * s for e, s in zip(seg.shape, strides))
        numel = volume(shard)
        if offset < 0 or offset + reach >= numel:
            # Strides are non-negative: index 0 is the lowest address, the last index the highest.
            last = offset < 0
            index_k = [0 if last else e - 1 for e in seg.shape]
            at = seg.target_offset + sum(k * s for k, s in zip(index_k, seg.target_strides))
            where = "source location" if side == "reads" else "target location"
            rank = seg.source_rank if side == "reads" else seg.target_rank
            return bad(
                f"{side} addresses {offset}..{offset + reach} of {where} {rank}, outside its "
                f"{numel} elements (shard {shard})",
                at,
            )
    if any(e > 1 and v == 0 for e, v in zip(seg.shape, seg.target_strides)):
        return bad(
            f"target strides {seg.target_strides} repeat a zero stride on an axis of extent > 1, so it "
            "writes one address more than once",
            seg.target_offset,
        )
    return None


def _kind(seg: TransferSegment, src: _Layout, tgt: _Layout) -> tuple[bool, int, int, int, int, bool, bool]:
    """What a segment's locations, shape and strides alone decide: (structurally sound, read
    reach, write reach, source numel, target numel, source strides row-major, target strides
    row-major). "Sound" means both shards exist, stride vectors fit, extents are positive and
    strides non-negative; the reaches then bound the footprints given the offsets."""
    return _kind_of(
        src.shards.get(seg.source_rank), tgt.shards.get(seg.target_rank), seg.shape, seg.source_strides,
        seg.target_strides,
    )


@functools.lru_cache(maxsize=4096)
def _kind_of(
    s_shard: tuple[int, ...] | None,
    t_shard: tuple[int, ...] | None,
    shape: tuple[int, ...],
    source_strides: tuple[int, ...],
    target_strides: tuple[int, ...],
) -> tuple[bool, int, int, int, int, bool, bool]:
    """``_kind`` as a pure function of the shard shapes it reads, remembered: the layers of a
    model repeat the same few (shards, shape, strides) combinations in every plan."""
    n = len(shape)
    sound = (
        s_shard is not None
        and t_shard is not None
        and len(source_strides) == n
        and len(target_strides) == n
        and _nonempty(shape)
        and all(v >= 0 for v in (*source_strides, *target_strides))
        and not any(e > 1 and v == 0 for e, v in zip(shape, target_strides))
    )
    if not sound or s_shard is None or t_shard is None:
        return False, 0, 0, 0, 0, False, False
    s_reach = sum((e - 1) * v for e, v in zip(shape, source_strides))
    t_reach = sum((e - 1) * v for e, v in zip(shape, target_strides))
    s_rm = n == len(s_shard) and _row_major_on(source_strides, shape, s_shard)
    t_rm = n == len(t_shard) and _row_major_on(target_strides, shape, t_shard)
    return True, s_reach, t_reach, volume(s_shard), volume(t_shard), s_rm, t_rm


def _box_in(
    offset: int, shape: tuple[int, ...], strides: tuple[int, ...], shard: tuple[int, ...]
) -> tuple[int, ...] | str:
    """Origin of the box a segment side covers in its shard, or why it is not a box."""
    if len(shape) != len(shard):
        return f"has {len(shape)} axes, its shard {shard} has {len(shard)}"
    if not _row_major_on(strides, shape, shard):
        return f"strides {strides} are not the row-major strides of shard {shard}"
    origin = _decode(offset, shard)
    if origin is None or any(o + e > s for o, e, s in zip(origin, shape, shard)):
        return f"offset {offset} with shape {shape} wraps past the edge of shard {shard}"
    return origin


def _runs(seg: TransferSegment, s_shard: tuple[int, ...], t_shard: tuple[int, ...]) -> tuple[Array, Array, Array]:
    """Element-level fallback: a non-box segment as row runs that are boxes on both sides.

    Each element's write and read addresses are decoded to shard coordinates and ordered by write
    address; consecutive elements join a run while both coordinates advance by one along the last
    shard axis within the same row. Each run is a box of extent ``(1, ..., 1, n)`` in both shards
    with the segment's own (read, write) correspondence, so the runs go through exactly the same
    box checks as ordinary segments. Ordering by write address keeps a permuted-axes view of a
    plain copy to one run per row. Returns (write origins, read origins, extents).
    """
    w = _addresses(seg.target_offset, seg.shape, seg.target_strides)
    r = _addresses(seg.source_offset, seg.shape, seg.source_strides)
    order = np.argsort(w, kind="stable")
    w = w[order]
    r = r[order]
    d = len(t_shard)
    n = w.size
    if d == 0:
        empty = np.zeros((n, 0), dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    wc = np.stack(np.unravel_index(w, t_shard), axis=1).astype(np.int64)
    rc = np.stack(np.unravel_index(r, s_shard), axis=1).astype(np.int64)
    joins = (
        np.all(wc[1:, :-1] == wc[:-1, :-1], axis=1)
        & (wc[1:, -1] == wc[:-1, -1] + 1)
        & np.all(rc[1:, :-1] == rc[:-1, :-1], axis=1)
        & (rc[1:, -1] == rc[:-1, -1] + 1)
    )
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    lengths = np.diff(np.append(starts, n))
    ext = np.ones((starts.size, d), dtype=np.int64)
    ext[:, -1] = lengths
    return wc[starts], rc[starts], ext


@dataclass
class _Rows:
    """Box segments (and fallback runs) as arrays: one row per box copy."""

    seg: Array  # original segment index
    t_loc: Array
    s_loc: Array
    w_lo: Array  # write origin in the target shard
    r_lo: Array  # read origin in the source shard
    ext: Array


def _boxes(tags: Array, lo: Array, ext: Array) -> list[Box]:
    return [Box((t, *o), (1, *e)) for t, o, e in zip(tags.tolist(), lo.tolist(), ext.tolist())]


def _volumes(ext: Array) -> Array:
    return np.prod(ext, axis=1, dtype=np.int64) if ext.shape[1] else np.ones(ext.shape[0], dtype=np.int64)


def _plain_extent(shape: tuple[int, ...], ndim: int) -> bool:
    """A segment shape that can be an int64 row of box extents: ``ndim`` axes, each 1..2**62."""
    return len(shape) == ndim and all(type(e) is int and 0 < e <= MAX_COORDINATE for e in shape)


def _fast_boxes(
    segments: Sequence[TransferSegment],
    kind_of: Sequence[int],
    kinds: Sequence[tuple[bool, int, int, int, int, bool, bool]],
    kind_segment: Sequence[TransferSegment],
    src: _Layout,
    tgt: _Layout,
    ndim: int,
) -> tuple[Array, Array, Array] | None:
    """The per-segment fast path of ``_check_plan`` on arrays: (is a box row, write origins, read
    origins of those rows), or ``None`` when the offsets do not fit int64 (then every segment
    takes the per-segment path).

    A segment is accepted exactly when the per-segment path would accept it without looking
    further: its kind is sound with row-major strides on both sides, both footprints lie in their
    shards, and both offsets decode to box origins whose boxes fit (``_box_origin``). Decoding a
    row-major offset ``0 <= x < numel`` one axis at a time is ``(x // stride) % size`` per axis,
    which is what is computed here for all segments at once. Anything else is left to the
    per-segment path, which decides and explains.
    """
    n = len(segments)
    try:
        s_off = np.fromiter((seg.source_offset for seg in segments), dtype=np.int64, count=n)
        t_off = np.fromiter((seg.target_offset for seg in segments), dtype=np.int64, count=n)
    except (OverflowError, TypeError, ValueError):
        return None
    usable: list[bool] = []
    table: list[tuple[int, ...]] = []  # per kind: numel - reach per side, then strides and sizes
    neutral = (1,) * ndim
    for (sound, s_reach, t_reach, s_numel, t_numel, s_rm, t_rm), seg in zip(kinds, kind_segment):
        ok = sound and s_rm and t_rm and _plain_extent(seg.shape, ndim)
        s_shard = src.shards.get(seg.source_rank, ()) if ok else neutral
        t_shard = tgt.shards.get(seg.target_rank, ()) if ok else neutral
        # A footprint that fits leaves every size >= 1 (no division by zero below) and keeps
        # numel - reach within int64.
        ok = (ok and len(s_shard) == ndim and len(t_shard) == ndim
              and 0 <= s_reach < s_numel and 0 <= t_reach < t_numel)
        if not ok:
            s_shard = t_shard = neutral
        usable.append(ok)
        table.append((
            s_numel - s_reach if ok else 0, t_numel - t_reach if ok else 0,
            *(_rm(s_shard) if ok else neutral), *s_shard, *(_rm(t_shard) if ok else neutral), *t_shard,
            *(seg.shape if ok else neutral),
        ))
    kind = np.asarray(kind_of, dtype=np.int64)
    per_kind = np.array(table, dtype=np.int64).reshape(len(table), 2 + 5 * ndim)[kind]
    s_room, t_room = per_kind[:, 0], per_kind[:, 1]
    s_str, s_size, t_str, t_size, ext = (per_kind[:, 2 + a * ndim: 2 + (a + 1) * ndim] for a in range(5))
    accepted = np.asarray(usable, dtype=bool)[kind] & (s_off >= 0) & (s_off < s_room) & (t_off >= 0) & (t_off < t_room)
    s_safe = np.where(accepted, s_off, 0)
    t_safe = np.where(accepted, t_off, 0)
    w = (t_safe[:, None] // t_str) % t_size
    r = (s_safe[:, None] // s_str) % s_size
    accepted &= np.all(w + ext <= t_size, axis=1) & np.all(r + ext <= s_size, axis=1)
    return accepted, w[accepted], r[accepted]


def _check_plan(
    segments: Sequence[TransferSegment], src: _Layout, tgt: _Layout, fallback_elements: int
) -> Verdict:
    """Judge segments against validated maps, in the order of the module docstring.

    Each segment becomes one row (a box copy), or, if it is not a box in its shards, row runs from
    the element-level fallback. When the non-box segments exceed ``fallback_elements`` they are left
    out and the verdict can be at best ``unverifiable``, but the rows that were checked can still
    yield a concrete counterexample (a double write or a wrong element is wrong whatever the rest
    of the plan does); a gap cannot, since a left-out segment might fill it.
    """
    n_seg = len(segments)
    ndim = len(tgt.logical_shape)
    # Classify: a box on both sides, or a candidate for the element-level fallback. What depends
    # only on (locations, shape, strides) is computed once per distinct combination; the offsets
    # are checked per segment. Anything the fast filter does not accept goes to ``_structural``
    # and ``_box_in``, which are authoritative and write the messages.
    index_of_kind: dict[tuple[object, ...], int] = {}
    kinds: list[tuple[bool, int, int, int, int, bool, bool]] = []
    kind_segment: list[TransferSegment] = []
    kind_of: list[int] = []
    for seg in segments:
        key = (seg.source_rank, seg.target_rank, seg.shape, seg.source_strides, seg.target_strides)
        k = index_of_kind.get(key)
        if k is None:
            k = index_of_kind[key] = len(kinds)
            kinds.append(_kind(seg, src, tgt))
            kind_segment.append(seg)
        kind_of.append(k)
    boxes = _fast_boxes(segments, kind_of, kinds, kind_segment, src, tgt, ndim) if n_seg >= _ARRAY_SEGMENTS else None
    if boxes is None:
        slow: Iterable[int] = range(n_seg)
    else:
        slow = np.flatnonzero(~boxes[0]).tolist()
    seg_ids: list[int] = []
    w_rows: list[tuple[int, ...]] = []
    r_rows: list[tuple[int, ...]] = []
    e_rows: list[tuple[int, ...]] = []
    odd: list[tuple[int, str]] = []
    for i in slow:  # in segment order, so the first structural problem is the one reported
        seg = segments[i]
        sound, s_reach, t_reach, s_numel, t_numel, s_rm, t_rm = kinds[kind_of[i]]
        if not (
            sound
            and seg.source_offset >= 0
            and seg.source_offset + s_reach < s_numel
            and seg.target_offset >= 0
            and seg.target_offset + t_reach < t_numel
        ):
            problem = _structural(i, seg, src, tgt)
            if problem is not None:
                return problem
        s_shard = src.shards[seg.source_rank]
        t_shard = tgt.shards[seg.target_rank]
        if s_rm and t_rm:
            w_box = _box_origin(seg.target_offset, t_shard, seg.shape)
            r_box = _box_origin(seg.source_offset, s_shard, seg.shape) if w_box is not None else None
            if w_box is not None and r_box is not None:
                seg_ids.append(i)
                w_rows.append(w_box)
                r_rows.append(r_box)
                e_rows.append(seg.shape)
                continue
        w = _box_in(seg.target_offset, seg.shape, seg.target_strides, t_shard)
        r = _box_in(seg.source_offset, seg.shape, seg.source_strides, s_shard)
        if isinstance(w, str) or isinstance(r, str):
            side = f"target: {w}" if isinstance(w, str) else f"source: {r}"
            odd.append((i, f"segment {i} is not a box in its {side}"))
            continue
        seg_ids.append(i)
        w_rows.append(w)
        r_rows.append(r)
        e_rows.append(seg.shape)
    ids = np.asarray(seg_ids, dtype=np.int64)
    w_lo = np.asarray(w_rows, dtype=np.int64).reshape(len(w_rows), ndim)
    r_lo = np.asarray(r_rows, dtype=np.int64).reshape(len(r_rows), ndim)
    ext = np.asarray(e_rows, dtype=np.int64).reshape(len(e_rows), ndim)
    if boxes is not None:  # merge the array-decoded rows in, keeping segment order
        accepted, w_fast, r_fast = boxes
        fast_ids = np.flatnonzero(accepted)
        kind_ext = np.array(
            [seg.shape if _plain_extent(seg.shape, ndim) else (0,) * ndim for seg in kind_segment], dtype=np.int64
        ).reshape(len(kind_segment), ndim)
        order = np.argsort(np.concatenate((fast_ids, ids)), kind="stable")
        ids = np.concatenate((fast_ids, ids))[order]
        w_lo = np.concatenate((w_fast, w_lo))[order]
        r_lo = np.concatenate((r_fast, r_lo))[order]
        ext = np.concatenate((kind_ext[np.asarray(kind_of, dtype=np.int64)[fast_ids]], ext))[order]
    odd_elements = sum(segments[i].numel for i, _ in odd)
    pending: Verdict | None = None
    parts_seg = [ids]
    parts_w = [w_lo]
    parts_r = [r_lo]
    parts_e = [ext]
    expanded = 0
    if odd and odd_elements > fallback_elements:
        first, why = odd[0]
        pending = Verdict(
            "unverifiable",
            reason=(
                f"{why}; the {len(odd)} non-box segment(s) total {odd_elements} elements, more than the "
                f"element-level fallback budget of {fallback_elements}"
            ),
            target_location=segments[first].target_rank,
            segments=(first,),
            checked_segments=n_seg,
        )
    else:
        for i, _ in odd:
            seg = segments[i]
            w_lo, r_lo, ext = _runs(seg, src.shards[seg.source_rank], tgt.shards[seg.target_rank])
            parts_seg.append(np.full(w_lo.shape[0], i, dtype=np.int64))
            parts_w.append(w_lo)
            parts_r.append(r_lo)
            parts_e.append(ext)
            expanded += seg.numel
    seg_of = np.concatenate(parts_seg)
    rows = _Rows(
        seg_of,
        np.asarray([segments[i].target_rank for i in seg_of.tolist()], dtype=np.int64),
        np.asarray([segments[i].source_rank for i in seg_of.tolist()], dtype=np.int64),
        np.concatenate(parts_w),
        np.concatenate(parts_r),
        np.concatenate(parts_e),
    )
    verdict = _check_exactly_once(rows, segments, tgt, check_gaps=pending is None)
    if verdict is None:
        verdict = _check_values(rows, segments, src, tgt)
    if verdict is None:
        verdict = pending
    if verdict is None:
        verdict = Verdict(
            "ok",
            reason=(
                f"{n_seg} segment(s) verified: every target element is written exactly once with its own "
                "logical element, read from a source location that holds it"
            ),
        )
    return Verdict(
        verdict.status, None, verdict.reason, verdict.target_location, verdict.target_offset,
        verdict.logical_coordinate, verdict.segments, verdict.map_error, n_seg, expanded,
    )


def _unverifiable_internal(what: str) -> Verdict:
    return Verdict("unverifiable", reason=f"internal consistency check failed ({what}); not judged")


def _write_slabs(t_loc: Array, lo: Array, ext: Array) -> bool:
    """Whether, per target location, the write boxes' spans on axis 0 are pairwise disjoint
    (sorted by start, each ends where or before the next begins): then no two boxes overlap. A
    sufficient test, exact when true; ``False`` sends the rows to the k-d query."""
    if lo.shape[0] < 2:
        return True
    if lo.shape[1] == 0 or not bool(np.all(ext[:, 0] > 0)):
        return False
    order = np.lexsort((lo[:, 0], t_loc))
    loc = t_loc[order]
    start = lo[order, 0]
    end = start + ext[order, 0]
    return bool(np.all((end[:-1] <= start[1:]) | (loc[:-1] != loc[1:])))


def _check_exactly_once(
    rows: _Rows, segments: Sequence[TransferSegment], tgt: _Layout, *, check_gaps: bool
) -> Verdict | None:
    """No target address written twice (disjoint write boxes per location), and, when every
    segment was reduced to boxes, none left unwritten (volumes add up to each shard)."""
    if _write_slabs(rows.t_loc, rows.w_lo, rows.ext):
        boxes: list[Box] = []
        pairs: set[tuple[int, int]] = set()  # per location the write boxes are disjoint slabs
    else:
        boxes = _boxes(rows.t_loc, rows.w_lo, rows.ext)
        pairs = overlapping_pairs(boxes)
    if pairs:
        best: tuple[int, int, int, int, tuple[int, ...]] | None = None
        for i, j in pairs:
            common = boxes[i].intersect(boxes[j])
            assert common is not None
            loc = common.origin[0]
            coord = common.origin[1:]
            key = (loc, _row_major_offset(coord, tgt.shards[loc]), i, j, coord)
            if best is None or key < best:
                best = key
        assert best is not None
        loc, offset, i, j, coord = best
        involved = tuple(sorted({int(rows.seg[i]), int(rows.seg[j])}))
        by = f"segments {involved[0]} and {involved[1]}" if len(involved) == 2 else f"segment {involved[0]} twice"
        return Verdict(
            "invalid",
            reason=f"target location {loc}, offset {offset} is written more than once (by {by})",
            target_location=loc, target_offset=offset, logical_coordinate=_logical_at(tgt, loc, coord),
            segments=involved,
        )
    if not check_gaps:
        return None
    vols = _volumes(rows.ext)
    for loc in sorted(tgt.shards):
        mask = rows.t_loc == loc
        written = int(vols[mask].sum()) if vols.size else 0
        numel = volume(tgt.shards[loc])
        if written == numel:
            continue
        if written > numel:
            return _unverifiable_internal(f"disjoint writes exceed shard {loc}")
        if not boxes:
            boxes = _boxes(rows.t_loc, rows.w_lo, rows.ext)
        mine = [b for b, m in zip(boxes, mask.tolist()) if m]
        shard = tgt.shards[loc]
        gap = covers(Box((loc, *(0,) * len(shard)), (1, *shard)), mine)
        if gap is None:
            return _unverifiable_internal(f"volume says shard {loc} has a gap, covers() finds none")
        coord = gap.origin[1:]
        offset = _row_major_offset(coord, shard)
        return Verdict(
            "invalid",
            reason=(
                f"target location {loc}, offset {offset} is never written (the plan writes {written} of "
                f"the {numel} elements of shard {shard}; unwritten box {Box(coord, gap.extent[1:])})"
            ),
            target_location=loc, target_offset=offset, logical_coordinate=_logical_at(tgt, loc, coord),
        )
    return None


def _pieces(layout: _Layout) -> tuple[Array, ...]:
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


def _ranges(first: Array, count: Array) -> tuple[Array, Array]:
    """For rows with candidate runs ``[first, first + count)``: (row index, candidate) pairs."""
    rows = np.repeat(np.arange(first.size, dtype=np.int64), count)
    skip = np.repeat(np.cumsum(count) - count, count)
    return rows, np.repeat(first, count) + np.arange(rows.size, dtype=np.int64) - skip


def _slab_axis(lo: Array, ext: Array) -> tuple[int, Array] | None:
    """An axis on which the boxes' intervals are pairwise disjoint, with the boxes sorted on it."""
    for axis in range(lo.shape[1]):
        order = np.argsort(lo[:, axis], kind="stable")
        if bool(np.all(lo[order[:-1], axis] + ext[order[:-1], axis] <= lo[order[1:], axis])):
            return axis, order
    return None


def _cut(tags: Array, lo: Array, ext: Array, pieces: tuple[Array, ...]) -> tuple[Array, Array, Array, Array]:
    """Cut boxes (tagged by location) by that location's pieces.

    Returns (box index, piece index, cut origin, cut extent) for every non-empty intersection,
    sorted by (box, piece). Each box lies inside its shard and the pieces tile the shard (Premise
    A), so the cuts of a box tile it. The pairs are found without comparing all boxes with all
    pieces: a location with one piece takes every box whole; a location whose pieces are slabs
    along one axis (disjoint intervals there; tiling then makes each span the other axes) is
    searched by bisection on that axis; any other location goes to the k-d query
    ``overlapping_pairs``. Whatever found them, the cuts of each box are re-checked to add up to
    the box, so a missed pair cannot pass silently.
    """
    p_loc, p_lo, p_ext, _, locs, p_first, p_count = pieces
    n, d = lo.shape
    pos = np.minimum(np.searchsorted(locs, tags), max(locs.size - 1, 0))
    if n and (locs.size == 0 or not np.array_equal(locs[pos], tags)):
        raise AssertionError("a box lies in a shard without pieces")
    found_a: list[Array] = []
    found_p: list[Array] = []
    single = np.flatnonzero(p_count[pos] == 1) if n else np.zeros(0, dtype=np.int64)
    found_a.append(single)
    found_p.append(p_first[pos[single]])
    general_rows: list[Array] = []
    general_pieces: list[Array] = []
    multi = np.flatnonzero(p_count[pos] > 1) if n else np.zeros(0, dtype=np.int64)
    order = multi[np.argsort(pos[multi], kind="stable")]
    bounds = np.flatnonzero(np.diff(pos[order])) + 1
    for rows in np.split(order, bounds) if order.size else []:
        u = int(pos[rows[0]])
        mine = np.arange(p_first[u], p_first[u] + p_count[u], dtype=np.int64)
        slab = _slab_axis(p_lo[mine], p_ext[mine]) if d else None
        if slab is None:
            general_rows.append(rows)
            general_pieces.append(mine)
            continue
        axis, sort = slab
        sorted_pieces = mine[sort]
        starts = p_lo[sorted_pieces, axis]
        ends = starts + p_ext[sorted_pieces, axis]
        first = np.searchsorted(ends, lo[rows, axis], side="right")
        last = np.searchsorted(starts, lo[rows, axis] + ext[rows, axis], side="left")
        which, candidate = _ranges(first, np.maximum(last - first, 0))
        found_a.append(rows[which])
        found_p.append(sorted_pieces[candidate])
    if general_rows:
        rows = np.concatenate(general_rows)
        cands = np.concatenate(general_pieces)
        boxes = _boxes(tags[rows], lo[rows], ext[rows]) + _boxes(p_loc[cands], p_lo[cands], p_ext[cands])
        groups = [0] * rows.size + [1] * cands.size
        pairs = overlapping_pairs(boxes, groups=groups)
        found_a.append(np.asarray([rows[i] for i, _ in pairs], dtype=np.int64))
        found_p.append(np.asarray([cands[j - rows.size] for _, j in pairs], dtype=np.int64))
    a = np.concatenate(found_a).astype(np.int64)
    p = np.concatenate(found_p).astype(np.int64)
    keep = np.lexsort((p, a))
    a, p = a[keep], p[keep]
    c_lo = np.maximum(lo[a], p_lo[p]).reshape(a.size, d)
    c_hi = np.minimum(lo[a] + ext[a], p_lo[p] + p_ext[p]).reshape(a.size, d)
    c_ext = c_hi - c_lo
    if np.any(c_ext <= 0):
        raise AssertionError("a reported cut is empty")
    got = np.zeros(n, dtype=np.int64)
    np.add.at(got, a, _volumes(c_ext))
    if not np.array_equal(got, _volumes(ext)):
        raise AssertionError("the cuts of a box do not add up to the box")
    return a, p, c_lo, c_ext


def _check_values(
    rows: _Rows, segments: Sequence[TransferSegment], src: _Layout, tgt: _Layout
) -> Verdict | None:
    """Every written element is the logical element the target expects, from a real holder.

    Cut write boxes by target pieces (logical box via the target piece), carry each cut to the
    read side, cut again by source pieces (logical box via the source piece), and compare the two
    logical origins of each final sub-box. Both are translations of the same sub-box, so equal
    origins mean every element of it is right.
    """
    t_pieces = _pieces(tgt)
    s_pieces = _pieces(src)
    try:
        a, p, x_lo, x_ext = _cut(rows.t_loc, rows.w_lo, rows.ext, t_pieces)
        want = x_lo - t_pieces[1][p] + t_pieces[3][p]  # logical origin the target expects
        y_lo = x_lo - rows.w_lo[a] + rows.r_lo[a]  # the same sub-box on the read side
        b, q, z_lo, _ = _cut(rows.s_loc[a], y_lo, x_ext, s_pieces)
    except AssertionError as exc:
        return _unverifiable_internal(str(exc))
    need = z_lo - y_lo[b] + want[b]
    have = z_lo - s_pieces[1][q] + s_pieces[3][q]
    wrong = np.flatnonzero(np.any(need != have, axis=1)) if need.shape[1] else np.zeros(0, dtype=np.int64)
    if wrong.size == 0:
        return None
    best: tuple[int, int, int, int] | None = None
    for k in wrong.tolist():
        row = int(a[b[k]])
        loc = int(rows.t_loc[row])
        t_coord = (z_lo[k] - y_lo[b[k]] + x_lo[b[k]]).tolist()
        key = (loc, _row_major_offset(t_coord, tgt.shards[loc]), int(rows.seg[row]), k)
        if best is None or key < best:
            best = key
    assert best is not None
    loc, offset, seg_index, k = best
    seg = segments[seg_index]
    needed = tuple(int(v) for v in need[k])
    got = tuple(int(v) for v in have[k])
    read_at = _row_major_offset(z_lo[k].tolist(), src.shards[seg.source_rank])
    holders = _holders_of(src, needed)
    return Verdict(
        "invalid",
        reason=(
            f"target location {loc}, offset {offset} needs logical {needed}, but segment {seg_index} reads "
            f"source location {seg.source_rank} at offset {read_at}, which holds logical {got} "
            f"(logical {needed} is held by source location(s) {holders})"
        ),
        target_location=loc, target_offset=offset, logical_coordinate=needed, segments=(seg_index,),
    )


# ---------------------------------------------------------------------------------------------
# Public entry points


def verify_plan(
    target_map: MapLike,
    source_map: MapLike,
    plan: PlanLike,
    *,
    parameter: str | None = None,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
) -> Verdict:
    """Judge ``plan`` against its maps (target first, like ``plan_transfer``); never raises on input.

    ``plan`` may be a ``TransferPlan``, a plan dict ``{logical_shape, segments}`` (DeepSpeed's
    ``to_dict()``), or a list of segments (``TransferSegment`` or dicts). Maps may be
    ``ParamAffineMap`` or their dict form.
    """
    with cycle_collection_paused():
        return _verify_plan(target_map, source_map, plan, parameter=parameter, fallback_elements=fallback_elements)


def _verify_plan(
    target_map: MapLike,
    source_map: MapLike,
    plan: PlanLike,
    *,
    parameter: str | None = None,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
    layouts: dict[Any, _Layout] | None = None,
) -> Verdict:
    """``verify_plan``'s body; ``layouts`` remembers validated maps within one ``verify_plans``."""
    try:
        target = _as_map(target_map, "target")
        source = _as_map(source_map, "source")
        if tuple(target.logical_shape) != tuple(source.logical_shape):
            raise InvalidMapError(
                f"target map describes {target.logical_shape}, source map {source.logical_shape}: "
                "a reshape is not a transfer"
            )
        src = _validated(source, "source", layouts)
        tgt = _validated(target, "target", layouts)
    except AffineTransferError as exc:
        return Verdict(
            "invalid_map", parameter, reason="a map is invalid, so the plan was not judged",
            map_error=f"{type(exc).__name__}: {exc}",
        )
    except _TooLarge as exc:
        return Verdict("unverifiable", parameter, reason=str(exc))
    try:
        segments, plan_shape = _parse_plan(plan)
    except AffineTransferError as exc:
        return Verdict("invalid", parameter, reason=f"malformed plan: {exc}")
    if plan_shape is not None and plan_shape != tgt.logical_shape:
        return Verdict(
            "invalid", parameter,
            reason=f"the plan describes logical shape {plan_shape}, the maps {tgt.logical_shape}",
        )
    return _check_plan(segments, src, tgt, fallback_elements).with_parameter(parameter)


def verify_plans(
    pairs: Mapping[str, tuple[MapLike, MapLike]],
    plans: Mapping[str, PlanLike],
    *,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
) -> BatchVerdict:
    """``verify_plan`` for every parameter; one missing from either side is ``invalid``."""
    with cycle_collection_paused():
        return _verify_plans(pairs, plans, fallback_elements)


def _verify_plans(
    pairs: Mapping[str, tuple[MapLike, MapLike]], plans: Mapping[str, PlanLike], fallback_elements: int
) -> BatchVerdict:
    verdicts: dict[str, Verdict] = {}
    layouts: dict[Any, _Layout] = {}
    for name in sorted(set(pairs) | set(plans)):
        if name not in plans:
            verdicts[name] = Verdict("invalid", name, reason="the maps describe this parameter but no plan does")
        elif name not in pairs:
            verdicts[name] = Verdict("invalid", name, reason="a plan for a parameter the maps do not describe")
        else:
            target, source = pairs[name]
            verdicts[name] = _verify_plan(
                target, source, plans[name], parameter=name, fallback_elements=fallback_elements, layouts=layouts
            )
    return BatchVerdict(_worst(v.status for v in verdicts.values()), verdicts)


def run_verify_cli(maps_path: str, plans_path: str, *, as_json: bool = False, quiet: bool = False) -> int:
    """``refplan verify MAPS.json PLANS.json``: print a report, return the exit code.

    Exit 0 ok, 1 invalid, 3 unverifiable, 2 bad input: a file that cannot be read or parsed (one
    line on stderr), or a map that fails validation (reported per parameter as ``invalid_map``).
    The plans file is a ``refplan.plans/1`` batch, or a bare ``{logical_shape, segments}`` plan
    dict (DeepSpeed's) when the maps file holds exactly one parameter. ``quiet`` prints no text
    report (the exit code says it all; ``--json`` is still printed, since it was asked for).
    """
    try:
        batch = read_maps(maps_path)
    except (AffineTransferError, InputFileError) as exc:
        print(f"refplan verify: bad input: {exc}", file=sys.stderr)
        return 2
    try:
        doc = load_json(plans_path)
        if isinstance(doc, Mapping) and "format" not in doc and "segments" in doc:
            if len(batch.pairs) != 1:
                raise InvalidMapError(
                    f"{plans_path}: a bare plan needs a maps file with exactly one parameter, "
                    f"this one has {len(batch.pairs)}"
                )
            (name,) = batch.pairs
            check_keys(doc, "plan")
            plans = {name: TransferPlan.from_dict(doc, f"plans[{name!r}]")}
        else:
            plans = parse_plans(doc)
    except InputFileError as exc:
        print(f"refplan verify: bad input: {exc}", file=sys.stderr)
        return 2
    except AffineTransferError as exc:
        text = str(exc)
        where = text if text.startswith(str(plans_path)) else f"{plans_path}: {text}"
        print(f"refplan verify: bad input: {where}", file=sys.stderr)
        return 2
    result = verify_plans(batch.pairs, plans)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    elif not quiet:
        print(result)
    for name in sorted(result.verdicts):
        verdict = result.verdicts[name]
        if verdict.status == "invalid_map":
            print(f"refplan verify: bad input: parameter {name!r}: {verdict.map_error}", file=sys.stderr)
            break
    return result.exit_code
