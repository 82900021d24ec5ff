"""Small layouts and plans judged in plain Python: a second, cheaper reading that only confirms.

Why it exists: a model whose every parameter has a shape of its own (per-layer widths, pruned
models, adapters) gets no help from the batch memo of validated layouts and judged plans, and on
a layout of tens of pieces the general path's fixed costs (a numpy array per fact, the k-d set-up,
a tiling re-check per location) are most of the time: about 15 µs per piece to validate a map and
20 µs per segment to judge a plan, where the arithmetic itself is a few integer operations each
(issue 27).

Where it is used: ``layout.validate_map`` first asks ``read_map`` (and makes its ``Layout`` of
the answer), ``judge.check_plan`` first asks ``judge``; ``_general_only`` (tests) turns both off.

Why it cannot change an answer: ``read_map`` returns either what the general path builds its
``Layout`` of (the same locations, shards and pieces) or ``None``, and ``judge`` either the
general path's ``ok`` verdict (``verdict.ok_verdict``: the same text and counts) or ``None``;
on ``None`` the general path decides and explains. Nothing here raises a map error, writes a
counterexample or says ``unverifiable``: at the first thing it does not recognise as the plain
case (strides that differ on a size-1 axis, an empty piece or shard, pieces that are not slabs
along one axis, a plan that leaves a gap, a wrong element) it hands over. So every message comes
from one place, and the only way this module can be wrong is by saying ``ok`` (or handing out a
layout) where the general path would not; ``tests/test_oracle_small_fast.py`` compares the two on
drawn correct and corrupted plans.

The argument it makes is the general path's, in the shape that fits a few pieces:

- A map: every piece's strides *are* the row-major strides of F and of its shard; its offsets
  decode to origins whose boxes lie inside; within a location the local boxes and the logical
  boxes are each disjoint slabs along some axis and the local volumes sum to the shard's numel
  (Premise A); the distinct logical boxes are disjoint slabs along some axis, their volumes sum
  to F's (so they tile F: disjoint, inside, full volume), and every piece declares exactly the
  locations that hold its box.
- A plan: every segment is a box on both sides (row-major strides, origins that decode, boxes
  inside), per target location the write boxes are disjoint slabs, their volumes sum to each
  shard's numel, and for every target piece and source piece a segment's write box and its read
  image meet, the three translations agree: ``logical - local`` of the target piece plus
  ``write - read`` of the segment equals ``logical - local`` of the source piece. Every map and
  segment here is a translation, so that equality on a sub-box means every element of it is
  right; the cuts of each box are re-counted to add up to the box.

Cost: pieces and segments are bounded (``SMALL_PIECES``, ``SMALL_SEGMENTS``,
``SMALL_LOCATION_PIECES``), so the pairing of a segment with its location's pieces is a bounded
loop, never an all-pairs loop over a large layout; larger inputs take the general path. It shares
nothing with the planner: it reads the maps' converted fields (a shared ``MapContent`` holds only
exact ``AffinePiece`` pieces of ints and tuples of ints) and uses ``box.row_major_strides``
(a matrix's row-major strides, ``(columns, 1)``, are written out: a batch of distinct shapes
would miss any cache of them). On 200 distinct Llama-like layouts (8 target pieces, 4 × 4
replicated source pieces, 8 segments each) ``verify_plans`` ran about 8× faster with this path
than with the general one; the one-piece location read inline and the matrix case unrolled (the
decode, the translation check, the strides) then took it from about 80 to about 55 µs per
parameter (issue 27).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from math import prod
from operator import add
from typing import TYPE_CHECKING, Any

from ..box import row_major_strides
from ..limits import MAX_COORDINATE
from ..maps import AffinePiece, MapContent, ParamAffineMap
from ..plan import TransferSegment
from .segments import FIELDS, Row
from .verdict import Verdict, ok_verdict

if TYPE_CHECKING:
    from .layout import Layout

__all__ = [
    "SMALL_LOCATION_PIECES", "SMALL_PIECES", "SMALL_SEGMENTS", "Part", "Place", "judge", "judge_places", "judge_rows",
    "read_map",
]

SMALL_PIECES = 64
"""Maps with at most this many pieces (empty ones included) are read here first."""

SMALL_SEGMENTS = 64
"""Plans with at most this many segments are judged here first."""

SMALL_LOCATION_PIECES = 8
"""A plan is judged here only while each location it touches holds at most this many pieces:
each segment is paired with its locations' pieces one by one."""

