"""The oracle's judgement: exactly once, and the right element from a real holder.

``verify_plan`` validates both maps (``layout``), reads the plan into box rows (``segments``) and
then asks two questions of the rows, in this order: is every target address written exactly
once (``check_exactly_once``), and does every written element receive the logical element the
target map puts there, read from a source location whose pieces hold it (``check_values``).
Both are answered with box algebra from ``box`` (k-d queries, ``covers``) and never per element.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .. import limits
from .._gc import cycle_collection_paused
from ..box import Box, box_in_shard, covers, overlap_witnesses, overlapping_pairs, volume
from ..errors import AffineTransferError, InvalidMapError, describe_exception, show_int, show_ints
from ..maps import MapContent, ParamAffineMap, as_int, describe
from ..plan import TransferPlan, TransferSegment
from . import small
from .layout import (
    Array,
    Layout,
    MapLike,
    as_map,
    holders_of,
    logical_at,
    piece_tables,
    row_major_offset,
    validated,
    validated_parts,
)
from .segments import (
    FIELDS,
    PlanLike,
    Rows,
    boxes_of,
    fast_boxes,
    immutable_plan,
    kind,
    not_a_box,
    parse_plan,
    plain_extent,
    plain_rows,
    runs,
    structural,
    volumes,
)
from .verdict import BatchVerdict, TooLarge, Verdict, ok_verdict, unverifiable_internal, worst

__all__ = ["FALLBACK_MAX_ELEMENTS", "check_plan", "verify_plan", "verify_plans"]

FALLBACK_MAX_ELEMENTS = 1 << 16
"""Elements, over the whole plan, that non-box segments may expand to before the verdict is
``unverifiable``. Expansion is exact but costs memory and time per element (and the resulting
row runs go through the same box checks), so it is kept for small odd segments only."""


def fallback_budget(value: object) -> int:
    """``fallback_elements`` checked where it is passed: a non-negative ``int`` (never a bool).

    Read only once some segment needs the element-level fallback, a ``None`` or a string failed
    there as a bare ``TypeError`` from a comparison, and a float or a bool was compared as a
    number; an argument error is the caller's, like a missing plan, so it raises."""
    count = as_int(value)  # the maps' integer rule: numpy's integers too, never a bool or a float
    if count is None:
        raise TypeError(f"fallback_elements must be a non-negative int, got {type(value).__name__}")
    if count < 0:
        raise ValueError(f"fallback_elements must be a non-negative int, got {show_int(count)}")
    return count


def check_plan(
    segments: Sequence[TransferSegment], src: Layout, tgt: Layout, fallback_elements: int, *, gaps: bool = True
) -> Verdict:
    """Judge segments against validated maps, in the order of the module docstring.

    Each segment becomes one row (a box copy), or, if it is not a box in its shards, row runs from
    the element-level fallback. When the non-box segments exceed ``fallback_elements`` they are left
    out and the verdict can be at best ``unverifiable``, but the rows that were checked can still
    yield a concrete counterexample (a double write or a wrong element is wrong whatever the rest
    of the plan does); a gap cannot, since a left-out segment might fill it.

    A small plain plan on layouts ``oracle.small.read_map`` read is first offered to
    ``oracle.small.judge``, which answers only ``ok`` (this function's ``ok``, the same verdict)
    or hands the plan back to be judged here.
    """
    quick = small.judge(segments, src, tgt, gaps=gaps)
    if quick is not None:
        return quick
    n_seg = len(segments)
    ndim = len(tgt.logical_shape)
    # Classify: a box on both sides, or a candidate for the element-level fallback. What depends
    # only on (locations, shape, strides) is computed once per distinct combination; the offsets
    # are checked per segment. Anything the fast filter does not accept goes to ``structural``
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
            kinds.append(kind(seg, src, tgt))
            kind_segment.append(seg)
        kind_of.append(k)
    boxes = (
        fast_boxes(segments, kind_of, kinds, kind_segment, src, tgt, ndim)
        if n_seg >= limits.ORACLE_ARRAY_SEGMENTS else None
    )
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
        sound, s_reach, t_reach, s_numel, t_numel, _, _ = kinds[kind_of[i]]
        if not (
            sound
            and seg.source_offset >= 0
            and seg.source_offset + s_reach < s_numel
            and seg.target_offset >= 0
            and seg.target_offset + t_reach < t_numel
        ):
            problem = structural(i, seg, src, tgt)
            if problem is not None:
                return problem
        s_shard = src.shards[seg.source_rank]
        t_shard = tgt.shards[seg.target_rank]
        w = box_in_shard(seg.target_offset, seg.shape, seg.target_strides, t_shard)
        r = box_in_shard(seg.source_offset, seg.shape, seg.source_strides, s_shard) if w is not None else None
        if w is None or r is None:
            side = (
                f"target: {not_a_box(seg.target_offset, seg.shape, seg.target_strides, t_shard)}" if w is None
                else f"source: {not_a_box(seg.source_offset, seg.shape, seg.source_strides, s_shard)}"
            )
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
            [seg.shape if plain_extent(seg.shape, ndim) else (0,) * ndim for seg in kind_segment], dtype=np.int64
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
            w_lo, r_lo, ext = runs(seg, src.shards[seg.source_rank], tgt.shards[seg.target_rank])
            parts_seg.append(np.full(w_lo.shape[0], i, dtype=np.int64))
            parts_w.append(w_lo)
            parts_r.append(r_lo)
            parts_e.append(ext)
            expanded += seg.numel
    seg_of = np.concatenate(parts_seg)
    rows = Rows(
        seg_of,
        np.asarray([segments[i].target_rank for i in seg_of.tolist()], dtype=np.int64),
        np.asarray([segments[i].source_rank for i in seg_of.tolist()], dtype=np.int64),
        np.concatenate(parts_w),
        np.concatenate(parts_r),
        np.concatenate(parts_e),
    )
    verdict = _check_exactly_once(rows, segments, tgt, check_gaps=gaps and pending is None)
    if verdict is None:
        verdict = _check_values(rows, segments, src, tgt)
    if verdict is None:
        verdict = pending
    if verdict is None:
        verdict = ok_verdict(n_seg)
    return Verdict(
        verdict.status, None, verdict.reason, verdict.target_location, verdict.target_offset,
        verdict.logical_coordinate, verdict.segments, verdict.map_error, n_seg, expanded,
    )


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


