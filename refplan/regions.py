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

import numpy as np

from . import limits
from .box import Box, WorkCounter, box_arrays, covers, overlapping_pair_array, overlapping_pairs, volume
from .errors import InvalidMapError, UnsupportedLayoutError
from .frames import Frame, NormalizedMap

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
        groups.setdefault(f.box, []).append(f)
    # Frames arrive sorted by location (``normalize``), so each group's holders already are.
    regions = tuple([Region(box, tuple(holders)) for box, holders in sorted(groups.items())])
    pairs = overlapping_pairs([r.box for r in regions], work)
    if pairs:
        a, b = (regions[i] for i in min(pairs))
        raise UnsupportedLayoutError(
            f"parameter {source.parameter!r}, source map: replicas are cut at different piece boundaries: "
            f"box {a.box} (locations {[f.location for f in a.holders]}) overlaps box {b.box} "
            f"(locations {[f.location for f in b.holders]}); rebuild and re-shard instead"
        )
    held = sum(r.box.volume for r in regions)
    numel = volume(source.logical_shape)
    if held != numel:
        hole = covers(Box((0,) * len(source.logical_shape), source.logical_shape), [r.box for r in regions], work)
        raise InvalidMapError(
            f"parameter {source.parameter!r}, source map: source pieces cover only {held} of its {numel} "
            f"elements; box {hole} is held by no source location"
        )
    return regions


def check_target_cover(target: NormalizedMap, work: WorkCounter) -> None:
    """R26: the union of target boxes covers F, so no logical element is dropped by the sync."""
    full = Box((0,) * len(target.logical_shape), target.logical_shape)
    hole = covers(full, sorted({f.box for f in target.frames}), work)
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
    boxes = [f.box for f in frames] + [r.box for r in regions]
    first_region = len(frames)
    pairs = overlapping_pair_array(boxes, work, groups=[0] * first_region + [1] * len(regions))
    origins, extents = box_arrays(boxes)
    ends = origins + extents
    i = pairs[:, 0]
    j = pairs[:, 1]
    lo = np.maximum(origins[i], origins[j])
    part_extent = np.minimum(ends[i], ends[j]) - lo
    # Coordinates are at most 2**62 (frames.MAX_COORDINATE) and a part lies inside F, whose volume
    # is at most 2**62 too, so neither the products nor the per-frame sums below overflow int64.
    received = np.zeros(first_region, dtype=np.int64)
    np.add.at(received, i, np.prod(part_extent, axis=1))
    short = np.flatnonzero(received != np.prod(extents[:first_region], axis=1))
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
        a, b = frames[i].box, regions[j].box
        lo = tuple(map(max, a.origin, b.origin))
        extent = tuple([min(x + e, y + f) - o for x, e, y, f, o in zip(a.origin, a.extent, b.origin, b.extent, lo)])
        received[i] += volume(extent)
        parts.append((frames[i].location, lo, extent, i, j))
    for frame, got in zip(frames, received):
        if got != frame.box.volume:
            raise InvalidMapError(
                f"parameter {target.parameter!r}, target map, location {frame.location}, piece "
                f"{frame.piece_index}: box {frame.box} would receive {got} of its {frame.box.volume} elements"
            )
    parts.sort()  # (target location, origin, extent): the array path's lexsort order
    return [Intersection(frames[i], regions[j], Box(lo, extent)) for _, lo, extent, i, j in parts]


def _slab_join(
    a_boxes: list[Box], b_boxes: list[Box], work: WorkCounter
) -> list[tuple[int, int]] | None:
    """``box._interval_join`` (through ``overlapping_pair_array``) for two short lists of boxes:
    the overlapping (a, b) index pairs by a sorted merge along the first axis on which each side's
    non-empty boxes are slabs, charging ``work`` exactly as it does; ``None`` if no axis qualifies
    or a side has no non-empty box (the array path then decides)."""
    live_a = [k for k, box in enumerate(a_boxes) if all(e > 0 for e in box.extent)]
    live_b = [k for k, box in enumerate(b_boxes) if all(e > 0 for e in box.extent)]
    if not live_a or not live_b:
        return None
    ndim = len(a_boxes[live_a[0]].origin)
    for axis in range(ndim):
        order_a = sorted(live_a, key=lambda k: a_boxes[k].origin[axis])
        order_b = sorted(live_b, key=lambda k: b_boxes[k].origin[axis])
        lo_a = [a_boxes[k].origin[axis] for k in order_a]
        hi_a = [a_boxes[k].origin[axis] + a_boxes[k].extent[axis] for k in order_a]
        lo_b = [b_boxes[k].origin[axis] for k in order_b]
        hi_b = [b_boxes[k].origin[axis] + b_boxes[k].extent[axis] for k in order_b]
        if any(h > lo for h, lo in zip(hi_a, lo_a[1:])) or any(h > lo for h, lo in zip(hi_b, lo_b[1:])):
            continue
        runs = [(bisect_right(hi_b, lo), bisect_left(lo_b, hi)) for lo, hi in zip(lo_a, hi_a)]
        work.add(len(order_a) + len(order_b) + sum(max(stop - first, 0) for first, stop in runs))
        pairs = []
        for k, (first, stop) in zip(order_a, runs):
            a = a_boxes[k]
            for m in order_b[first:stop]:
                if a.overlaps(b_boxes[m]):
                    pairs.append((k, m))
        return pairs
    return None