_rm = lru_cache(maxsize=4096)(row_major_strides)
"""Row-major strides, remembered: a batch names the same few shapes again and again."""

_enabled = True
"""The private switch: ``False`` sends everything to the general path (``_general_only``)."""


@contextmanager
def _general_only() -> Iterator[None]:
    """For tests: take the general path for everything, so that the two can be compared."""
    global _enabled
    saved = _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = saved


def _origin(offset: int, strides: tuple[int, ...], sizes: tuple[int, ...], extent: tuple[int, ...]) -> (
    tuple[int, ...] | None
):
    """The origin ``offset`` decodes to in a row-major tensor of ``sizes`` (``strides`` its row-major
    strides), when the box of ``extent`` there is non-empty and inside; ``None`` otherwise.

    ``q + e <= size`` with ``e >= 1`` on the first axis bounds the offset below the volume, and
    each remainder is then below the next axis' stride, so no separate range check is needed."""
    if offset < 0:
        return None
    coord = []
    for stride, size, e in zip(strides, sizes, extent):
        q, offset = divmod(offset, stride)
        if e < 1 or q + e > size:
            return None
        coord.append(q)
    return tuple(coord)


def _slabs(boxes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], within: tuple[int, ...] | None = None) -> bool:
    """Whether the (non-empty) boxes, as (origin, extent), are pairwise disjoint because on some axis their spans are:
    sorted by start, each ends where or before the next begins. Sufficient, exact when true.

    ``within``: a shape holding every box. An axis on which the first box spans all of it cannot
    separate that box from any other (every box has a non-empty span there), so it is skipped
    without sorting (the axes before a TP split's, for instance)."""
    if len(boxes) < 2:
        return True
    first_origin, first_extent = boxes[0]
    for axis in range(len(first_origin)):
        if within is not None and first_origin[axis] == 0 and first_extent[axis] == within[axis]:
            continue
        spans = sorted([(o[axis], o[axis] + e[axis]) for o, e in boxes])
        end = spans[0][1]
        for start, stop in spans[1:]:
            if start < end:
                break
            end = stop
        else:
            return True
    return False


Part = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], frozenset[int]]
"""One non-empty piece: its logical origin, its local origin, its shape and the locations it
declares (boxes as plain tuples: a ``Box`` per piece is made only if ``Layout.held`` is read)."""

Place = tuple[tuple[int, ...], tuple[int, ...], tuple[Part, ...], "tuple[int, ...] | None", int]
"""One location: its shard, the shard's row-major strides, its pieces, when it has exactly one
that piece's ``logical - local`` (by Premise A the piece is then the whole shard), and the
shard's numel."""


def _part(
    p: AffinePiece, f_strides: tuple[int, ...], logical: tuple[int, ...], s_strides: tuple[int, ...],
    shard: tuple[int, ...],
) -> Part | None:
    """A piece in ``shard`` when its fields are the plain case, else ``None``."""
    shape, f_off, f_str, s_off, s_str, locations, scale = p
    if f_str != f_strides or s_str != s_strides or scale != 1.0 or len(shape) != len(logical):
        return None
    origin = _origin(f_off, f_strides, logical, shape)
    local = _origin(s_off, s_strides, shard, shape)
    if origin is None or local is None:
        return None
    return origin, local, shape, locations


def _place(
    pieces: tuple[AffinePiece, ...], shard: tuple[int, ...], f_strides: tuple[int, ...],
    logical: tuple[int, ...],
) -> Place | None:
    """A location of several pieces (``read_map`` reads a one-piece location itself) when its
    shard is non-empty, every piece is the plain case, the local boxes tile the shard (disjoint
    slabs whose volumes sum to its numel: Premise A) and the logical boxes are disjoint slabs;
    else ``None``.

    No piece's ``locations`` is looked at here: ``read_map``'s holder check refuses an empty one
    (it does not contain the location holding the piece). Nor the shard's numel against
    ``MAX_COORDINATE``: it is the volume of disjoint boxes inside F, whose volume ``read_map``
    bounded."""
    if len(shard) != len(logical) or min(shard) < 1:
        return None
    numel = prod(shard)
    s_strides = _rm(shard)
    parts: list[Part] = []
    total = 0
    for p in pieces:
        part = _part(p, f_strides, logical, s_strides, shard)
        if part is None:
            return None
        parts.append(part)
        total += prod(part[2])
    if total != numel or not (_slabs([(q[1], q[2]) for q in parts]) and _slabs([(q[0], q[2]) for q in parts])):
        return None
    return shard, s_strides, tuple(parts), None, numel