def _origins(rows: Rows) -> Array:
    """Each row's write box origin with its target location first, as ``boxes_of`` builds them."""
    return np.column_stack((rows.t_loc, rows.w_lo))


def _check_exactly_once(
    rows: Rows, segments: Sequence[TransferSegment], tgt: Layout, *, check_gaps: bool
) -> Verdict | None:
    """No target address written twice (disjoint write boxes per location), and, when every
    segment was reduced to boxes, none left unwritten (volumes add up to each shard)."""
    if _write_slabs(rows.t_loc, rows.w_lo, rows.ext):
        boxes: list[Box] = []
        pairs = np.empty((0, 2), dtype=np.int64)  # per location the write boxes are disjoint slabs
    else:
        boxes = boxes_of(rows.t_loc, rows.w_lo, rows.ext)
        pairs = overlap_witnesses(boxes)
    if pairs.size:
        # The address written twice first: least location, then least offset in its shard (row-major
        # order is the lexicographic order of coordinates inside one shard), then least segments.
        # Chosen over the pairs in numpy, from ``overlap_witnesses``, which holds that least pair
        # without the n(n-1)/2 pairs of n copies of one segment (22 s for 2 000 copies before).
        origins = _origins(rows)
        starts = np.maximum(origins[pairs[:, 0]], origins[pairs[:, 1]])
        first = int(np.lexsort((pairs[:, 1], pairs[:, 0], *starts.T[::-1]))[0])
        i, j = int(pairs[first, 0]), int(pairs[first, 1])
        common = boxes[i].intersect(boxes[j])
        assert common is not None
        loc, coord = common.origin[0], common.origin[1:]
        offset = row_major_offset(coord, tgt.shards[loc])
        involved = tuple(sorted({int(rows.seg[i]), int(rows.seg[j])}))
        by = f"segments {involved[0]} and {involved[1]}" if len(involved) == 2 else f"segment {involved[0]} twice"
        return Verdict(
            "invalid",
            reason=f"target location {loc}, offset {offset} is written more than once (by {by})",
            target_location=loc, target_offset=offset, logical_coordinate=logical_at(tgt, loc, coord),
            segments=involved,
        )
    if not check_gaps:
        return None
    vols = volumes(rows.ext)
    for loc in sorted(tgt.shards):
        mask = rows.t_loc == loc
        written = int(vols[mask].sum()) if vols.size else 0
        numel = volume(tgt.shards[loc])
        if written == numel:
            continue
        if written > numel:
            return unverifiable_internal(f"disjoint writes exceed shard {loc}")
        if not boxes:
            boxes = boxes_of(rows.t_loc, rows.w_lo, rows.ext)
        mine = [b for b, m in zip(boxes, mask.tolist()) if m]
        shard = tgt.shards[loc]
        gap = covers(Box((loc, *(0,) * len(shard)), (1, *shard)), mine)
        if gap is None:
            return unverifiable_internal(f"volume says shard {loc} has a gap, covers() finds none")
        coord = gap.origin[1:]
        offset = row_major_offset(coord, shard)
        return Verdict(
            "invalid",
            reason=(
                f"target location {loc}, offset {offset} is never written (the plan writes {written} of "
                f"the {numel} elements of shard {shard}; unwritten box {Box(coord, gap.extent[1:])})"
            ),
            target_location=loc, target_offset=offset, logical_coordinate=logical_at(tgt, loc, coord),
        )
    return None


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
        boxes = boxes_of(tags[rows], lo[rows], ext[rows]) + boxes_of(p_loc[cands], p_lo[cands], p_ext[cands])
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
    np.add.at(got, a, volumes(c_ext))
    if not np.array_equal(got, volumes(ext)):
        raise AssertionError("the cuts of a box do not add up to the box")
    return a, p, c_lo, c_ext


def _check_values(
    rows: Rows, segments: Sequence[TransferSegment], src: Layout, tgt: Layout
) -> Verdict | None:
    """Every written element is the logical element the target expects, from a real holder.

    Cut write boxes by target pieces (logical box via the target piece), carry each cut to the
    read side, cut again by source pieces (logical box via the source piece), and compare the two
    logical origins of each final sub-box. Both are translations of the same sub-box, so equal
    origins mean every element of it is right.
    """
    t_pieces = piece_tables(tgt)
    s_pieces = piece_tables(src)
    try:
        a, p, x_lo, x_ext = _cut(rows.t_loc, rows.w_lo, rows.ext, t_pieces)
        want = x_lo - t_pieces[1][p] + t_pieces[3][p]  # logical origin the target expects
        y_lo = x_lo - rows.w_lo[a] + rows.r_lo[a]  # the same sub-box on the read side
        b, q, z_lo, _ = _cut(rows.s_loc[a], y_lo, x_ext, s_pieces)
    except AssertionError as exc:
        return unverifiable_internal(str(exc))
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
        key = (loc, row_major_offset(t_coord, tgt.shards[loc]), int(rows.seg[row]), k)
        if best is None or key < best:
            best = key
    assert best is not None
    loc, offset, seg_index, k = best
    seg = segments[seg_index]
    needed = tuple(int(v) for v in need[k])
    got = tuple(int(v) for v in have[k])
    read_at = row_major_offset(z_lo[k].tolist(), src.shards[seg.source_rank])
    holders = holders_of(src, needed)
    return Verdict(
        "invalid",
        reason=(
            f"target location {loc}, offset {offset} needs logical {needed}, but segment {seg_index} reads "
            f"source location {seg.source_rank} at offset {read_at}, which holds logical {got} "
            f"(logical {needed} is held by source location(s) {holders})"
        ),
        target_location=loc, target_offset=offset, logical_coordinate=needed, segments=(seg_index,),
    )


