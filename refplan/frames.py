"""Validating one map into frames: Premise A and holder exactness.

A *frame* is a non-empty piece after validation: a box of F, the box it occupies in its shard,
and the shard's row-major strides, so ``frame.address(sub_box)`` is the shard offset of any
sub-box. Everything downstream (regions, requests, addresses of split parts) is computed from
frames, never from raw pieces, so every rule here guards a step of the proof
(``proofs/theorem3.md``):

- ``normalize`` — rules R1–R15: each piece is a box in F *and* a box in its shard (row-major
  strides on every axis of size > 1, offsets that decode to coordinates, boxes inside bounds).
- ``check_shards_tile`` — Premise A (R16–R18): per location the local boxes are pairwise disjoint
  and their volumes sum to the shard size, so every shard address belongs to exactly one frame.
  Disjoint *logical* boxes do not imply this (DeepSpeed #8624), which is why it is checked on
  addresses.
- ``check_holders`` — R19–R21: a piece's ``locations`` is exactly the set of locations whose
  pieces meet its box, and each of them holds all of it. That is what lets a request's candidates
  be trusted: any of them can serve any sub-box.

Rule numbers and message fragments are those of ``spec/validation.md``. No check visits
elements, and none loops over all pairs of pieces: overlaps come from ``box.overlapping_pairs``.

A small map that plainly passes every rule (``limits.SMALL_MAP_PIECES``) is validated in one
pure-Python pass instead (``_small_normalize``): the same frames and the same work charged, and
anything unusual, every refusal included, goes the way above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from operator import add, attrgetter, gt, mul
from typing import Any, NamedTuple

import numpy as np

from . import limits
from .box import (
    Box,
    WorkCounter,
    box_arrays,
    decode_row_major,
    decode_row_major_array,
    overlap_volumes,
    overlapping_pair_array,
    overlapping_pairs,
    row_major_strides,
    separated,
    volume,
)
from .errors import AffineTransferError, InvalidMapError, UnsupportedLayoutError, show_int, show_ints, show_list
from .limits import MAX_COORDINATE, PlanBudget, as_budget
from .maps import AffinePiece, MapContent, ParamAffineMap, piece_arrays

__all__ = [
    "MAX_COORDINATE",
    "Frame",
    "NormalizedMap",
    "check_holders",
    "check_shards_tile",
    "check_sizes",
    "normalize",
    "pair_budget",
]


class Frame(NamedTuple):
    """A validated non-empty piece: where it lies in F, where in its shard, and who holds it.

    ``shift`` is the address the frame's translation gives logical coordinate 0 (possibly
    negative), so ``address`` is one dot product. A named tuple because maps have 10⁵ of them.
    """

    location: int
    piece_index: int
    locations: frozenset[int]
    box: Box
    local: Box
    shard_shape: tuple[int, ...]
    strides: tuple[int, ...]
    shift: int

    def address(self, sub: Box) -> int:
        """Shard offset of ``sub``'s first element; ``sub`` must lie inside ``self.box``.

        Row-major strides make this a bijection between the frame's logical box and its local box
        (proof: address lemma), which is why a holder's copy of any sub-box is found here.
        """
        offset: int = sum(map(mul, sub.origin, self.strides))
        return offset + self.shift


def _frame(
    location: int, index: int, locations: frozenset[int], box: Box, local: Box, shard: tuple[int, ...],
    strides: tuple[int, ...],
) -> Frame:
    shift: int = sum(map(mul, local.origin, strides)) - sum(map(mul, box.origin, strides))
    return Frame(location, index, locations, box, local, shard, strides, shift)


@dataclass(frozen=True)
class NormalizedMap:
    """A map that passed every rule: its frames sorted by (location, origin, extent)."""

    parameter: str
    side: str
    logical_shape: tuple[int, ...]
    shard_shapes: dict[int, tuple[int, ...]]
    frames: tuple[Frame, ...]
    piece_count: int


def _where(parameter: str, side: str, location: int | None = None, piece: int | None = None) -> str:
    text = f"parameter {parameter!r}, {side} map"
    if location is not None:
        text += f", location {show_int(location)}"
    if piece is not None:
        text += f", piece {piece}"
    return text


def _budget_error(parameter: str, side: str, name: str, limit: int) -> AffineTransferError:
    return AffineTransferError(
        f"{_where(parameter, side)}: validation needs more than {name}={limit} box comparisons; "
        "the plan is refused rather than truncated (raise the budget to plan it)"
    )


def pair_budget(parameter: str, side: str, budget: PlanBudget) -> WorkCounter:
    """A counter of box comparisons that refuses with ``max_pair_checks`` once exhausted."""

    def refuse(_count: int) -> None:
        raise _budget_error(parameter, side, "max_pair_checks", budget.max_pair_checks)

    return WorkCounter(budget.max_pair_checks, refuse)


def _piece_frame(
    piece: AffinePiece,
    index: int,
    loc: int,
    shard: tuple[int, ...],
    shard_strides: tuple[int, ...],
    logical: tuple[int, ...],
    logical_strides: tuple[int, ...],
    parameter: str,
    side: str,
) -> Frame | None:
    """Rules R7–R15 for one piece; its frame, or ``None`` for an empty piece (R12).

    The message prefix is built only on failure: this runs once per piece of 10⁵-piece maps.
    """
    ndim = len(logical)
    shape = piece.shape

    def where() -> str:
        return _where(parameter, side, loc, index)

    if len(shape) != ndim:  # R7
        raise InvalidMapError(f"{where()}: piece shape {shape} has a different number of axes than {logical}")
    _check_shape(shape, "piece shape", where)  # R8
    if not piece.locations:  # R9
        raise InvalidMapError(f"{where()}: the piece names no holder (empty locations)")
    if piece.scale != 1.0:  # R10
        raise UnsupportedLayoutError(
            f"{where()}: scale {piece.scale} is not 1; a scaled piece cannot be copied as-is "
            "(a resumed optimizer would stay in the source coordinate)"
        )
    if len(piece.source_strides) != ndim or len(piece.dest_strides) != ndim:  # R11
        raise InvalidMapError(
            f"{where()}: stride vector length {len(piece.source_strides)}/{len(piece.dest_strides)} "
            f"does not match the piece's {ndim} axes"
        )
    if 0 in shape:  # R12: empty pieces carry running offsets that may be out of range
        return None
    for value in (piece.source_offset, piece.dest_offset, *piece.source_strides, *piece.dest_strides):
        if abs(value) > MAX_COORDINATE:
            raise InvalidMapError(f"{where()}: offset or stride {show_int(value)} is above 2**62")
    if not _strides_match(shape, piece.source_strides, logical_strides):  # R13
        raise UnsupportedLayoutError(
            f"{where()}: source strides {piece.source_strides} are not the row-major strides "
            f"{logical_strides} of F (a permutation or transpose is not a box copy)"
        )
    if not _strides_match(shape, piece.dest_strides, shard_strides):
        raise UnsupportedLayoutError(
            f"{where()}: dest strides {piece.dest_strides} are not the row-major strides "
            f"{shard_strides} of the shard {shard}"
        )
    origin = decode_row_major(piece.source_offset, logical)  # R14
    if origin is None:
        raise InvalidMapError(f"{where()}: source offset {piece.source_offset} is not a coordinate of F {logical}")
    local_origin = decode_row_major(piece.dest_offset, shard)
    if local_origin is None:
        raise InvalidMapError(
            f"{where()}: dest offset {piece.dest_offset} is not a coordinate of the shard {shard}"
        )
    if any(o + e > size for o, e, size in zip(origin, shape, logical)):  # R15
        raise InvalidMapError(f"{where()}: box {Box(origin, shape)} lies outside the logical parameter {logical}")
    if any(o + e > size for o, e, size in zip(local_origin, shape, shard)):
        raise InvalidMapError(
            f"{where()}: shard box {Box(local_origin, shape)} lies outside the {shard} shard of location {loc}"
        )
    return _frame(loc, index, piece.locations, Box(origin, shape), Box(local_origin, shape), shard, shard_strides)


def _decode(offset: int, strides: tuple[int, ...]) -> tuple[int, ...]:
    """``decode_row_major(offset, shape)`` for an offset known to lie in ``[0, volume(shape))``,
    given ``strides = row_major_strides(shape)`` (tests/test_fast_paths.py holds the two equal)."""
    coord = []
    for stride in strides:
        q, offset = divmod(offset, stride)
        coord.append(q)
    return tuple(coord)


def _common_frame(
    piece: AffinePiece,
    index: int,
    loc: int,
    shard: tuple[int, ...],
    shard_strides: tuple[int, ...],
    shard_numel: int,
    logical: tuple[int, ...],
    logical_strides: tuple[int, ...],
    logical_numel: int,
) -> Frame | None:
    """The frame of a piece that plainly passes R7–R15, or ``None`` to take ``_piece_frame``.

    The common case, checked in one pass: exact row-major stride vectors, scale 1, holders named,
    positive extents, offsets that decode, boxes inside. Every condition here implies the
    matching rule of ``_piece_frame`` holds, and the frame is built the same way, so the result is
    identical; anything else (an error, an empty piece, strides that differ only on size-1 axes)
    returns ``None`` and the full rule path decides, with its messages.
    """
    shape = piece.shape
    if (
        len(shape) != len(logical)
        or piece.source_strides != logical_strides
        or piece.dest_strides != shard_strides
        or piece.scale != 1.0
        or not piece.locations
    ):
        return None
    source_offset = piece.source_offset
    dest_offset = piece.dest_offset
    if not (0 <= source_offset < logical_numel and source_offset <= MAX_COORDINATE):
        return None
    if not (0 <= dest_offset < shard_numel and dest_offset <= MAX_COORDINATE):
        return None
    # In range (checked above), so ``decode_row_major`` would decode both; the strides are at
    # hand, so decode by them directly instead of recomputing the volume and strides per piece.
    origin = _decode(source_offset, logical_strides)
    local_origin = _decode(dest_offset, shard_strides)
    if not all(0 < e <= MAX_COORDINATE and o + e <= s for o, e, s in zip(origin, shape, logical)):
        return None
    if not all(o + e <= s for o, e, s in zip(local_origin, shape, shard)):
        return None
    return _frame(loc, index, piece.locations, Box(origin, shape), Box(local_origin, shape), shard, shard_strides)


def _common_frames(
    pieces: Sequence[AffinePiece],
    loc: int,
    shard: tuple[int, ...],
    shard_strides: tuple[int, ...],
    shard_numel: int,
    logical: tuple[int, ...],
    logical_strides: tuple[int, ...],
    logical_numel: int,
    indices: Sequence[int] | None = None,
) -> list[Frame] | None:
    """``_common_frame`` for every piece of one location in one loop, or ``None`` if any piece is
    not plainly valid (then each piece takes the per-piece path, which decides and explains).
    ``indices`` are the pieces' indices in their location's list (default ``0..n-1``): the
    caller may pass only the non-empty pieces (``_nonempty_indices``).

    Same conditions and same frames as ``_common_frame``; the shift is ``dest_offset`` minus the
    logical origin's dot product with the shard strides, because a decoded row-major offset is
    exactly its coordinate's dot product with those strides.
    """
    ndim = len(logical)
    for piece in pieces:
        if (
            len(piece.shape) != ndim
            or piece.source_strides != logical_strides
            or piece.dest_strides != shard_strides
            or piece.scale != 1.0
            or not piece.locations
        ):
            return None
    # The offsets are decoded for all pieces at once (``box.decode_row_major_array``, once each
    # offset is known to lie in [0, numel)). ``normalize`` passes only shapes
    # whose volumes and strides are at most MAX_COORDINATE = 2**62, so a coordinate plus an extent
    # (each at most 2**62) fits int64; values that do not fit int64 are not common.
    arrays = piece_arrays(pieces, ndim)  # every shape has ndim axes (checked above)
    if arrays is None:
        return None
    ext, src, dst = arrays
    l_shape = np.asarray(logical, dtype=np.int64).reshape(ndim)
    s_shape = np.asarray(shard, dtype=np.int64).reshape(ndim)
    if not (
        bool(np.all((ext > 0) & (ext <= MAX_COORDINATE)))
        and bool(np.all((src >= 0) & (src < logical_numel)))
        and bool(np.all((dst >= 0) & (dst < shard_numel)))
    ):
        return None
    origin = decode_row_major_array(src, np.asarray(logical_strides, dtype=np.int64).reshape(ndim), l_shape)
    local = decode_row_major_array(dst, np.asarray(shard_strides, dtype=np.int64).reshape(ndim), s_shape)
    if not (bool(np.all(origin + ext <= l_shape)) and bool(np.all(local + ext <= s_shape))):
        return None
    # shift = dest offset - (logical origin . shard strides); exact Python ints, as origins and
    # strides are each below 2**62 but their products need not be.
    return [
        Frame(loc, index, piece.locations, Box(o, piece.shape), Box(tuple(q), piece.shape), shard, shard_strides,
              piece.dest_offset - sum(map(mul, o, shard_strides)))
        for index, piece, o, q in zip(
            range(len(pieces)) if indices is None else indices, pieces, map(tuple, origin.tolist()), local.tolist()
        )
    ]


def _nonempty_indices(pieces: Sequence[AffinePiece], ndim: int) -> list[int] | None:
    """The indices of the non-empty pieces when every empty piece plainly passes the rules an
    empty piece is held to (R7-R11: its axes, extents in [0, 2**62], holders named, scale 1,
    stride lengths), so the rest of validation can skip them; ``None`` when there is no empty
    piece or one of them breaks a rule (then every piece takes the usual path, which raises in
    piece order with the rule's message).

    Why: ``_piece_frame`` returns ``None`` for an empty piece only after those checks, so an
    empty piece that passes them contributes nothing; but one empty piece sent the whole
    location off the array path onto the per-piece rule path (a map of 200 000 empty pieces and
    one real one took seconds). This check is one cheap pass, with no decoding per empty piece.
    """
    indices: list[int] = []
    empty = False
    for index, piece in enumerate(pieces):
        shape = piece.shape
        if 0 not in shape:
            indices.append(index)
            continue
        if not (
            len(shape) == ndim
            and min(shape) >= 0
            and max(shape) <= MAX_COORDINATE
            and piece.locations
            and piece.scale == 1.0
            and len(piece.source_strides) == ndim
            and len(piece.dest_strides) == ndim
        ):
            return None
        empty = True
    return indices if empty else None


def _strides_match(shape: Sequence[int], got: Sequence[int], want: Sequence[int]) -> bool:
    """Strides agree on every axis of size > 1 (a size-1 axis is never stepped, so any stride)."""
    if tuple(got) == tuple(want):
        return True
    return all(size <= 1 or g == w for size, g, w in zip(shape, got, want))


def _check_shape(
    values: Sequence[int], what: str, where: str | Callable[[], str], *, whole: bool = False
) -> None:
    """Extents non-negative and at most 2**62; with ``whole``, the volume too.

    A tensor (F or a shard) above 2**62 elements would have addresses past int64, which every
    executor and the oracle's arithmetic assume; pieces are bounded by their tensor's checks.
    """
    for v in values:
        if v < 0 or v > MAX_COORDINATE:
            place = where() if callable(where) else where
            problem = "a negative extent" if v < 0 else "an extent above 2**62"
            raise InvalidMapError(f"{place}: {what} {show_ints(values)} has {problem}")
    if whole and volume(values) > MAX_COORDINATE:
        place = where() if callable(where) else where
        raise InvalidMapError(
            f"{place}: {what} {tuple(values)} has {volume(values)} elements, above 2**62: its addresses "
            "would not fit in int64"
        )


def check_sizes(pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]]) -> None:
    """Only ``normalize``'s size rules (each extent, and the logical and every shard volume, at
    most 2**62), with its class and messages, for tools that do not plan (``refplan verify``).

    Parameters by name, source map then target map, logical shape then shards by location, as
    ``plan_transfers`` meets them, so the first refusal is the planner's for such a map. A
    parameter whose maps disagree on the logical shape (R0), a map with more axes than the
    default ``max_ndim`` (R1) and a shard with another number of axes (R2) are left to whoever
    judges the map: the planner raises those rules first.
    """
    max_ndim = PlanBudget().max_ndim
    for name in sorted(pairs):
        target, source = pairs[name]
        if not isinstance(target, ParamAffineMap) or not isinstance(source, ParamAffineMap):
            continue
        if target.logical_shape != source.logical_shape:
            continue
        for side, param_map in (("source", source), ("target", target)):
            logical = param_map.logical_shape
            _check_shape(logical, "logical shape", partial(_where, name, side), whole=True)
            if len(logical) > max_ndim:
                return  # the planner stops here, at R1
            for loc, shard in sorted(param_map.shard_shapes.items()):
                if len(shard) != len(logical):
                    return  # ... or here, at R2
                _check_shape(shard, "shard shape", partial(_where, name, side, loc), whole=True)


def normalize(
    param_map: ParamAffineMap,
    side: str,
    parameter: str,
    budget: PlanBudget | None = None,
    work: WorkCounter | None = None,
) -> NormalizedMap:
    """Validate ``param_map`` (rules R1–R21) and return its frames.

    Runs the per-piece rules, then ``check_shards_tile`` (Premise A) and ``check_holders``.
    ``side`` is "source" or "target" and only changes messages. Raises the rule's error class with
    a message naming the parameter, side, location, piece and box.
    """
    budget = as_budget(budget, "budget")
    small = _small_normalize(param_map, side, parameter, budget)
    if small is not None:
        result, charged = small
        if work is None:
            work = pair_budget(parameter, side, budget)
        work.add(charged)  # what the checks below charge on such a map, refused by the same counter
        return result
    logical = param_map.logical_shape
    ndim = len(logical)
    _check_shape(logical, "logical shape", partial(_where, parameter, side), whole=True)
    if ndim > budget.max_ndim:  # R1
        raise UnsupportedLayoutError(
            f"{_where(parameter, side)}: {ndim} axes exceed max_ndim={budget.max_ndim}"
        )
    for loc, shard in sorted(param_map.shard_shapes.items()):  # R2
        if len(shard) != ndim:
            raise UnsupportedLayoutError(
                f"{_where(parameter, side, loc)}: shard shape {shard} has a different number of axes "
                f"than the logical shape {logical}"
            )
        _check_shape(shard, "shard shape", partial(_where, parameter, side, loc), whole=True)
    total = param_map.piece_count()  # R3 counts every listed piece, empty ones included
    if total > budget.max_pieces_per_map:
        raise AffineTransferError(
            f"{_where(parameter, side)}: {total} pieces exceed max_pieces_per_map={budget.max_pieces_per_map}"
        )
    _check_location_ids(param_map.ranks, partial(_where, parameter, side))  # R3a
    logical_strides = row_major_strides(logical)
    logical_numel = volume(logical)
    logical_small = max(logical_strides, default=0) <= MAX_COORDINATE
    frames: list[Frame] = []
    for loc in param_map.ranks:
        pieces = param_map.pieces_by_rank.get(loc, ())
        declared = param_map.shard_shapes.get(loc)
        if declared is None:  # R5: listing pieces, even none, without a shard shape is a broken map
            raise InvalidMapError(
                f"{_where(parameter, side, loc)}: lists {len(pieces)} piece(s) but declares no shard shape"
            )
        if not all(isinstance(p, AffinePiece) for p in pieces):  # a map built from plain values
            index = next(i for i, p in enumerate(pieces) if not isinstance(p, AffinePiece))
            raise InvalidMapError(
                f"{_where(parameter, side, loc, index)}: expected an AffinePiece, got {type(pieces[index]).__name__}"
            )
        shard = declared
        shard_numel = volume(shard)
        if shard_numel > 0 and not any(p.numel > 0 for p in pieces):  # R4
            raise InvalidMapError(
                f"{_where(parameter, side, loc)}: a nonempty shard {shard} must hold at least one "
                "non-empty piece"
            )
        if shard_numel == 0:  # R6: an empty shard holds nothing to copy, so the location is skipped
            for index, piece in enumerate(pieces):  # ... but a piece of another rank is a broken map (R7)
                if len(piece.shape) != ndim:
                    raise InvalidMapError(
                        f"{_where(parameter, side, loc, index)}: piece shape {piece.shape} has a different "
                        f"number of axes than {logical}"
                    )
                # ... and so is a negative extent (R8), which must never pass as empty: a (0, -1) or
                # (-1, 4) piece has no positive volume, so R6 alone let it through here while the
                # oracle refused it (fuzz finding F10); an extent above 2**62 likewise, as elsewhere.
                _check_shape(piece.shape, "piece shape", partial(_where, parameter, side, loc, index))
            if any(p.numel > 0 for p in pieces):
                index = next(i for i, p in enumerate(pieces) if p.numel > 0)
                raise InvalidMapError(
                    f"{_where(parameter, side, loc, index)}: the empty shard {shard} cannot hold a non-empty "
                    f"piece of shape {pieces[index].shape}"
                )
            continue
        shard_strides = row_major_strides(shard)
        fast = logical_small and max(shard_strides, default=0) <= MAX_COORDINATE
        indices = _nonempty_indices(pieces, ndim)
        real = pieces if indices is None else [pieces[i] for i in indices]
        common = _common_frames(
            real, loc, shard, shard_strides, shard_numel, logical, logical_strides, logical_numel, indices
        ) if fast and len(real) >= limits.ARRAY_MIN_PIECES else None
        if common is not None:
            frames.extend(common)
            continue
        for index in range(len(pieces)) if indices is None else indices:
            piece = pieces[index]
            frame = _common_frame(
                piece, index, loc, shard, shard_strides, shard_numel, logical, logical_strides, logical_numel
            ) if fast else None
            if frame is None:  # anything unusual, including every error, takes the full rule path
                frame = _piece_frame(
                    piece, index, loc, shard, shard_strides, logical, logical_strides, parameter, side,
                )
            if frame is not None:
                frames.append(frame)
    frames.sort(key=_FRAME_ORDER)
    result = NormalizedMap(parameter, side, logical, dict(param_map.shard_shapes), tuple(frames), total)
    if work is None:
        work = pair_budget(parameter, side, budget)
    check_shards_tile(result, work)
    check_holders(result, work)
    return result



def _check_location_ids(locations: Iterable[int], where: Callable[[int], str]) -> None:
    """R3a: every location id is at most 2**62 in magnitude; the first one that is not, in
    ascending order, is refused. Location ids travel through the same int64 arrays as
    coordinates (the regions' and the oracle's location columns), where a larger one overflowed
    with a bare ``OverflowError`` from inside; one pass over the ids, never over holder sets."""
    bad = [loc for loc in locations if not -MAX_COORDINATE <= loc <= MAX_COORDINATE]
    if bad:
        loc = min(bad)
        raise InvalidMapError(f"{where(loc)}: location id {show_int(loc)} is above 2**62 in magnitude")


def plain_logical(
    content: MapContent, budget: PlanBudget, most_pieces: int
) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """(F's shape, its row-major strides, its volume) when a map's content is within the bounds
    every small path needs before it looks at a piece: at most ``most_pieces`` (and the budget's
    ``max_pieces_per_map``) pieces, ``1..max_ndim`` positive axes of at most 2**62, a volume of
    at most 2**62, location ids of at most 2**62 in magnitude (R3a); ``None`` otherwise (the
    general path then decides, refusals included).

    One check for ``_small_normalize`` and ``planner._slab_side``, so the two small paths cannot
    drift apart on what they take.
    """
    if content.pieces > most_pieces or content.pieces > budget.max_pieces_per_map:
        return None
    logical = content.logical_shape
    if not 0 < len(logical) <= budget.max_ndim or min(logical) <= 0 or max(logical) > MAX_COORDINATE:
        return None
    strides = row_major_strides(logical)
    numel = strides[0] * logical[0]  # the volume: row-major strides[0] is the product of the rest
    if numel > MAX_COORDINATE:
        return None
    if max(map(abs, content.shard_shapes), default=0) > MAX_COORDINATE:  # R3a: refused by the general path
        return None
    return logical, strides, numel

def _small_normalize(
    param_map: ParamAffineMap, side: str, parameter: str, budget: PlanBudget
) -> tuple[NormalizedMap, int] | None:
    """``normalize`` of a small, plainly valid map in one pure-Python pass, with the box
    comparisons the general path would charge; ``None`` for anything else (then the general path
    decides, and explains every refusal).

    Why: a distinct layout (every parameter's shape its own, so the batch memo never hits) is a
    few dozen pieces, and the general path's set-up (per-location loops, numpy arrays for the
    tiling check, a k-d query for holders) cost several times the work itself. Taken only for a
    map of exact types with a shared content (every piece exactly an ``AffinePiece``) of at most
    ``limits.SMALL_MAP_PIECES`` pieces where: every extent is positive (no empty F, shard or
    piece), every location with a shard shape has pieces and the other way round, every piece
    passes ``_common_frame``'s conditions, each location's local boxes and logical boxes are
    separated along some axis (``box.separated``: the usual slabs), the local volumes sum to the
    shard, the distinct logical boxes are separated along some axis, and each box's frames name
    exactly their own locations as holders. Under those conditions every rule of
    ``normalize``, ``check_shards_tile`` and ``check_holders`` passes and takes its shortcut,
    so the frames are the same (same values, same order) and so is the work: one look per box
    of every separation test the general path runs, plus one per frame in ``check_holders``.
    Identical holders of a replicated piece (the same piece in the same shard shape) are decoded
    once. tests/test_small_fast_path.py holds both paths equal, errors included.
    """
    if type(param_map) is not ParamAffineMap:
        return None
    content = param_map._content
    if type(content) is not MapContent:
        return None
    bounds = plain_logical(content, budget, limits.SMALL_MAP_PIECES)
    if bounds is None:
        return None
    logical, logical_strides, _numel = bounds
    shards = content.shard_shapes
    held = content.pieces_by_rank
    if len(shards) != len(held):
        return None
    frames: list[Frame] = []
    append = frames.append
    charged = 0
    # Worked out once per distinct shard shape, and once per (piece, shard shape): replicas
    # repeat one piece in one shard shape (``_Geometry``).
    sized: dict[tuple[int, ...], tuple[tuple[int, ...], int] | None] = {}
    decoded: dict[tuple[AffinePiece, tuple[int, ...]], _Geometry | None] = {}
    for loc, shard in sorted(shards.items()):
        pieces = held.get(loc)
        if not pieces:
            return None
        if len(pieces) == 1:
            piece = pieces[0]
            geometry = decoded.get((piece, shard), _UNSEEN)
            if geometry is _UNSEEN:
                geometry = decoded[(piece, shard)] = _small_geometry(piece, shard, sized, logical, logical_strides)
            # One box inside the shard tiles it only if it is all of it.
            if geometry is None or not geometry[1]:
                return None
            append(_new_frame((loc, 0, piece[5]) + geometry[0]))
            continue
        here: list[Frame] = []
        for index, piece in enumerate(pieces):
            geometry = decoded.get((piece, shard), _UNSEEN)
            if geometry is _UNSEEN:
                geometry = decoded[(piece, shard)] = _small_geometry(piece, shard, sized, logical, logical_strides)
            if geometry is None:
                return None
            here.append(_new_frame((loc, index, piece[5]) + geometry[0]))
        # Premise A as ``check_shards_tile`` decides it when both separations hold: local boxes
        # disjoint and summing to the shard, logical boxes disjoint (one look per box each).
        locals_ = [f.local for f in here]
        if not _apart(locals_) or sum([volume(extent) for _, extent in locals_]) != volume(shard):
            return None
        if not _apart([f.box for f in here]):
            return None
        charged += 2 * len(here)
        here.sort(key=_FRAME_ORDER)  # one location: (box, piece index), as ``normalize`` orders them
        frames.extend(here)
    groups: dict[Box, list[Frame]] = {}
    for f in frames:
        group = groups.get(f.box)
        if group is None:
            groups[f.box] = [f]
        else:
            group.append(f)
    if len(groups) > 1:
        if not _apart(list(groups)):
            return None
        charged += len(groups)
    charged += len(frames)
    for same in groups.values():
        if len(same) == 1:
            only = same[0]
            if len(only.locations) != 1 or only.location not in only.locations:
                return None
        else:
            actual = frozenset([f.location for f in same])
            if len(actual) != len(same) or any(f.locations != actual for f in same):
                return None
    result = _new_object(NormalizedMap)
    _set_attribute(result, "__dict__", {
        "parameter": parameter, "side": side, "logical_shape": logical, "shard_shapes": dict(shards),
        "frames": tuple(frames), "piece_count": content.pieces,
    })
    return result, charged


_new_object = object.__new__
_set_attribute = object.__setattr__
_UNSEEN: Any = object()
_new_frame = partial(tuple.__new__, Frame)
"""``Frame`` from an 8-tuple without the named tuple's Python ``__new__`` (once per piece)."""
_new_box = partial(tuple.__new__, Box)
"""``Box`` from an (origin, extent) pair without the named tuple's Python ``__new__``."""

_Geometry = tuple[tuple[Box, Box, tuple[int, ...], tuple[int, ...], int], bool]
"""(the last five fields of the piece's ``Frame``: box, local box, shard shape, shard strides and
shift; whether the local box is the whole shard)."""


def _small_shard(shard: tuple[int, ...], ndim: int) -> tuple[tuple[int, ...], int] | None:
    """(row-major strides, volume) of a shard shape with ``ndim`` positive extents whose volume
    is at most 2**62 (so ``normalize``'s size rules pass), else ``None``."""
    if len(shard) != ndim or min(shard) <= 0 or max(shard) > MAX_COORDINATE:
        return None
    numel = volume(shard)
    if numel > MAX_COORDINATE:
        return None
    return row_major_strides(shard), numel


def _small_geometry(
    piece: AffinePiece,
    shard: tuple[int, ...],
    sized: dict[tuple[int, ...], tuple[tuple[int, ...], int] | None],
    logical: tuple[int, ...],
    logical_strides: tuple[int, ...],
) -> _Geometry | None:
    """((box in F, box in the shard, shard shape, shard strides, shift), whether the box is the
    whole shard) of a piece that passes ``_common_frame``'s conditions with a positive extent on
    every axis, in a shard shape that passes ``_small_shard`` (worked out once per shape in
    ``sized``), else ``None``; the box, local box and shift are the values ``_frame`` computes.
    ``logical`` has a positive extent on every axis and a volume of at most 2**62."""
    size = sized.get(shard, _UNSEEN)
    if size is _UNSEEN:
        size = sized[shard] = _small_shard(shard, len(logical))
    if size is None:
        return None
    shard_strides, shard_numel = size
    shape, source_offset, source_strides, dest_offset, dest_strides, locations, scale = piece
    if (
        len(shape) != len(logical)
        or source_strides != logical_strides
        or dest_strides != shard_strides
        or scale != 1.0
        or not locations
        or min(shape) <= 0
        or not 0 <= source_offset < logical_strides[0] * logical[0]
        or not 0 <= dest_offset < shard_numel
    ):
        return None
    # Two axes (the usual case): the row-major decode is one divmod, as the last stride is 1.
    origin = divmod(source_offset, logical_strides[0]) if len(shape) == 2 else _decode(source_offset, logical_strides)
    if any(map(gt, map(add, origin, shape), logical)):
        return None
    whole = dest_offset == 0 and shape == shard
    if whole:
        local_origin: tuple[int, ...] = (0,) * len(shape)
    else:
        local_origin = divmod(dest_offset, shard_strides[0]) if len(shape) == 2 else _decode(dest_offset, shard_strides)
        if any(map(gt, map(add, local_origin, shape), shard)):
            return None
    # As ``_frame``: the shard address of logical coordinate 0; the local origin's dot product
    # with the shard strides is ``dest_offset`` itself (a decoded row-major offset).
    shift = dest_offset - sum(map(mul, origin, shard_strides))
    return (_new_box((origin, shape)), _new_box((local_origin, shape)), shard, shard_strides, shift), whole


def _apart(boxes: list[Box]) -> bool:
    """``box.separated`` of these non-empty boxes, without numpy: some axis on which their
    intervals, sorted by start, each end at or before the next one starts."""
    for axis in range(len(boxes[0].origin)):
        starts, ends = zip(*sorted([(origin[axis], origin[axis] + extent[axis]) for origin, extent in boxes]))
        if not any(map(gt, ends, starts[1:])):  # each interval ends at or before the next starts
            return True
    return False


_FRAME_ORDER = attrgetter("location", "box", "piece_index")
"""(location, origin, extent, piece index): a box is the tuple (origin, extent)."""


def _by_location(frames: Sequence[Frame]) -> dict[int, list[Frame]]:
    out: dict[int, list[Frame]] = {}
    for f in frames:
        out.setdefault(f.location, []).append(f)
    return out


def _first_overlap(
    frames: Sequence[Frame], side: str, lo: np.ndarray[Any, Any], ext: np.ndarray[Any, Any], work: WorkCounter
) -> tuple[Frame, Frame] | None:
    """The first two of one location's ``frames`` whose ``side`` boxes ("local" or "box")
    overlap, or ``None``. ``lo``/``ext`` are those boxes as arrays: one sort on them settles the
    usual slab case, and only otherwise does the k-d query run. One frame cannot overlap itself."""
    if len(frames) < 2 or separated(lo, lo + ext, work):
        return None
    pairs = overlapping_pairs([getattr(f, side) for f in frames], work)
    if not pairs:
        return None
    i, j = min(pairs)
    return frames[i], frames[j]


_NO_BOXES: np.ndarray[Any, Any] = np.empty((0, 0), dtype=np.int64)
"""Stands for a location's box arrays where ``_first_overlap`` never reads them (< 2 frames)."""


def check_shards_tile(nmap: NormalizedMap, work: WorkCounter) -> None:
    """Premise A (R16–R18): each shard's addresses are tiled by its frames' local boxes.

    Local boxes inside the shard, pairwise disjoint, volumes summing to the shard size: by the
    tiling lemma they cover it, so each shard address belongs to exactly one frame.
    Also R20: one location's frames do not overlap in F either (else one element would have two
    shard addresses on the same location, and "holds the whole box" would double count).
    """
    frames_at = _by_location(nmap.frames)
    # Usually every location's boxes are slabs along some axis, on both sides: one sort per
    # location proves them disjoint (box.separated), on arrays built once for the whole map.
    # Only a location where that fails asks the k-d query, which also explains the failure.
    grouped = [f for here in frames_at.values() for f in here]  # each location one run
    if len(grouped) == len(frames_at):  # one frame per location: nothing can overlap, no arrays
        local_lo = local_ext = box_lo = box_ext = _NO_BOXES
    else:
        local_lo, local_ext = box_arrays([f.local for f in grouped])
        box_lo, box_ext = box_arrays([f.box for f in grouped])
    first = 0
    spans: dict[int, slice] = {}
    for loc, here in frames_at.items():
        spans[loc] = slice(first, first + len(here))
        first += len(here)
    for loc, shard in sorted(nmap.shard_shapes.items()):
        frames = frames_at.get(loc, [])
        span = spans.get(loc, slice(0, 0))
        clash = _first_overlap(frames, "local", local_lo[span], local_ext[span], work)
        if clash is not None:
            a, b = clash
            shared = a.local.intersect(b.local)
            raise InvalidMapError(
                f"{_where(nmap.parameter, nmap.side, loc)}: pieces {a.piece_index} and {b.piece_index} write "
                f"the same shard addresses (shard box {shared}); one would silently overwrite the other"
            )
        # The local boxes are disjoint (just checked) and inside the shard, so their volumes sum
        # to at most the shard's 2**62 elements: exact in int64.
        if len(frames) >= limits.ARRAY_MIN_PIECES and local_ext is not _NO_BOXES:
            held = int(np.prod(local_ext[span], axis=1).sum())
        else:
            held = sum(f.local.volume for f in frames)
        if held != volume(shard):
            raise InvalidMapError(
                f"{_where(nmap.parameter, nmap.side, loc)}: the pieces account for {held} elements but the "
                f"shard {shard} has {volume(shard)}"
            )
        clash = _first_overlap(frames, "box", box_lo[span], box_ext[span], work)
        if clash is not None:
            a, b = clash
            raise InvalidMapError(
                f"{_where(nmap.parameter, nmap.side, loc)}: overlapping logical pieces {a.piece_index} "
                f"{a.box} and {b.piece_index} {b.box}"
            )


def check_holders(nmap: NormalizedMap, work: WorkCounter) -> None:
    """R19–R21: every piece's ``locations`` is exactly who holds its box, and each holds all of it.

    Frames are grouped by identical box first (replicas are usually cut identically), then only
    distinct boxes are compared, so a box held by k replicas costs k, not k² comparisons.
    """
    groups: dict[Box, list[Frame]] = {}
    for f in nmap.frames:
        groups.setdefault(f.box, []).append(f)
    boxes = sorted(groups)
    pairs = overlapping_pair_array(boxes, work)
    # Each frame is looked at once and each overlap twice below: charged before looking.
    work.add(len(nmap.frames) + 2 * int(pairs.shape[0]))
    # the usual map has no overlapping boxes: its frames' locations are listed only when some do
    # (``overlap_volumes`` answers nothing without pairs), as the oracle's holder check does
    nearby = overlap_volumes(boxes, [[f.location for f in groups[b]] for b in boxes] if pairs.size else [], pairs)
    for i, box in enumerate(boxes):
        here = groups[box]
        near = nearby(i)
        if not near:  # the common case: only this box's own frames hold any of it
            if len(here) == 1:
                only = here[0]
                if len(only.locations) == 1 and only.location in only.locations:
                    continue  # its one holder holds it, and says so
            actual = frozenset([f.location for f in here])
            if len(actual) == len(here) and all(s == actual for s in _distinct_sets(here)):
                continue  # each holder holds the whole box once: the checks below would all pass
        size = box.volume
        covered: dict[int, int] = {}
        for f in here:
            covered[f.location] = covered.get(f.location, 0) + size
        for location, part in near.items():
            covered[location] = covered.get(location, 0) + part
        actual = frozenset(covered)
        wrong = {id(s) for s in _distinct_sets(here) if s != actual}
        held = False  # whether the declared holders (``actual``, for every frame past the test) were checked
        for f in here:
            if id(f.locations) in wrong:
                where = _where(nmap.parameter, nmap.side, f.location, f.piece_index)
                raise InvalidMapError(
                    f"{where}: box {box} declares locations {show_list(sorted(f.locations))} but is held by "
                    f"different locations {show_list(sorted(actual))}"
                )
            if held:
                continue  # its holders are ``actual``, checked at an earlier frame: the same answer
            held = True
            for holder in sorted(actual):
                if covered[holder] != size:
                    where = _where(nmap.parameter, nmap.side, f.location, f.piece_index)
                    raise InvalidMapError(
                        f"{where}: location {holder} is declared a holder but does not hold all of box {box} "
                        f"({covered[holder]} of {size} elements)"
                    )


def _distinct_sets(frames: list[Frame]) -> list[frozenset[int]]:
    """The distinct holder-set objects of ``frames``, each once.

    Why by object: the k replicas of a box share one holder set (the builders hash-cons them), and
    comparing each frame's set of k holders with the box's actual holders cost k² — 29 s for a
    tensor replicated over a mesh of 65 536 ranks (``interop.from_dtensor``), 506 s over 262 144.
    Frames with sets of their own still compare each once, as before."""
    seen: dict[int, frozenset[int]] = {}
    for f in frames:
        seen.setdefault(id(f.locations), f.locations)
    return list(seen.values())