def read_map(m: ParamAffineMap) -> dict[int, Place] | None:
    """A small plain map whose checks all pass as its places (location -> ``Place``, in location
    order; a place's first field is the location's shard), else ``None``.

    ``validate_map`` makes its ``Layout`` of them: the general path's value for value, the same
    locations in the same order (every location here has a shard and non-empty pieces only, so
    a piece's index is its place in its location's list).

    Holders: every piece with a given logical box declares the same locations, each location
    holding the box is among them, and as many pieces hold it as they declare. A location holds
    a box at most once (its logical boxes are disjoint), so the holders are exactly the declared
    locations; the distinct boxes being disjoint, no other box touches them. Pieces are grouped
    by logical origin: two with one origin and different shapes overlap, which is not the plain
    case.

    A location holding one piece is read inline (``_place``'s one-piece case, without the call):
    it is every location of a TP×DP layout, and this loop is most of a distinct layout's cost."""
    if not _enabled or type(m) is not ParamAffineMap:
        return None
    content = m.content
    if type(content) is not MapContent or content.pieces > SMALL_PIECES:
        return None
    logical = content.logical_shape
    if not logical or min(logical) < 1 or prod(logical) >= MAX_COORDINATE:
        return None
    ndim = len(logical)
    # Row-major strides: a matrix's are (columns, 1), written out (a batch of distinct shapes
    # would miss any cache of them); other ranks ask ``box.row_major_strides``, remembered.
    f_strides = (logical[1], 1) if ndim == 2 else _rm(logical)
    shard_shapes = content.shard_shapes
    pieces_by_rank = content.pieces_by_rank
    if shard_shapes.keys() != pieces_by_rank.keys():
        return None  # a location with pieces and no shard, or with a shard and no pieces
    if max(map(abs, shard_shapes), default=0) > MAX_COORDINATE:
        return None  # a location id the general path refuses (it would not fit its int64 columns)
    zeros = (0,) * ndim
    plain: dict[int, Place] = {}
    # Replicas share one tuple of pieces (``replicate``) in equal shards: each such location is
    # read once, keyed by the tuple's identity (the content holds it for the whole call) and the
    # shard; an equal tuple that is another object is read again. Each entry lists its locations.
    # The key is the tuple's identity alone while its locations have one shard (the common case:
    # an int hashes and compares at once), and (identity, shard) for a shard that differs.
    seen: dict[Any, tuple[Place, list[int]]] = {}
    for loc, pieces in sorted(pieces_by_rank.items()):  # ``m.ranks``' order: locations are distinct
        shard = shard_shapes[loc]
        key: Any = id(pieces)
        entry = seen.get(key)
        if entry is not None and entry[0][0] != shard:  # a place's first field is its shard
            key = (key, shard)
            entry = seen.get(key)
        if entry is not None:
            entry[1].append(loc)
            plain[loc] = entry[0]
            continue
        if len(pieces) != 1:
            place = _place(pieces, shard, f_strides, logical)
            if place is None:
                return None
        else:
            # ``_place``'s one-piece case: the piece is the whole shard (shape = shard, local
            # origin 0), so only its logical origin is decoded (``_origin``, inline: the shard
            # has no empty axis, so every extent is at least 1).
            shape, f_off, f_str, s_off, s_str, locations, scale = pieces[0]
            if shape != shard or s_off != 0 or f_str != f_strides or scale != 1.0 or f_off < 0:
                return None
            if ndim == 2:  # the common case, unrolled (a row-major last stride is 1)
                if len(shard) != 2:
                    return None
                e0, e1 = shard
                q0, q1 = divmod(f_off, f_strides[0])
                if e0 < 1 or e1 < 1 or q0 + e0 > logical[0] or q1 + e1 > logical[1]:
                    return None
                origin: tuple[int, ...] = (q0, q1)
                s_strides: tuple[int, ...] = (e1, 1)
                numel = e0 * e1
            else:
                if len(shard) != ndim or min(shard) < 1:
                    return None
                coord = []
                for stride, size, e in zip(f_strides, logical, shape):
                    q, f_off = divmod(f_off, stride)
                    if q + e > size:
                        return None
                    coord.append(q)
                origin = tuple(coord)
                s_strides = _rm(shard)
                numel = prod(shard)
            if s_str != s_strides:
                return None
            place = (shard, s_strides, ((origin, zeros, shape, locations),), origin, numel)
        seen[key] = (place, [loc])
        plain[loc] = place
    # First, as if no two places held one logical box (every layout a builder makes this way):
    # each piece's holders are then its place's locations. If the boxes so listed are disjoint
    # slabs whose volumes sum to F's, no two of them share an origin, so grouping by origin
    # (below) would make exactly these groups and accept. Else the grouping decides.
    distinct: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    covered = 0
    for place, locs in seen.values():
        for origin, _, shape, declared in place[2]:
            if len(declared) != len(locs) or not declared.issuperset(locs):
                break
            distinct.append((origin, shape))
            covered += prod(shape)
        else:
            continue
        break
    else:
        if covered == prod(logical) and _slabs(distinct, logical):
            return plain
    return _grouped(seen, logical, plain)


