"""Source regions and target intersections: Premises B and C.

- ``source_regions`` — Premise B: source frames grouped by identical logical box form *regions*;
  distinct regions must be pairwise disjoint, and together cover F. A region's holders are every
  frame with that box: by ``frames.check_holders`` they are exactly its declared locations and
  each holds all of it, so any of them can serve any sub-box (the candidates of a request).
  Replicas cut at *different* boundaries are legitimate but not expressible here: refused with
  ``UnsupportedLayoutError`` so a caller may rebuild and re-shard instead.
- ``check_target_cover`` — every element of F has at least one target slot (R26); target replicas,
  even cut at different boundaries, are fine because targets are never grouped.
- ``intersections`` — Premise C: every target frame is exactly tiled by its intersections with
  the regions. Because regions are disjoint, the intersections inside one frame are disjoint, so
  a volume sum per frame is an exact check (a whole-plan count could not see a gap and an overlap
  of equal size).

Overlaps are found with ``box.overlapping_pairs`` (a k-d partition), never all pairs.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import partial
from math import prod
from operator import add, gt, sub
from typing import Any

import numpy as np

from . import limits
from .box import Box, WorkCounter, box_arrays, covers, overlapping_pair_array, overlapping_pairs
from .errors import InvalidMapError, UnsupportedLayoutError
from .frames import Frame, NormalizedMap, _apart

__all__ = ["Intersection", "Region", "check_target_cover", "intersections", "source_regions"]


@dataclass(frozen=True)
class Region:
    """A box of F and every source frame holding exactly it, sorted by location."""

    box: Box
    holders: tuple[Frame, ...]


@dataclass(frozen=True)
class Intersection:
    """The part ``box`` of target frame ``target`` that lies in source region ``region``."""

    target: Frame
    region: Region
    box: Box


def source_regions(source: NormalizedMap, work: WorkCounter) -> tuple[Region, ...]:
    """Premise B (R22–R25): group source frames into disjoint regions that cover F."""
    groups: dict[Box, list[Frame]] = {}
    for f in source.frames:
        group = groups.get(f.box)
        if group is None:
            groups[f.box] = [f]
        else:
            group.append(f)
    # Frames arrive sorted by location (``normalize``), so each group's holders already are.
    regions = tuple([_new_region(box, tuple(holders)) for box, holders in sorted(groups.items())])
    boxes = [r.box for r in regions]
    if len(boxes) < 2:
        pairs: set[tuple[int, int]] = set()  # nothing to compare, nothing charged
    elif _apart(boxes):
        # Validated frames are non-empty: one axis separating the boxes settles the query, which
        # charges one look per box whichever path it takes (``box.overlapping_pairs``).
        pairs = set()
        work.add(len(boxes))
    else:
        pairs = overlapping_pairs(boxes, work)
    if pairs:
        a, b = (regions[i] for i in min(pairs))
        raise UnsupportedLayoutError(
            f"parameter {source.parameter!r}, source map: replicas are cut at different piece boundaries: "
            f"box {a.box} (locations {[f.location for f in a.holders]}) overlaps box {b.box} "
            f"(locations {[f.location for f in b.holders]}); rebuild and re-shard instead"
        )
    held = sum([prod(box.extent) for box in boxes])
    numel = prod(source.logical_shape)
    if held != numel:
        hole = covers(Box((0,) * len(source.logical_shape), source.logical_shape), [r.box for r in regions], work)
        raise InvalidMapError(
            f"parameter {source.parameter!r}, source map: source pieces cover only {held} of its {numel} "
            f"elements; box {hole} is held by no source location"
        )
    return regions


def check_target_cover(target: NormalizedMap, work: WorkCounter) -> None:
    """R26: the union of target boxes covers F, so no logical element is dropped by the sync."""
    boxes = sorted({f.box for f in target.frames})
    if boxes and _apart(boxes) and sum([prod(b.extent) for b in boxes]) == prod(target.logical_shape):
        # Validated frames lie inside F and are non-empty, so the distinct boxes, disjoint (one
        # axis separates them) and as large as F together, cover it: ``covers`` settles exactly
        # this case at its root, after one look per box, and is charged the same here.
        work.add(len(boxes))
        return
    full = Box((0,) * len(target.logical_shape), target.logical_shape)
    hole = covers(full, boxes, work)
    if hole is not None:
        raise InvalidMapError(
            f"parameter {target.parameter!r}, target map: target pieces do not cover F "
            f"{target.logical_shape}; box {hole} has no target location"
        )


def intersections(
    target: NormalizedMap, regions: tuple[Region, ...], work: WorkCounter
) -> list[Intersection]:
    """Premise C (R27–R28): every target frame tiled by its region intersections, in request order.

    Order: (target location, logical origin). Within one location frames are disjoint in F
    (R20), so this order is total and the same on every process. The parts, their volumes per
    frame and the order are computed on arrays of all pairs at once (a gathered layout has one
    pair per piece); only the returned objects are built one by one.
    """
    frames = target.frames
    if len(frames) + len(regions) < limits.ARRAY_MIN_PIECES:
        small = _small_intersections(target, regions, work)
        if small is not None:
            return small
    # Beyond one leaf of boxes, pairs are found between *distinct* target boxes and the regions,
    # then given to every frame of that box: a box replicated over k target locations (a
    # broadcast) was k boxes to the k-d query, which cannot split identical boxes and compared all
    # k of them pairwise in each leaf (k = 1024: 2.6 s; k = 4096: refused by max_pair_checks).
    # Up to one leaf (``limits.LEAF`` boxes) the query is on the frames' own boxes, as it always
    # was: the replicated slab path (``planner._slab_layout``) charges exactly what it charges
    # there. Without repeated boxes both are the same query on the same boxes.
    if len(frames) + len(regions) <= limits.LEAF:
        of_frame = np.arange(len(frames), dtype=np.int64)
        boxes = [f.box for f in frames] + [r.box for r in regions]
    else:
        distinct: dict[Box, int] = {}
        of_frame = np.fromiter((distinct.setdefault(f.box, len(distinct)) for f in frames), dtype=np.int64,
                               count=len(frames))
        boxes = [*distinct, *(r.box for r in regions)]
    first_region = len(boxes) - len(regions)
    found = overlapping_pair_array(boxes, work, groups=[0] * first_region + [1] * len(regions))
    i, j = _per_frame(found, of_frame, first_region)  # frame index, box index (a region's)
    origins, extents = box_arrays(boxes)
    ends = origins + extents
    f_origins, f_ends = origins[of_frame], ends[of_frame]
    lo = np.maximum(f_origins[i], origins[j])
    part_extent = np.minimum(f_ends[i], ends[j]) - lo
    # Coordinates are at most 2**62 (frames.MAX_COORDINATE) and a part lies inside F, whose volume
    # is at most 2**62 too, so neither the products nor the per-frame sums below overflow int64.
    received = np.zeros(len(frames), dtype=np.int64)
    np.add.at(received, i, np.prod(part_extent, axis=1))
    short = np.flatnonzero(received != np.prod(extents[of_frame], axis=1))
    if short.size:
        frame = frames[int(short[0])]
        got = int(received[short[0]])
        raise InvalidMapError(
            f"parameter {target.parameter!r}, target map, location {frame.location}, piece "
            f"{frame.piece_index}: box {frame.box} would receive {got} of its {frame.box.volume} elements"
        )
    # (target location, origin, extent): a box is the tuple (origin, extent).
    location = np.array([f.location for f in frames], dtype=np.int64)[i]
    ndim = lo.shape[1]
    keys = [part_extent[:, a] for a in reversed(range(ndim))] + [lo[:, a] for a in reversed(range(ndim))]
    order = np.lexsort((*keys, location))
    out: list[Intersection] = []
    append = out.append
    for f, r, o, e in zip(
        i[order].tolist(), (j[order] - first_region).tolist(), lo[order].tolist(), part_extent[order].tolist()
    ):
        append(Intersection(frames[f], regions[r], Box(tuple(o), tuple(e))))
    return out


def _per_frame(
    pairs: np.ndarray[Any, np.dtype[np.int64]], of_frame: np.ndarray[Any, np.dtype[np.int64]], distinct: int
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]]:
    """(frame, region box) index pairs from (distinct box, region box) ones: each frame gets every
    pair of its box, frames in order and, within one, the pairs in the order found. Linear in
    the output."""
    by_box = pairs[np.argsort(pairs[:, 0], kind="stable")]
    counts = np.bincount(by_box[:, 0], minlength=distinct)
    starts = np.cumsum(counts) - counts
    per_frame = counts[of_frame]
    frame = np.repeat(np.arange(len(of_frame), dtype=np.int64), per_frame)
    within = np.arange(len(frame), dtype=np.int64) - np.repeat(np.cumsum(per_frame) - per_frame, per_frame)
    return frame, by_box[np.repeat(starts[of_frame], per_frame) + within, 1]


def _small_intersections(
    target: NormalizedMap, regions: tuple[Region, ...], work: WorkCounter
) -> list[Intersection] | None:
    """``intersections`` for a few boxes, without numpy's fixed cost per call (a TP layout has a
    dozen boxes; the array path spent ~0.3 ms on them). The same pairs, the same work counted,
    the same checks and the same order, or ``None`` when the slab join does not apply (then the
    array path decides, its k-d query included). tests/test_fast_paths.py holds the two equal.
    """
    frames = target.frames
    pairs = _slab_join([f.box for f in frames], [r.box for r in regions], work)
    if pairs is None:
        return None
    received = [0] * len(frames)
    parts: list[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = []
    for i, j in pairs:
        (a_origin, a_extent), (b_origin, b_extent) = frames[i].box, regions[j].box
        lo = tuple(map(max, a_origin, b_origin))
        extent = tuple(map(sub, map(min, map(add, a_origin, a_extent), map(add, b_origin, b_extent)), lo))
        received[i] += prod(extent)
        parts.append((frames[i].location, lo, extent, i, j))
    for frame, got in zip(frames, received):
        if got != prod(frame.box.extent):
            raise InvalidMapError(
                f"parameter {target.parameter!r}, target map, location {frame.location}, piece "
                f"{frame.piece_index}: box {frame.box} would receive {got} of its {frame.box.volume} elements"
            )
    parts.sort()  # (target location, origin, extent): the array path's lexsort order
    return [_new_intersection(frames[i], regions[j], _new_box((lo, extent))) for _, lo, extent, i, j in parts]


_new_box = partial(tuple.__new__, Box)
"""``Box`` from an (origin, extent) pair without the named tuple's Python ``__new__``."""