Judged = dict[tuple[Any, ...], tuple[Layout, Layout, Verdict, "list[TransferSegment] | tuple[Any, ...]"]]
"""``_judge``'s memo of verdicts within one batch, one entry per distinct plan: keyed by the two
layouts' identities alone (the first plan judged on them: its segments, or once read, their
content) or by the identities and the plan's content (each later plan with other content)."""


_NO_PLAN: Any = object()
"""``verify_plan``'s default for ``plan``: only there to name the two-argument batch call."""


def verify_plan(
    target_map: MapLike,
    source_map: MapLike,
    plan: PlanLike = _NO_PLAN,
    *,
    parameter: str | None = None,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
) -> Verdict:
    """Judge ``plan`` against its maps (target first, like ``plan_transfer``); never raises on input.

    ``plan`` may be a ``TransferPlan``, a plan dict ``{logical_shape, segments}`` (DeepSpeed's
    ``to_dict()``), or a list of segments (``TransferSegment`` or dicts). Maps may be
    ``ParamAffineMap`` or their dict form.

    A plan that fails but would pass with the two maps swapped says so in its reason (the status
    stays). A batch passed here (a ``{name: (target, source)}`` dict as a map, a ``{name: plan}``
    dict as the plan) is an ``invalid_map``/``invalid`` verdict that names ``verify_plans``; the
    call without a plan, ``verify_plan(pairs, plans)``, is a ``TypeError`` saying the same, since
    no verdict can be given for an argument that is missing.
    """
    if plan is _NO_PLAN:
        batch = _batch_map(target_map, {}) is not None or _batch_plan(source_map) is not None
        raise TypeError(
            "verify_plan(target_map, source_map, plan) judges one parameter and got no plan"
            + ("; for a batch {name: (target, source)} and {name: plan} use verify_plans(pairs, plans)" if batch
               else "")
        )
    fallback_elements = fallback_budget(fallback_elements)
    with cycle_collection_paused():
        return _verify_plan(target_map, source_map, plan, parameter=parameter, fallback_elements=fallback_elements)


SWAPPED_NOTE = (
    "this plan is exact for the maps the other way round (target and source swapped): verify_plan takes "
    "(target, source, plan), as plan_transfer does"
)
"""Appended to a failing verdict's reason when the same plan passes with the two maps swapped."""


def _verify_plan(
    target_map: MapLike,
    source_map: MapLike,
    plan: PlanLike,
    *,
    parameter: str | None = None,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
    layouts: dict[Any, Layout] | None = None,
    judged: Judged | None = None,
) -> Verdict:
    """``verify_plan``'s body; within one ``verify_plans``, ``layouts`` remembers validated maps
    and ``judged`` the verdicts of small plans (see ``_judge``). ``verify_plans`` offers exact
    types to its quick judgement (``_quick``) first.

    A plan that fails is judged once more with the maps swapped. ``verify_plan(source, target,
    plan)`` is an easy slip (the planner's order is target first too), and its verdict alone
    ("reads addresses outside source location 0") sends the user to debug a planner that is
    right. When the swapped judgement is ``ok`` the verdict keeps its status and counterexample
    (the plan *is* wrong for the maps as given) and its reason says so. A passing plan is never
    judged twice, so the check costs nothing on the path that matters. Both judgements judge one
    reading of the plan (``_parse``, made by whichever judgement first gets past the maps): a plan
    whose segments answer each read differently (a subclass's property) is never judged on two
    different readings.
    """
    parsed: list[_Parsed] = []
    verdict = _judge(
        target_map, source_map, plan, parameter=parameter, fallback_elements=fallback_elements, layouts=layouts,
        judged=judged, parsed=parsed,
    )
    if (
        verdict.ok or verdict.reason == _UNREADABLE or _batch_map(target_map, source_map) is not None
        or _batch_plan(plan) is not None
    ):
        return verdict  # a map that cannot be read is not read again, the other way round either
    swapped = _judge(
        source_map, target_map, plan, parameter=parameter, fallback_elements=fallback_elements, layouts=layouts,
        judged=judged, parsed=parsed,
    )
    if not swapped.ok:
        return verdict
    return replace(
        verdict,
        reason=f"{verdict.reason} — {SWAPPED_NOTE}",
        map_error=None if verdict.map_error is None else f"{verdict.map_error} — {SWAPPED_NOTE}",
    )


def _looks_like_batch(value: Any, member: Callable[[Any], bool]) -> bool:
    """Whether ``value`` is a non-empty ``{name: ...}`` dict whose every value passes ``member``
    and which is not itself a map or plan dict (those have ``logical_shape``)."""
    return (
        isinstance(value, Mapping) and bool(value) and "logical_shape" not in value and "segments" not in value
        and all(isinstance(k, str) for k in value) and all(member(v) for v in value.values())
    )