def _grouped(
    seen: dict[Any, tuple[Place, list[int]]], logical: tuple[int, ...], plain: dict[int, Place],
) -> dict[int, Place] | None:
    """``read_map``'s holder and tiling check with pieces grouped by logical origin: places that
    are not one object (replicas built one by one) may hold the same box."""
    groups: dict[tuple[int, ...], list[Any]] = {}  # logical origin -> [shape, declared, pieces holding it]
    distinct: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # the distinct logical boxes
    covered = 0  # and their volume
    for place, locs in seen.values():
        for origin, _, shape, declared in place[2]:
            if not declared.issuperset(locs):
                return None
            group = groups.get(origin)
            if group is None:
                groups[origin] = [shape, declared, len(locs)]
                distinct.append((origin, shape))
                covered += prod(shape)
            elif group[0] != shape or group[1] != declared:
                return None
            else:
                group[2] += len(locs)
    for _, declared, count in groups.values():
        if len(declared) != count:
            return None
    if covered != prod(logical) or not _slabs(distinct, logical):
        return None
    return plain


def _meet(
    lo: tuple[int, ...], ext: tuple[int, ...], other: tuple[int, ...], other_ext: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The common box of ``[lo, lo + ext)`` and ``[other, other + other_ext)`` as (origin,
    extent), or ``None`` when they share no element."""
    origin = []
    extent = []
    for a, e, b, f in zip(lo, ext, other, other_ext):
        start = max(a, b)
        size = min(a + e, b + f) - start
        if size < 1:
            return None
        origin.append(start)
        extent.append(size)
    return tuple(origin), tuple(extent)


def _right(
    w: tuple[int, ...], r: tuple[int, ...], ext: tuple[int, ...], t_parts: tuple[Part, ...],
    s_parts: tuple[Part, ...],
) -> bool:
    """Whether the write box ``[w, w + ext)`` receives, everywhere, the element its target pieces
    put there, read at ``r`` from the source pieces (whose location then holds it), and the cuts
    of the box by those pieces add up to the box on both sides."""
    move = [a - b for a, b in zip(w, r)]
    covered = 0
    for origin, local, shape, _ in t_parts:
        x = _meet(w, ext, local, shape)
        if x is None:
            continue
        x_lo, x_ext = x
        covered += prod(x_ext)
        want = [a - b + c for a, b, c in zip(origin, local, move)]
        y_lo = tuple([a - b for a, b in zip(x_lo, move)])
        inner = 0
        for s_origin, s_local, s_shape, _ in s_parts:
            z = _meet(y_lo, x_ext, s_local, s_shape)
            if z is None:
                continue
            inner += prod(z[1])
            if want != [a - b for a, b in zip(s_origin, s_local)]:
                return False
        if inner != prod(x_ext):
            return False
    return covered == prod(ext)


def judge(segments: Sequence[TransferSegment], src: Layout, tgt: Layout, *, gaps: bool = True) -> Verdict | None:
    """``check_plan(segments, src, tgt, ...)`` when it is ``ok`` and the plan is small and plain,
    else ``None`` (then the general path judges). ``gaps=False`` leaves the gap check out, as
    ``check_plan``'s does. The segments are ``parse_plan``'s: ints and tuples of ints."""
    s_plain = src.plain
    t_plain = tgt.plain
    if not _enabled or len(segments) > SMALL_SEGMENTS or s_plain is None or t_plain is None:
        return None  # a big plan, or a layout the general path validated: judged there too
    return judge_places(segments, s_plain, t_plain, len(src.logical_shape), len(tgt.logical_shape), gaps=gaps)


def judge_places(
    segments: Sequence[TransferSegment], s_plain: dict[int, Place], t_plain: dict[int, Place], s_ndim: int,
    ndim: int, *, gaps: bool = True,
) -> Verdict | None:
    """``judge`` on the places ``read_map`` read of the source and target maps (with ``s_ndim``
    and ``ndim`` axes), for a plan of at most ``SMALL_SEGMENTS`` segments: ``ok`` or ``None``."""
    return judge_rows(list(map(FIELDS, segments)), s_plain, t_plain, s_ndim, ndim, gaps=gaps)


def judge_rows(
    rows: Sequence[Row], s_plain: dict[int, Place], t_plain: dict[int, Place], s_ndim: int, ndim: int, *,
    gaps: bool = True,
) -> Verdict | None:
    """``judge_places`` on the segments' fields (``segments.FIELDS``, each a plain int or tuple
    of ints: ``parse_plan``'s segments, or ``segments.plain_rows``)."""
    n_seg = len(rows)
    # ``read_map``'s layouts have at least one axis and one location, each with a non-empty shard:
    # an empty plan is refused by the gap check (and, without it, is ``ok`` on both paths).
    if s_ndim != ndim:
        return None  # maps of other ranks (``segment_errors`` does not compare them): the general path's
    zeros = (0,) * ndim  # the origin of a segment that writes its whole shard
    writes: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []  # (location, write origin, extent)
    written: dict[int, int] = {}  # per target location, the volume written
    for s_loc, s_off, s_str, t_loc, t_off, t_str, shape in rows:
        s_place = s_plain.get(s_loc)
        t_place = t_plain.get(t_loc)
        if s_place is None or t_place is None or len(shape) != ndim:
            return None
        s_shard, s_rm, s_parts, s_shift, _ = s_place
        t_shard, t_rm, t_parts, t_shift, _ = t_place
        if s_str != s_rm or t_str != t_rm:
            return None
        if ndim == 1:  # ``_origin`` on both sides, unrolled: a 1-D row-major stride is 1
            (e0,) = shape
            if t_off < 0 or s_off < 0 or e0 < 1 or t_off + e0 > t_shard[0] or s_off + e0 > s_shard[0]:
                return None
            w: tuple[int, ...] = (t_off,)
            q0 = s_off
            r: tuple[int, ...] = (q0,)
            size = e0
        else:
            written_at = zeros if t_off == 0 and shape == t_shard else _origin(t_off, t_rm, t_shard, shape)
            if written_at is None or s_off < 0:
                return None
            w = written_at
            # ``_origin(s_off, s_rm, s_shard, shape)``: the read box's origin, when inside.
            if ndim == 2:  # unrolled inline (a row-major last stride is 1)
                # Every extent is at least 1 here: ``w`` is the zero origin only for a segment of
                # its (non-empty) shard's shape, and ``_origin`` refuses an empty extent.
                e0, e1 = shape
                q0, q1 = divmod(s_off, s_rm[0])
                if q0 + e0 > s_shard[0] or q1 + e1 > s_shard[1]:
                    return None
                r = (q0, q1)
                size = e0 * e1
            else:
                read = _origin(s_off, s_rm, s_shard, shape)
                if read is None:
                    return None
                r = read
                size = prod(shape)
        if t_shift is not None and s_shift is not None:
            # One piece on each side, each the whole shard: the boxes are one cut each, and the
            # translations must agree: target shift + write = source shift + read.
            if ndim == 1:
                if t_shift[0] + t_off != s_shift[0] + q0:
                    return None
            elif ndim == 2:
                if t_shift[0] + w[0] != s_shift[0] + q0 or t_shift[1] + w[1] != s_shift[1] + q1:
                    return None
            elif list(map(add, t_shift, w)) != list(map(add, s_shift, r)):
                return None
        elif (
            len(t_parts) > SMALL_LOCATION_PIECES or len(s_parts) > SMALL_LOCATION_PIECES
            or not _right(w, r, shape, t_parts, s_parts)
        ):
            return None
        writes.append((t_loc, w, shape))
        written[t_loc] = written.get(t_loc, 0) + size
    if len(written) < len(writes):
        # Some location is written more than once: per location, the write boxes must be
        # disjoint slabs (a location written once needs no test).
        by_location: dict[int, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        for t_loc, w, shape in writes:
            by_location.setdefault(t_loc, []).append((w, shape))
        for boxes in by_location.values():
            if len(boxes) > 1 and not _slabs(boxes):
                return None
    if gaps:  # every location of a layout read here has a place, and a shard of numel >= 1
        for loc, place in t_plain.items():
            if written.get(loc) != place[4]:
                return None
    return ok_verdict(n_seg)