def _new_region(box: Box, holders: tuple[Frame, ...]) -> Region:
    """``Region(box, holders)`` with the instance dictionary filled in one step."""
    made = _new_object(Region)
    _set_attribute(made, "__dict__", {"box": box, "holders": holders})
    return made


def _new_intersection(target: Frame, region: Region, box: Box) -> Intersection:
    """``Intersection(target, region, box)`` with the instance dictionary filled in one step (the
    frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``)."""
    made = _new_object(Intersection)
    _set_attribute(made, "__dict__", {"target": target, "region": region, "box": box})
    return made


_new_object = object.__new__
_set_attribute = object.__setattr__


def _slab_join(
    a_boxes: list[Box], b_boxes: list[Box], work: WorkCounter
) -> list[tuple[int, int]] | None:
    """``box._interval_join`` (through ``overlapping_pair_array``) for two short lists of boxes:
    the overlapping (a, b) index pairs by a sorted merge along the first axis on which each side's
    non-empty boxes are slabs, charging ``work`` exactly as it does; ``None`` if no axis qualifies
    or a side has no non-empty box (the array path then decides)."""
    live_a = [k for k, (_, extent) in enumerate(a_boxes) if not extent or min(extent) > 0]  # every extent > 0
    live_b = [k for k, (_, extent) in enumerate(b_boxes) if not extent or min(extent) > 0]
    if not live_a or not live_b:
        return None
    ndim = len(a_boxes[live_a[0]].origin)
    for axis in range(ndim):
        # (start, end, index) sorted by start, as the array path's stable argsort: two non-empty
        # boxes that start together overlap on this axis, which is then not used, so the order of
        # ties never matters.
        spans_a = sorted([(a_boxes[k][0][axis], a_boxes[k][0][axis] + a_boxes[k][1][axis], k) for k in live_a])
        spans_b = sorted([(b_boxes[k][0][axis], b_boxes[k][0][axis] + b_boxes[k][1][axis], k) for k in live_b])
        lo_a, hi_a, order_a = zip(*spans_a)
        lo_b, hi_b, order_b = zip(*spans_b)
        if any(map(gt, hi_a, lo_a[1:])) or any(map(gt, hi_b, lo_b[1:])):
            continue
        runs = [(bisect_right(hi_b, lo), bisect_left(lo_b, hi)) for lo, hi in zip(lo_a, hi_a)]
        work.add(len(order_a) + len(order_b) + sum([stop - first for first, stop in runs if stop > first]))
        pairs = []
        for k, (first, stop) in zip(order_a, runs):
            a = a_boxes[k]
            for m in order_b[first:stop]:
                if a.overlaps(b_boxes[m]):
                    pairs.append((k, m))
        return pairs
    return None