def _is_pair(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(m, (ParamAffineMap, Mapping)) for m in value
    )


def _is_plan(value: Any) -> bool:
    return isinstance(value, TransferPlan) or (isinstance(value, Mapping) and "segments" in value)


def _batch_map(target_map: Any, source_map: Any) -> str | None:
    """What to say when a ``{name: (target, source)}`` batch was passed to the one-parameter
    ``verify_plan`` as a map. Without this the verdict complains about a missing
    ``logical_shape``, which is true but does not say that the function meant is ``verify_plans``."""
    for side, value in (("target", target_map), ("source", source_map)):
        if _looks_like_batch(value, _is_pair):
            return (
                f"the {side} map is a batch {{name: (target, source)}} of {len(value)} parameter(s), not one map; "
                "use verify_plans(pairs, plans) for a batch"
            )
    return None


def _batch_plan(plan: Any) -> str | None:
    """The same for a ``{name: plan}`` batch passed as the plan."""
    if _looks_like_batch(plan, _is_plan):
        return (
            f"the plan is a batch {{name: plan}} of {len(plan)} plan(s), not one plan; "
            "use verify_plans(pairs, plans)"
        )
    return None


_Parsed = tuple[list[TransferSegment], tuple[int, ...] | None] | AffineTransferError
"""``parse_plan``'s answer, or the error it raised (reported after the maps' own errors)."""


def _parse(plan: PlanLike) -> _Parsed:
    """The plan read, or why it cannot be: also when reading it runs the caller's own code that
    raises (an ``__iter__``, ``__getitem__`` or ``__index__`` of an object in the plan), which
    escaped ``verify_plan`` as a bare traceback though it promises a verdict for any input."""
    try:
        return parse_plan(plan)
    except AffineTransferError as exc:
        return exc
    except MemoryError:
        raise
    except Exception as exc:
        if _plain_input(plan):  # no code of the caller's ran: a bug of ours stays a crash, never "invalid"
            raise
        said = describe_exception(exc).splitlines()[0][:200]
        return InvalidMapError(f"plan: cannot be read: reading it raised {said}")


_PLAIN = frozenset({int, str, float, bool, type(None)})


def _plain_input(plan: object) -> bool:
    """Whether ``plan`` is made of exact built-in values and exact plan objects only, so that
    reading it can run none of the caller's code. An exception raised while reading such a plan
    is refplan's own bug; with anything else in it (a subclass, a user object, a numpy value) it
    may be the caller's. Decided by the input, not by where the traceback ends: a method written
    in C (a dict subclass's lookup) has no frame of its own, and a caller's method may call back
    into refplan, so the innermost frame named the wrong culprit (a second review). Walked only
    after an exception, never on the way to a verdict."""
    stack: list[object] = [plan]
    try:
        while stack:
            value = stack.pop()
            kind = type(value)
            if kind in _PLAIN:
                continue
            if kind is dict:
                stack.extend(value.keys())  # type: ignore[attr-defined]
                stack.extend(value.values())  # type: ignore[attr-defined]
            elif kind is list or kind is tuple:
                stack.extend(value)  # type: ignore[arg-type]
            elif kind is TransferPlan:
                stack.extend((value.segments, value.logical_shape))  # type: ignore[attr-defined]
            elif kind is TransferSegment:
                stack.extend(FIELDS(value))
            else:
                return False
    except Exception:
        return False
    return True


_UNREADABLE = "a map cannot be read, so the plan was not judged"


def _plain_map(value: object) -> bool:
    """Whether ``value`` is an exact ``ParamAffineMap`` whose content is a shared ``MapContent``:
    plain values all the way down (ints, tuples, exact ``AffinePiece``s), so reading it runs only
    refplan's code. Anything else (a subclass of the map or of a piece, whose properties are the
    caller's code; a dict form, whose values are converted by their own ``__index__``) may raise
    while it is read, and such a map is ``invalid_map`` ("cannot be read"), as a segment that
    cannot be read is a malformed plan: ``verify_plan`` never raises on input."""
    return type(value) is ParamAffineMap and type(value.content) is MapContent


def _judge(
    target_map: MapLike,
    source_map: MapLike,
    plan: PlanLike,
    *,
    parameter: str | None = None,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
    layouts: dict[Any, Layout] | None = None,
    judged: Judged | None = None,
    parsed: list[_Parsed],
) -> Verdict:
    """One judgement of ``plan`` against the maps as given (``_verify_plan`` without the swap);
    ``parsed`` holds the one reading of ``plan`` that is judged (``_parse``), made here if it is
    empty once the maps are valid (a plan is not read for maps that are refused), and shared by
    ``_verify_plan``'s two judgements (the oracle never mutates it)."""
    side, given = "target", target_map  # the map being read, for a map whose own code raises
    try:
        misuse = _batch_map(target_map, {})
        if misuse is None:
            side, given = "source", source_map
            misuse = _batch_map({}, source_map)
        if misuse is not None:
            raise InvalidMapError(misuse)
        side, given = "target", target_map
        target = as_map(target_map, "target")
        t_shape = tuple(target.logical_shape)
        side, given = "source", source_map
        source = as_map(source_map, "source")
        s_shape = tuple(source.logical_shape)
        if t_shape != s_shape:
            raise InvalidMapError(
                f"target map describes {show_ints(target.logical_shape)}, source map "
                f"{show_ints(source.logical_shape)}: "
                "a reshape is not a transfer"
            )
        # spec/validation.md's order: the whole source map but its region rules, the whole target
        # map alike, then the region rules of both (R24, R25, then R26), as the planner does.
        src, src_regions = validated_parts(source, "source", layouts)
        side, given = "target", target_map
        tgt, tgt_regions = validated_parts(target, "target", layouts)
        side, given = "source", source_map
        src_regions()
        side, given = "target", target_map
        tgt_regions()
    except AffineTransferError as exc:
        return Verdict(
            "invalid_map", parameter, reason="a map is invalid, so the plan was not judged",
            map_error=f"{type(exc).__name__}: {exc}",
        )
    except TooLarge as exc:
        return Verdict("unverifiable", parameter, reason=str(exc))
    except Exception as exc:
        if _plain_map(given):
            raise  # plain values cannot raise while read: this is the oracle's own failure, not the input's
        error = f"{side} map cannot be read: {describe_exception(exc)}"
        return Verdict("invalid_map", parameter, reason=_UNREADABLE, map_error=error)
    misuse = _batch_plan(plan)
    if misuse is not None:
        return Verdict("invalid", parameter, reason=f"malformed plan: {misuse}")
    if not parsed:
        parsed.append(_parse(plan))
    reading = parsed[0]
    if isinstance(reading, AffineTransferError):
        return Verdict("invalid", parameter, reason=f"malformed plan: {reading}")
    segments, plan_shape = reading
    if plan_shape is not None and plan_shape != tgt.logical_shape:
        return Verdict(
            "invalid", parameter,
            reason=f"the plan describes logical shape {plan_shape}, the maps {tgt.logical_shape}",
        )
    if judged is None or len(segments) > limits.REMEMBER_SEGMENTS:
        return check_plan(segments, src, tgt, fallback_elements).with_parameter(parameter)
    # The judgement reads nothing but the segments and the two validated layouts (and the batch's
    # fallback_elements), so a parameter whose layouts and segments are identical to an earlier
    # one's — every field of every segment, in order — gets that verdict under its own name. The
    # layouts are keyed by identity: ``validated`` hands out one object per distinct map content,
    # and the entry holds both, so their ids cannot be reused by other objects meanwhile.
    #
    # The first plan judged against a pair of layouts is filed under the pair alone, with its
    # segments, and no content key is built: when every parameter has layouts of its own (per-layer
    # widths, pruned models: issue 27) no plan is ever looked up again, and building and hashing
    # that key was about a tenth of the judgement. A later plan on the same pair reads the first
    # one's content then (the segments are frozen and the list is the oracle's own, so it is the
    # content that was judged) and keeps it in place of the segments; a plan with other content is
    # filed under (pair, content). One entry per distinct plan, as ``verify_stream``'s bound counts.
    pair = (id(src), id(tgt))
    first = judged.get(pair)
    if first is None:
        verdict = check_plan(segments, src, tgt, fallback_elements)
        judged[pair] = (src, tgt, verdict, segments)
        return verdict.with_parameter(parameter)
    content = tuple(map(_segment_content, segments))
    first_content = first[3]
    if type(first_content) is list:  # the first plan's segments, not read as content yet
        first_content = tuple(map(_segment_content, first_content))
        judged[pair] = (src, tgt, first[2], first_content)
    if content == first_content:
        return first[2].with_parameter(parameter)
    key = (*pair, content)  # three items: never a pair's key
    earlier = judged.get(key)
    if earlier is None:
        earlier = judged[key] = (src, tgt, check_plan(segments, src, tgt, fallback_elements), content)
    return earlier[2].with_parameter(parameter)


def segment_errors(
    target_map: MapLike, source_map: MapLike, plan: PlanLike, *, limit: int, scan: int,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
) -> tuple[list[tuple[int, Verdict]], int]:
    """Segments of ``plan`` that are wrong on their own, each with the judgement of that segment
    alone, up to ``limit``, among the first ``scan``; and how many were judged.

    ``check_plan`` stops at a plan's first counterexample. What one segment does by itself —
    stay inside both shards, write each target address once, read the logical element each
    target address needs from a source address that holds it — does not depend on the others,
    so each segment is judged as a plan of its own, by ``check_plan`` with only the gap check
    left out (one segment never covers a shard; a gap or a double write *between* segments is the
    whole plan's verdict's business). Never an ``ok``: only ``invalid`` judgements are returned,
    and an empty list when the maps or the plan cannot be read (the plan's verdict says why).
    """
    try:
        target = as_map(target_map, "target")
        source = as_map(source_map, "source")
        src = validated(source, "source", None)
        tgt = validated(target, "target", None)
        segments, _shape = parse_plan(plan)
    except (AffineTransferError, TooLarge):
        return [], 0
    except Exception:
        if _plain_map(target_map) and _plain_map(source_map):
            raise  # refplan's own failure (``_judge`` says the same)
        return [], 0  # a map whose own code raised cannot be read: the plan's verdict says so
    found: list[tuple[int, Verdict]] = []
    judged = 0
    for index, segment in enumerate(segments[: max(scan, 0)]):
        judged += 1
        verdict = check_plan([segment], src, tgt, fallback_elements, gaps=False)
        if verdict.status == "invalid":
            found.append((index, verdict))
            if len(found) >= limit:
                break
    return found, judged


_segment_content = FIELDS
"""Every field of a segment: two segments with equal content copy the same elements."""


def verify_plans(
    pairs: Mapping[str, tuple[MapLike, MapLike]],
    plans: Mapping[str, PlanLike],
    *,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
) -> BatchVerdict:
    """``verify_plan`` for every parameter; one missing from either side is ``invalid``.

    Parameters that repeat a layout are judged once: a later parameter whose map contents and plan
    are the very objects an earlier one's were, or whose plan's content equals it, gets that
    verdict under its own name (``Same``, ``_judge``). Nothing is remembered from one call to the
    next, and each verdict is the one ``verify_plan`` gives that parameter alone
    (tests/test_verify_reuse.py)."""
    fallback_elements = fallback_budget(fallback_elements)
    with cycle_collection_paused():
        return _verify_plans(pairs, plans, fallback_elements)


def _verify_plans(
    pairs: Mapping[str, tuple[MapLike, MapLike]], plans: Mapping[str, PlanLike], fallback_elements: int
) -> BatchVerdict:
    verdicts: dict[str, Verdict] = {}
    layouts: dict[Any, Layout] = {}
    judged: Judged = {}
    same: Same = {}
    statuses: set[str] = set()
    pairs, unread_pairs = _read_once(pairs, "pairs")
    plans, unread_plans = _read_once(plans, "plans")
    try:
        if type(pairs) is dict and type(plans) is dict and len(plans) == len(pairs) and plans.keys() <= pairs.keys():
            names = sorted(pairs)  # the same names: a model's dict is often in order already, which sorts in one pass
        else:
            names = sorted(set(pairs) | set(plans))
    except TypeError:  # verdicts come in name order, and names of types that do not compare have none
        kinds = ", ".join(sorted({type(name).__name__ for name in (*pairs, *plans)}))
        raise TypeError(f"verify_plans: the parameter names do not sort: they are of types {kinds}; names are "
                        "str") from None
    # ``same`` pays only when a plan object comes twice; in a batch of distinct plans (every
    # parameter's layout its own) neither looking verdicts up nor filing them is worth its cost.
    repeats = type(plans) is not dict or len({*map(id, plans.values())}) < len(plans)
    # ``twins`` pays only when distinct plan objects share one segments tuple: a planner that
    # remembers layouts hands a model's layers plans of their own around the same segments
    # (``Twins``).
    exact = [p for p in plans.values() if type(p) is TransferPlan]
    shares = limits.REMEMBER_SEGMENTS >= 0 and (  # off with every other reuse (``limits.fast_paths``)
        repeats or len({id(getattr(p, "segments", p)) for p in exact}) < len(exact))
    twins: Twins = {}
    # Map readings: where plans repeat, every content read is kept (``_KEEP``: few are read, and a
    # content met again under another plan object is read once); in a batch of distinct plans,
    # only those of contents that more than one map holds (``_shared_contents``; of a plain dict of
    # pairs: another mapping is read only through its keys, as below, and its readings are not kept).
    reads = {_KEEP: _KEEP} if repeats else _shared_contents(pairs) if type(pairs) is dict else {}
    for name in names:
        if name in unread_pairs:
            verdict = Verdict("invalid_map", name, reason="the maps of this parameter cannot be read, so no plan was "
                              "judged", map_error=f"pairs[{name!r}]: {unread_pairs[name]}")
        elif name in unread_plans:
            verdict = Verdict("invalid", name, reason=f"malformed plan: plans[{name!r}] cannot be read "
                              f"({unread_plans[name]})")
        elif name not in plans:
            verdict = Verdict("invalid", name, reason="the maps describe this parameter but no plan does")
        elif name not in pairs:
            verdict = Verdict("invalid", name, reason="a plan for a parameter the maps do not describe")
        else:
            pair = pairs[name]
            try:
                target, source = pair
            except Exception:  # a value of another form (or an iterable that fails) is no pair of maps
                verdict = Verdict("invalid_map", name, reason="the maps of this parameter are not a (target map, "
                                  "source map) pair, so no plan was judged", map_error=f"pairs[{name!r}] is "
                                  f"{describe(pair)}")
                verdicts[name] = verdict
                statuses.add(verdict.status)
                continue
            plan = plans[name]
            if type(plan) is TransferPlan and type(target) is ParamAffineMap and type(source) is ParamAffineMap:
                t_content = target.content
                s_content = source.content
                entry = same.get(id(plan)) if repeats else None
                if entry is not None and (entry[0] is not t_content or entry[1] is not s_content):
                    entry = same.get((id(plan), id(t_content), id(s_content)))
                if entry is not None and (entry[4] > 0 or (entry[4] == 0 and _frozen(same, entry))):
                    verdicts[name] = entry[3].with_parameter(name)
                    continue
                twin_key: tuple[int, int, int] | None = None
                twin_segments: tuple[Any, ...] = ()
                if shares and type(t_content) is MapContent and type(s_content) is MapContent:
                    segments = getattr(plan, "segments", None)  # deleted past the frozen dataclass: judged invalid
                    if type(segments) is tuple:
                        twin_segments = segments
                        twin_key = (id(segments), id(t_content), id(s_content))
                        twin = twins.get(twin_key)
                        if twin is not None:
                            if _twin_of(twins, twin_key, twin, plan):
                                verdicts[name] = twin[4].with_parameter(name)
                                continue
                            twin_key = None  # filed already: this one is judged afresh
                quick = _quick(target, source, plan, name, t_content, s_content, reads)
                if quick is not None:
                    verdict = quick
                else:
                    verdict = _verify_plan(
                        target, source, plan, parameter=name, fallback_elements=fallback_elements,
                        layouts=layouts, judged=judged,
                    )
                if entry is None and repeats:
                    _remember(same, t_content, s_content, plan, verdict)
                if twin_key is not None:
                    twins[twin_key] = (twin_segments, t_content, s_content, plan, verdict, 0)
            else:
                verdict = _verify_plan(
                    target, source, plan, parameter=name, fallback_elements=fallback_elements, layouts=layouts,
                    judged=judged,
                )
        verdicts[name] = verdict
        statuses.add(verdict.status)
    return BatchVerdict(worst(statuses), verdicts)


_Read = dict[int, small.Place]
_Reads = dict[MapContent, Any]
"""``_verify_plans``'s readings of map contents by ``small.read_map``: the reading, or ``_DECLINED``
when it is not a small plain map (``_UNREAD`` until read). Which are kept: every one when the dict
holds the key ``_KEEP``, else those of the contents the batch holds more than once
(``_shared_contents``). The dict holds each content, so its identity is not reused while the
batch runs."""


def _quick(
    target: ParamAffineMap, source: ParamAffineMap, plan: TransferPlan, name: str, t_content: MapContent,
    s_content: MapContent, reads: _Reads,
) -> Verdict | None:
    """The ``ok`` verdict ``_judge`` gives a small plain plan on small plain maps, under ``name``,
    reached without its general steps; ``None`` for anything else (then ``_verify_plan`` judges it).

    ``_judge`` answers ``ok`` through these steps when both maps are read by ``small.read_map``
    (``validate_map``'s small path: every map rule holds), their logical shapes and the plan's
    agree, ``parse_plan`` keeps the plan's segments as they are (a tuple of exact, plain
    ``TransferSegment``), and ``small.judge`` accepts them (``check_plan``'s first step); this is
    the same sequence of checks on the same values, read once per distinct content of the batch
    (``read_map`` reads nothing but the content). Why: with every parameter's layout distinct,
    the steps around those checks (the map and plan forms, the layouts' objects and memos) were
    a fifth of ``verify_plans`` (issue 27)."""
    if type(t_content) is not MapContent or type(s_content) is not MapContent:
        return None
    logical = t_content.logical_shape
    try:  # fields deleted past the frozen dataclass: ``parse_plan`` words that
        segments = plan.segments
        shape = plan.logical_shape
    except AttributeError:
        return None
    if (
        s_content.logical_shape != logical or type(segments) is not tuple or len(segments) > small.SMALL_SEGMENTS
        or type(shape) is not tuple or not _INTS.issuperset(map(type, shape)) or shape != logical
        or not _SEGMENTS.issuperset(map(type, segments))
    ):
        return None
    rows = plain_rows(segments)
    if rows is None:
        return None
    t_read = _reading(target, t_content, reads)
    if t_read is None:
        return None
    s_read = _reading(source, s_content, reads)
    if s_read is None:
        return None
    verdict = _judge_rows(rows, s_read, t_read, len(logical), len(logical))
    return None if verdict is None else verdict.with_parameter(name)


def _reading(m: ParamAffineMap, content: MapContent, reads: _Reads) -> _Read | None:
    """``small.read_map(m)``, kept in ``reads`` (see ``_Reads``) or read afresh for a content the
    batch names once: keeping every reading of a batch of distinct layouts alive cost about 4 µs
    per parameter on the distinct Llama batch (the readings of later parameters could no longer
    reuse the memory of earlier ones), and none of them was ever asked for again."""
    got = reads.get(content)
    if got is None and _KEEP not in reads:  # named once in the batch
        return _read(m)
    if got is None or got is _UNREAD:
        read = _read(m)
        if content.pieces <= limits.REMEMBER_PIECES:  # the bound ``validated`` keeps too
            reads[content] = _DECLINED if read is None else read
        return read
    return None if got is _DECLINED else got


def _read_once(batch: Mapping[str, Any], what: str) -> tuple[Mapping[str, Any], dict[str, str]]:
    """``batch`` as one reading, and the names whose value could not be read (with why).

    An exact ``dict`` is its own reading. Another ``Mapping`` is read once, through its keys and
    one lookup per key, into a ``dict``: the judgement tests membership and looks values up, and a
    mapping of another type could answer those differently, or raise from inside the judgement. A
    lookup that fails makes that parameter's verdict (never a raise from deep inside); an argument
    that is no mapping, or whose keys cannot be listed (or sorted, in ``_verify_plans``), names no
    parameter to give a verdict to, and is a ``TypeError`` naming the argument.
    """
    if type(batch) is dict:
        return batch, {}
    if not isinstance(batch, Mapping):
        raise TypeError(f"verify_plans: {what} is {describe(batch)}, not a mapping of parameter names")
    try:
        names = list(batch)
    except Exception as exc:
        raise TypeError(f"verify_plans: the names of {what} cannot be read: {describe_exception(exc)}") from None
    read: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name in names:
        try:
            read[name] = batch[name]
        except Exception as exc:
            failed[name] = describe_exception(exc)
    return read, failed


def _shared_contents(pairs: Mapping[str, tuple[MapLike, MapLike]]) -> _Reads:
    """``_verify_plans``' readings, to be: each map content that more than one map of the batch
    holds, marked unread; a content held once is not listed (``_reading`` does not keep it).
    Only what ``_quick`` would read is counted (exact ``ParamAffineMap`` in a pair); a value of
    another form is left to ``_verify_plan``, which reads nothing from here."""
    reads: _Reads = {}
    once: set[int] = set()  # ids of contents held by the pairs, which hold them for the whole call
    for pair in pairs.values():
        if type(pair) is tuple:
            for m in pair:
                if type(m) is ParamAffineMap:
                    content = m.content
                    if id(content) in once:
                        reads[content] = _UNREAD
                    else:
                        once.add(id(content))
    return reads


_read = small.read_map
"""``_quick``'s map reading and plan judgement, by name so that tests count them as they count
``validate_map`` and ``check_plan`` (conftest's ``oracle_work``)."""
_judge_rows = small.judge_rows


_UNREAD: Any = object()
_DECLINED: Any = object()
_KEEP: Any = object()
"""A key of ``_Reads`` saying that every reading is kept (a batch whose plans repeat)."""
_SEGMENTS = frozenset({TransferSegment})
_INTS = frozenset({int})


Same = dict[Any, tuple[MapContent, MapContent, TransferPlan, Verdict, int]]
"""``_verify_plans``'s memo of whole verdicts: (target content, source content, plan, verdict,
whether the plan was found immutable: 0 not asked yet, 1 yes, -1 no). An entry is filed under
``id(plan)``, or, when that is taken by the same plan met with other maps, under ``(id(plan),
id(target content), id(source content))``. It holds the three objects, so their ids cannot be
reused by other objects while the batch runs.

Why identities and not content: a model's layers share their maps' contents (``MapContent`` is
hash-consed: equal content *is* one object, and its attributes cannot be assigned), and a planner
that remembers layouts hands every layer the same ``TransferPlan`` object. The verdict reads
nothing else (a ``ParamAffineMap`` holds only its content; the batch's ``fallback_elements`` is
fixed), so a parameter whose target content, source content and plan are the very objects an
earlier parameter's were gets that verdict under its own name, for a few attribute reads and one
lookup. Building a content key (every field of every segment) and re-reading the maps per
parameter was most of ``verify_plans`` on such batches (issue 27: 141 ms against a 50 ms plan
on moe-model). Only exact types are remembered: a subclass (of a map, a content or a plan) could
read differently each time, and a content that is not a shared ``MapContent``
(``maps._UnsharedContent``) may hold pieces that are not plain ``AffinePiece`` values. The plan's
own parts are checked on its first reuse (``_frozen``), so a batch of distinct plans never pays
for it. Everything else (dict forms, lists of segments, a plan met again with other maps) goes
through ``_judge``, whose own reuse compares content."""


def _remember(same: Same, t_content: MapContent, s_content: MapContent, plan: TransferPlan, verdict: Verdict) -> None:
    """File a first verdict for (target content, source content, plan) in ``same``; see ``Same``.

    Plans of more than ``limits.REMEMBER_SEGMENTS`` segments are not filed, as ``_judge`` files
    none: one bound, and one switch (``limits.fast_paths``), governs reuse by plan object and by
    content. (``Twins`` reuses by the segments tuple's identity, which builds no key: no length
    bound, the same switch.)"""
    if type(t_content) is not MapContent or type(s_content) is not MapContent:
        return
    segments = getattr(plan, "segments", None)  # deleted past the frozen dataclass: judged invalid, not filed
    if type(segments) is not tuple or len(segments) > limits.REMEMBER_SEGMENTS:
        return
    key: Any = id(plan)
    if key in same:
        key = (key, id(t_content), id(s_content))
    same[key] = (t_content, s_content, plan, verdict, 0)


Twins = dict[tuple[int, int, int], tuple[tuple[Any, ...], MapContent, MapContent, TransferPlan, Verdict, int]]
"""``_verify_plans``'s memo of verdicts by (id of a plan's segments tuple, id of the target
content, id of the source content): (that tuple, the two contents, the first plan judged with
them, its verdict, whether that plan was found immutable: 0 not asked yet, 1 yes, -1 no). The
entry holds the objects, so their ids cannot be reused while the batch runs.

Why: ``Same`` reuses a verdict when the very plan object comes again; a planner that remembers
layouts hands each parameter a plan of its own around the same segments tuple (refplan's do), so
on a model whose layers each have hundreds of segments (a broadcast to many engines: 433 per
parameter on ``rl-broadcast``) every layer was judged again, and ``verify_plans`` took 1.8x the
planning it checks. The judgement reads a plan's segments and logical shape and nothing else, so
a later plan with the very same segments tuple, an equal logical shape of plain ints and the very
same map contents gets the first one's verdict (``_twin_of``). Identity needs no content key, so
no ``REMEMBER_SEGMENTS`` bound applies: an entry holds references, never a copy."""


def _twin_of(twins: Twins, key: tuple[int, int, int], entry: tuple[Any, ...], plan: TransferPlan) -> bool:
    """Whether ``plan`` may take ``entry``'s verdict: the first plan filed there holds only immutable
    values (``segments.immutable_plan``, asked on the first reuse and kept in the entry) and
    ``plan``'s logical shape is a tuple of plain ints equal to that plan's."""
    segments, t_content, s_content, first, verdict, frozen = entry
    if frozen == 0:
        frozen = 1 if immutable_plan(first) else -1
        twins[key] = (segments, t_content, s_content, first, verdict, frozen)
    if frozen < 0:
        return False
    shape = getattr(plan, "logical_shape", None)
    return type(shape) is tuple and _INTS.issuperset(map(type, shape)) and shape == first.logical_shape


def _frozen(same: Same, entry: tuple[MapContent, MapContent, TransferPlan, Verdict, int]) -> bool:
    """Whether ``entry``'s plan holds only immutable values (``segments.immutable_plan``), so that
    the same object is the same content whenever it is met again; the answer is kept in the entry.
    Asked on the first reuse, once per remembered plan. A plan that is not so is judged afresh for
    every parameter that gives it."""
    t_content, s_content, plan, verdict, _ = entry
    frozen = immutable_plan(plan)
    key: Any = id(plan)
    if same.get(key) is not entry:
        key = (key, id(t_content), id(s_content))
    same[key] = (t_content, s_content, plan, verdict, 1 if frozen else -1)
    return frozen
