"""Differential checks: every encoding the proofs are about, against the code it models.

The z3 claims prove statements about *encodings* (``boxes.intersect_model``,
``coalesce.adjacency`` with ``coalesce.merge_guard``, ``answers.split_checks_model``,
``theorem3.emit_model``, ...). A proof about an encoding says something about refplan only as
long as the encoding computes what the code computes, so each check here evaluates the encoding
itself (``kit.compile_terms`` turns the very z3 terms the claims use into a Python function) and
the production function on the same concrete inputs, and requires them to agree: on *every*
input of a small domain, and on inputs drawn with a fixed seed from larger ones. A change to the
code that breaks what an encoding models prints a ``MISMATCH`` line with the input, and the
script exits 1, which fails ``make proofs``.

Output, one line per check, which ``run_all.py`` parses and compares with ``claims.json``
(a check that ran fewer cases than pinned there, or is missing, fails the run)::

    agrees <check> (<domain>) on <N> cases models=<production functions as JSON>
    MISMATCH <check>: <input>: code <what the code did>, encoding <what the encoding says>
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from math import prod
from typing import Any

import z3
from addresses import frame_start_model
from answers import split_checks_model
from boxes import array_part_model, intersect_model, overlaps_model, pair_model, subtract_model
from coalesce import adjacency, merge_guard, merged_extent
from kit import SymBox, compile_terms, dot, ints, row_major
from slabs import slab_model
from theorem3 import candidate_offset_model, emit_model
from tiling import split_model

from refplan import limits
from refplan.box import (
    Box,
    WorkCounter,
    covers,
    decode_row_major,
    overlapping_pair_array,
    row_major_strides,
    separated,
)
from refplan.check import check_answers
from refplan.errors import InvalidReplicaPolicyError
from refplan.frames import normalize
from refplan.limits import PlanBudget
from refplan.maps import AffinePiece, ParamAffineMap
from refplan.plan import TransferSegment, coalesce, make_segment
from refplan.planner import _emit, _Prepared, _row_segments
from refplan.regions import _small_intersections, intersections, source_regions
from refplan.requests import ReplicaCandidate, ReplicaPart, ReplicaRequest, build_requests

SEED = 20251
MAX_SHOWN = 5
"""Mismatches printed per check (the first ones; the count is always printed)."""


class Check:
    """One differential check: counts the cases, records the first mismatches."""

    def __init__(self, name: str, domain: str, models: Sequence[str]) -> None:
        self.name, self.domain, self.models = name, domain, list(models)
        self.cases = 0
        self.mismatches: list[str] = []
        self.notes: list[str] = []

    def same(self, case: Any, code: Any, encoding: Any) -> None:
        self.cases += 1
        if code != encoding:
            self.mismatches.append(f"{case}: code {code!r}, encoding {encoding!r}")

    def report(self, elapsed: float) -> bool:
        if not self.mismatches:
            note = f"; {', '.join(self.notes)}" if self.notes else ""
            print(f"agrees {self.name} ({self.domain}{note}) on {self.cases} cases models={json.dumps(self.models)}"
                  f" in {elapsed:.1f} s", flush=True)
            return True
        for line in self.mismatches[:MAX_SHOWN]:
            print(f"MISMATCH {self.name}: {line}", flush=True)
        print(f"MISMATCH {self.name}: {len(self.mismatches)} of {self.cases} cases disagree", flush=True)
        return False


# ---------------------------------------------------------------------------------------------
# Inputs


def grid_boxes(ndim: int, origins: range, extents: range) -> list[Box]:
    """Every box whose origin and extent on each axis come from the given ranges."""
    axis = [(o, e) for o in origins for e in extents]
    return [Box(tuple(o for o, _ in pick), tuple(e for _, e in pick)) for pick in itertools.product(axis, repeat=ndim)]


def random_box(rng: random.Random, ndim: int, span: int = 6, low: int = -2) -> Box:
    return Box(tuple(rng.randint(-span, span) for _ in range(ndim)), tuple(rng.randint(low, span) for _ in range(ndim)))


def box_pairs(rng: random.Random, drawn: int) -> Iterator[tuple[Box, Box]]:
    """Every pair of a 1-D and a 2-D domain (zero and negative extents included), then drawn
    pairs in up to 8 axes."""
    one = grid_boxes(1, range(-2, 3), range(-1, 4))
    yield from itertools.product(one, one)
    two = grid_boxes(2, range(-1, 2), range(-1, 3))
    yield from itertools.product(two, two)
    for i in range(drawn):
        ndim = 1 + i % 8
        yield random_box(rng, ndim), random_box(rng, ndim)


def points(box: Box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(o, o + e) for o, e in zip(box.origin, box.extent))))


class Encoding:
    """Box-valued encodings compiled once per number of axes and boxes."""

    def __init__(self, build: Callable[[list[SymBox]], list[z3.ExprRef]], boxes: int,
                 extra: Callable[[int], list[z3.ArithRef]] | None = None) -> None:
        self.build, self.boxes, self.extra = build, boxes, extra
        self.compiled: dict[int, Callable[..., tuple[Any, ...]]] = {}

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        boxes = args[: self.boxes]
        ndim = boxes[0].ndim
        fn = self.compiled.get(ndim)
        if fn is None:
            syms = [SymBox(f"X{i}", ndim) for i in range(self.boxes)]
            extra = self.extra(ndim) if self.extra else []
            variables = [v for s in syms for v in (*s.origin, *s.extent)] + extra
            fn = self.compiled[ndim] = compile_terms(variables, self.build(syms + extra))  # type: ignore[operator]
        flat = [v for b in boxes for v in (*b.origin, *b.extent)]
        return fn(*flat, *args[self.boxes:])


def _unbox(values: Sequence[Any], ndim: int) -> Box:
    return Box(tuple(values[:ndim]), tuple(values[ndim: 2 * ndim]))


# ---------------------------------------------------------------------------------------------
# Box algebra (boxes.py, tiling.py)


def check_intersect(rng: random.Random) -> Check:
    check = Check("differential.box_intersect", "every pair of 625 1-D and 20736 2-D pairs, 3000 drawn n<=8",
                  ["refplan.box.Box.intersect", "refplan.box.Box.overlaps"])

    def build(syms: list[Any]) -> list[z3.ExprRef]:
        present, box = intersect_model(syms[0], syms[1])
        return [present, *box.origin, *box.extent, overlaps_model(syms[0], syms[1])]

    model = Encoding(build, 2)
    for a, b in box_pairs(rng, 3000):
        out = model(a, b)
        want = _unbox(out[1:], a.ndim) if out[0] else None
        check.same(("intersect", a, b), a.intersect(b), want)
        check.same(("overlaps", a, b), a.overlaps(b), out[-1])
    return check


def check_subtract(rng: random.Random) -> Check:
    check = Check("differential.box_subtract", "every pair of 625 1-D and 20736 2-D pairs, 3000 drawn n<=8",
                  ["refplan.box.Box.subtract"])

    def build(syms: list[Any]) -> list[z3.ExprRef]:
        return [t for guard, piece in subtract_model(syms[0], syms[1]) for t in (guard, *piece.origin, *piece.extent)]

    model = Encoding(build, 2)
    for a, b in box_pairs(rng, 3000):
        out = model(a, b)
        step = 1 + 2 * a.ndim
        want = [_unbox(out[i + 1: i + step], a.ndim) for i in range(0, len(out), step) if out[i]]
        check.same(("subtract", a, b), a.subtract(b), want)
    return check


def check_split_contains(rng: random.Random) -> Check:
    check = Check("differential.box_split_contains", "every box of 1-D and 2-D domains, every cut; every pair of "
                  "positive 1-D and 2-D boxes", ["refplan.box.Box.split", "refplan.box.Box.contains",
                                                 "refplan.box.Box.overlaps"])
    at = z3.Int("cut")
    splits = {}
    for ndim in (1, 2, 3):
        for axis in range(ndim):
            box = SymBox("B", ndim)
            left, right = split_model(box, axis, at)
            splits[ndim, axis] = compile_terms([*box.origin, *box.extent, at],
                                               [*left.origin, *left.extent, *right.origin, *right.extent])
    boxes = grid_boxes(1, range(-2, 3), range(1, 6)) + grid_boxes(2, range(-1, 2), range(1, 4))
    boxes += [random_box(rng, 3, low=1) for _ in range(200)]
    for box in boxes:
        for axis in range(box.ndim):
            lo, hi = box.origin[axis], box.end[axis]
            for cut in range(lo - 1, hi + 2):
                try:
                    got: Any = box.split(axis, cut)
                except ValueError:
                    got = "refused"
                out = splits[box.ndim, axis](*box.origin, *box.extent, cut)
                # the claim's premise "cut strictly inside on the axis" is when the code must cut
                want = (_unbox(out, box.ndim), _unbox(out[2 * box.ndim:], box.ndim)) if lo < cut < hi else "refused"
                check.same(("split", box, axis, cut), got, want)
    # ``SymBox.inside`` and ``SymBox.disjoint`` are the containment and separation premises of every
    # tiling claim; on positive boxes they are ``Box.contains`` and ``not Box.overlaps``
    inside = Encoding(lambda s: [s[0].inside(s[1]), s[0].disjoint(s[1])], 2)
    positive = grid_boxes(1, range(-2, 3), range(1, 4)) + grid_boxes(2, range(-1, 2), range(1, 3))
    for a, b in itertools.product(positive, positive):
        if a.ndim == b.ndim:
            contained, apart = inside(a, b)
            check.same(("contains", b, a), b.contains(a), contained)
            check.same(("separated", a, b), not a.overlaps(b), apart)
    return check


# ---------------------------------------------------------------------------------------------
# The pair test and the array arithmetic of Premise C (boxes.py, answers.py)


def check_pair_array(rng: random.Random) -> Check:
    check = Check("differential.pair_array",
                  "every pair of a 2-D domain one by one; whole 1-D, 2-D, 3-D domains at once, with and without "
                  "groups; 300 drawn sets of 40 boxes", ["refplan.box.overlapping_pair_array"])
    model = Encoding(lambda s: [pair_model(s[0], s[1])], 2)
    two = grid_boxes(2, range(-1, 2), range(-1, 3))
    for i, a in enumerate(two):
        for b in two[i:]:
            check.same(("pair", a, b), overlapping_pair_array([a, b]).tolist() != [], model(a, b)[0])

    def whole(domain: list[Box], groups: list[int] | None) -> None:
        got = overlapping_pair_array(domain, groups=groups).tolist()
        want = [[i, j] for i, j in itertools.combinations(range(len(domain)), 2)
                if model(domain[i], domain[j])[0] and (groups is None or groups[i] != groups[j])]
        check.same(("set", len(domain), "grouped" if groups else "ungrouped"), got, want)

    domains = [grid_boxes(1, range(-2, 6), range(-1, 5)), two, grid_boxes(3, range(0, 2), range(0, 3))]
    for _ in range(300):
        ndim = rng.randint(1, 4)
        domains.append([random_box(rng, ndim, span=8, low=-1) for _ in range(40)])
    for domain in domains:
        whole(domain, None)
        whole(domain, [rng.randint(0, 1) for _ in domain])
    return check


def tilings(shape: tuple[int, ...]) -> list[list[Box]]:
    """Every tiling of ``[0, shape)`` by boxes, each listed once."""
    out: list[list[Box]] = []

    def fill(free: frozenset[tuple[int, ...]], chosen: list[Box]) -> None:
        if not free:
            out.append(list(chosen))
            return
        first = min(free)
        for extent in itertools.product(*(range(1, s - c + 1) for s, c in zip(shape, first))):
            box = Box(first, extent)
            pts = points(box)
            if pts <= free:
                fill(free - pts, [*chosen, box])

    fill(frozenset(itertools.product(*(range(s) for s in shape))), [])
    return out


def random_tiling(rng: random.Random, shape: tuple[int, ...], cuts: int) -> list[Box]:
    """A guillotine tiling of ``[0, shape)``: ``cuts`` random cuts of random tiles."""
    tiles = [Box((0,) * len(shape), shape)]
    for _ in range(cuts):
        k = rng.randrange(len(tiles))
        box = tiles[k]
        axes = [d for d in range(box.ndim) if box.extent[d] >= 2]
        if not axes:
            continue
        axis = rng.choice(axes)
        tiles[k:k + 1] = box.split(axis, rng.randint(box.origin[axis] + 1, box.end[axis] - 1))
    return tiles


def tiled_map(shape: tuple[int, ...], tiles: list[Box], whole: int | None = None) -> ParamAffineMap:
    """Each tile on its own location (0, 1, ...), as that location's whole shard; with ``whole``,
    location ``whole`` also holds every tile, each as a piece of a shard of shape F (so one
    region has holders with different strides and shifts)."""
    strides = row_major_strides(shape)
    shards: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    for k, tile in enumerate(tiles):
        offset = sum(o * s for o, s in zip(tile.origin, strides))
        holders = [k] if whole is None else [k, whole]
        shards[k] = tile.extent
        pieces[k] = [AffinePiece(tile.extent, offset, strides, 0, row_major_strides(tile.extent), holders)]
        if whole is not None:
            shards[whole] = shape
            pieces.setdefault(whole, []).append(AffinePiece(tile.extent, offset, strides, offset, strides, holders))
    return ParamAffineMap(shape, shards, pieces)


@contextmanager
def array_min_pieces(value: int) -> Iterator[None]:
    saved = limits.ARRAY_MIN_PIECES
    limits.ARRAY_MIN_PIECES = value
    try:
        yield
    finally:
        limits.ARRAY_MIN_PIECES = saved


def check_intersections(rng: random.Random) -> Check:
    """``regions.intersections`` has two paths: the int64 array arithmetic (``overlapping_pair_array``
    and max/min on arrays) and, for few boxes, a sorted slab join. Both are run on every input,
    the first by lowering ``limits.ARRAY_MIN_PIECES`` to 0, the second by calling it directly
    where its slab join applies; each must return exactly the parts the encoding
    (``pair_model``, ``array_part_model``) gives, in (location, origin) order."""
    check = Check("differential.intersections",
                  "every pair of tilings of F = (5), (2, 3); 1500 pairs of tilings of (2, 2, 2); 300 drawn "
                  "guillotine pairs up to 4 axes", ["refplan.regions.intersections",
                                                    "refplan.box.overlapping_pair_array"])

    def build(syms: list[Any]) -> list[z3.ExprRef]:
        part = array_part_model(syms[0], syms[1])
        return [pair_model(syms[0], syms[1]), *part.origin, *part.extent]

    model = Encoding(build, 2)
    paths = {"array": 0, "slab": 0}

    def compare(shape: tuple[int, ...], s_map: Any, t_map: Any) -> None:
        target = t_map
        regions = s_map
        want = []
        for frame in target.frames:
            for region in regions:
                out = model(frame.box, region.box)
                if out[0]:
                    want.append((frame.location, _unbox(out[1:], len(shape)), region.box))
        want.sort(key=lambda w: (w[0], w[1]))
        with array_min_pieces(0):
            got = [(x.target.location, x.box, x.region.box) for x in intersections(target, regions, WorkCounter())]
        paths["array"] += 1
        check.same(("array path", shape, [f.box for f in target.frames], [r.box for r in regions]), got, want)
        small = _small_intersections(target, regions, WorkCounter())
        if small is not None:
            paths["slab"] += 1
            got = [(x.target.location, x.box, x.region.box) for x in small]
            check.same(("slab path", shape, [f.box for f in target.frames], [r.box for r in regions]), got, want)

    def prepared(shape: tuple[int, ...], tiles: list[Box]) -> tuple[Any, Any]:
        m = tiled_map(shape, tiles)
        return source_regions(normalize(m, "source", "w"), WorkCounter()), normalize(m, "target", "w")

    for shape in ((5,), (2, 3)):
        maps = [prepared(shape, t) for t in tilings(shape)]
        for (regions, _), (_, target) in itertools.product(maps, maps):
            compare(shape, regions, target)
    cube = [prepared((2, 2, 2), t) for t in tilings((2, 2, 2))]
    for _ in range(1500):
        compare((2, 2, 2), rng.choice(cube)[0], rng.choice(cube)[1])
    for i in range(300):
        shape = tuple(rng.randint(1, 6) for _ in range(1 + i % 4))
        regions = prepared(shape, random_tiling(rng, shape, rng.randint(0, 8)))[0]
        target = prepared(shape, random_tiling(rng, shape, rng.randint(0, 8)))[1]
        compare(shape, regions, target)
    check.notes.append(f"array path {paths['array']} times, slab path {paths['slab']} times")
    if not paths["slab"] or not paths["array"]:
        check.mismatches.append(f"a path was never taken: {paths}")
    return check


# ---------------------------------------------------------------------------------------------
# The checks of check_answers (answers.py)


def _request(box: Box, candidates: Sequence[int] = (3,)) -> ReplicaRequest:
    """A request for ``box`` held by ``candidates``, each at a layout of its own (offset 17·i,
    strides times i+1): a checker that read a part with another holder's layout (the first
    candidate's, say) then differs from the one it names, which equal layouts would hide."""
    strides = row_major_strides(box.extent) if all(e > 0 for e in box.extent) else (1,) * box.ndim
    cands = tuple(ReplicaCandidate(loc, 17 * i, tuple(s * (i + 1) for s in strides))
                  for i, loc in enumerate(candidates))
    return ReplicaRequest("w", 0, None, box.origin, box.extent, 0, strides, cands, (None,) * len(cands), None)


_HOLDERS = (3, 5, 7)
"""The holders of ``check_split_checks``' requests: each part is served by one of them."""


def check_split_checks(rng: random.Random) -> Check:
    check = Check("differential.check_answers",
                  "every split of up to 3 parts of a 1-D domain, up to 2 of a 2-D one; 4000 drawn splits up to "
                  "12 parts in up to 3 axes; 3 holders at distinct layouts, each part served by one, and every "
                  "accepted part resolved to the layout of the holder it names", ["refplan.check.check_answers"])
    compiled: dict[tuple[int, int], Callable[..., tuple[Any, ...]]] = {}

    def accepts(request: Box, parts: list[Box]) -> bool:
        key = (request.ndim, len(parts))
        fn = compiled.get(key)
        if fn is None:
            q = SymBox("Q", request.ndim)
            syms = [SymBox(f"P{i}", request.ndim) for i in range(len(parts))]
            variables = [v for s in (q, *syms) for v in (*s.origin, *s.extent)]
            fn = compiled[key] = compile_terms(variables, [z3.And(*split_checks_model(q, syms).values())])
        flat = [v for b in (request, *parts) for v in (*b.origin, *b.extent)]
        return bool(fn(*flat)[0])

    def code(request: Box, parts: list[Box], holders: list[int]) -> bool:
        answer = [ReplicaPart(p.origin, p.extent, loc) for p, loc in zip(parts, holders)]
        asked = _request(request, _HOLDERS)
        try:
            resolved = check_answers([asked], [answer], min_split_bytes=1)
        except InvalidReplicaPolicyError:
            return False
        # Accepted: each part is read with the layout of the holder it names (Theorem 3's premise
        # "A: layout of the chosen candidate"), never another holder's.
        layout = {c.source_rank: (c.source_rank, c.source_offset, c.source_strides) for c in asked.candidates}
        got = [(box, (c.source_rank, c.source_offset, c.source_strides)) for box, c in resolved[0]]
        check.same(("resolved", request, parts, holders), got, [(p, layout[loc]) for p, loc in zip(parts, holders)])
        return True

    def one(request: Box, parts: list[Box], holders: list[int] | None = None) -> None:
        served = holders if holders is not None else [_HOLDERS[(k + 1) % len(_HOLDERS)] for k in range(len(parts))]
        check.same(("split", request, parts), code(request, parts, served), accepts(request, parts))

    q1 = Box((0,), (4,))
    dom1 = grid_boxes(1, range(-1, 5), range(-1, 5))
    for k in (1, 2, 3):
        for parts in itertools.product(dom1, repeat=k):
            one(q1, list(parts))
    q2 = Box((0, 0), (2, 3))
    dom2 = grid_boxes(2, range(-1, 2), range(0, 3))
    for k in (1, 2):
        for parts in itertools.product(dom2, repeat=k):
            one(q2, list(parts))
    for i in range(4000):
        ndim = 1 + i % 3
        request = Box(tuple(rng.randint(-3, 3) for _ in range(ndim)), tuple(rng.randint(1, 6) for _ in range(ndim)))
        parts = random_tiling(rng, request.extent, rng.randint(0, 11))
        parts = [Box(tuple(o + r for o, r in zip(p.origin, request.origin)), p.extent) for p in parts]
        for _ in range(rng.randint(0, 2)):  # nudge: move, grow, shrink, drop or duplicate a part
            k = rng.randrange(len(parts))
            kind = rng.randrange(5)
            p = parts[k]
            axis = rng.randrange(ndim)
            delta = rng.choice((-1, 1))
            if kind == 0:
                parts[k] = Box(tuple(o + (delta if d == axis else 0) for d, o in enumerate(p.origin)), p.extent)
            elif kind in (1, 2):
                parts[k] = Box(p.origin, tuple(e + (delta if d == axis else 0) for d, e in enumerate(p.extent)))
            elif kind == 3 and len(parts) > 1:
                del parts[k]
            else:
                parts.append(p)
        one(request, parts, [rng.choice(_HOLDERS) for _ in parts])
    # an int answer naming a candidate is the one-part split "the whole box"
    for request in grid_boxes(2, range(-1, 2), range(1, 3)):
        asked = _request(request, (3, 5))
        resolved = check_answers([asked], [5], min_split_bytes=1)
        check.same(("int answer", request), [(box, cand) for box, cand in resolved[0]],
                   [(request, asked.candidates[1])])
    return check


# ---------------------------------------------------------------------------------------------
# Coalescing (coalesce.py)


def shard_boxes(shape: tuple[int, ...]) -> list[Box]:
    return [b for b in grid_boxes(len(shape), range(0, max(shape)), range(1, max(shape) + 1))
            if all(o + e <= s for o, e, s in zip(b.origin, b.extent, shape))]


def check_coalesce(rng: random.Random) -> Check:
    """``coalesce`` on two segments of one (source, target, strides) group: it merges them exactly
    when, on some axis, ``coalesce.adjacency`` holds one way round and ``coalesce.merge_guard``
    holds on *both* sides, and the merged segment keeps the first one's offsets with the
    ``merged_extent``. Segments are boxes of their shards with row-major strides (what ``_emit``
    makes of validated frames), with every placement in small shards and drawn ones."""
    check = Check("differential.coalesce", "every pair of segments between small 1-D and 2-D shards; 6000 drawn",
                  ["refplan.plan.coalesce"])
    compiled: dict[tuple[int, int], Callable[..., tuple[Any, ...]]] = {}

    def merges(x: tuple[Any, ...], y: tuple[Any, ...], axis: int, s_shape: tuple[int, ...],
               t_shape: tuple[int, ...]) -> bool:
        ndim = len(s_shape)
        fn = compiled.get((ndim, axis))
        if fn is None:
            ss, ts = ints("ss", ndim), ints("ts", ndim)
            a_src, a_dst, b_src, b_dst = z3.Ints("a.src a.dst b.src b.dst")
            a_ext, b_ext = ints("a.e", ndim), ints("b.e", ndim)
            s_start, t_start = ints("sc", ndim), ints("tc", ndim)
            s_sh, t_sh = ints("S", ndim), ints("T", ndim)
            m_ext = merged_extent(a_ext, b_ext, axis)
            rule = z3.And(*adjacency(a_src, a_dst, a_ext, b_src, b_dst, b_ext, ss, ts, axis).values(),
                          merge_guard(s_start, m_ext, s_sh, axis), merge_guard(t_start, m_ext, t_sh, axis))
            fn = compiled[ndim, axis] = compile_terms(
                [*ss, *ts, a_src, a_dst, b_src, b_dst, *a_ext, *b_ext, *s_start, *t_start, *s_sh, *t_sh], [rule])
        (xs, xt, xe, xsc, xtc), (ys, yt, ye, _, _) = x, y
        args = [*row_major_strides(s_shape), *row_major_strides(t_shape), xs, xt, ys, yt, *xe, *ye, *xsc, *xtc,
                *s_shape, *t_shape]
        return bool(fn(*args)[0])

    def segment(s_shape: tuple[int, ...], t_shape: tuple[int, ...], s_box: Box, t_origin: tuple[int, ...]) -> Any:
        s_off = sum(map(lambda c, s: c * s, s_box.origin, row_major_strides(s_shape)))
        t_off = sum(map(lambda c, s: c * s, t_origin, row_major_strides(t_shape)))
        return (s_off, t_off, s_box.extent, s_box.origin, t_origin)

    def one(s_shape: tuple[int, ...], t_shape: tuple[int, ...], a: Any, b: Any) -> None:
        ss, ts = row_major_strides(s_shape), row_major_strides(t_shape)
        segs = [make_segment(1, s[0], ss, 2, s[1], ts, s[2]) for s in (a, b)]
        got, _ = coalesce(segs, {1: s_shape}, {2: t_shape}, PlanBudget())
        ordered = sorted([a, b], key=lambda s: (s[1], s[0], s[2]))  # coalesce's order: target, source, shape
        want = sorted(segs, key=TransferSegment.sort_key)
        for axis, (x, y) in itertools.product(range(len(s_shape)), [ordered, ordered[::-1]]):
            if merges(x, y, axis, s_shape, t_shape):
                want = [make_segment(1, x[0], ss, 2, x[1], ts, tuple(merged_extent(list(x[2]), list(y[2]), axis)))]
                break
        check.same(("coalesce", s_shape, t_shape, a, b), got, want)

    def placements(s_shape: tuple[int, ...], t_shape: tuple[int, ...]) -> list[Any]:
        t_boxes = shard_boxes(t_shape)
        return [segment(s_shape, t_shape, s, t.origin) for s in shard_boxes(s_shape) for t in t_boxes
                if t.extent == s.extent]

    for s_shape, t_shape in [((4,), (3,)), ((2, 4), (2, 3)), ((2, 3), (2, 4)), ((3, 2), (2, 2))]:
        segs = placements(s_shape, t_shape)
        for a, b in itertools.combinations(segs, 2):
            if a[:2] != b[:2]:  # two segments starting at the same addresses are no plan's
                one(s_shape, t_shape, a, b)
    for _ in range(6000):
        ndim = rng.randint(1, 3)
        s_shape = tuple(rng.randint(1, 5) for _ in range(ndim))
        t_shape = tuple(rng.randint(1, 5) for _ in range(ndim))
        extent = tuple(rng.randint(1, min(s, t)) for s, t in zip(s_shape, t_shape))
        a_s = tuple(rng.randint(0, s - e) for s, e in zip(s_shape, extent))
        a_t = tuple(rng.randint(0, t - e) for t, e in zip(t_shape, extent))
        a = segment(s_shape, t_shape, Box(a_s, extent), a_t)
        # b starts where a ends on both sides along some axis, so merges are common
        axis = rng.randrange(ndim)
        ss, ts = row_major_strides(s_shape), row_major_strides(t_shape)
        b_s_off, b_t_off = a[0] + extent[axis] * ss[axis], a[1] + extent[axis] * ts[axis]
        b_s, b_t = decode_row_major(b_s_off, s_shape), decode_row_major(b_t_off, t_shape)
        if b_s is None or b_t is None:
            continue
        b_ext = tuple(rng.randint(1, min(s - c, t - d)) if min(s - c, t - d) >= 1 else 0
                      for s, c, t, d in zip(s_shape, b_s, t_shape, b_t))
        if min(b_ext) < 1:
            continue
        if rng.random() < 0.7:  # keep the other extents equal, as a mergeable partner has them
            b_ext = tuple(e if d == axis else extent[d] for d, e in enumerate(b_ext))
            if any(c + e > s for c, e, s in zip(b_s, b_ext, s_shape)) or any(
                    c + e > t for c, e, t in zip(b_t, b_ext, t_shape)):
                continue
        one(s_shape, t_shape, a, segment(s_shape, t_shape, Box(b_s, b_ext), b_t))
    return check


# ---------------------------------------------------------------------------------------------
# Emission and addresses (theorem3.py, addresses.py)


def check_emit(rng: random.Random) -> Check:
    """``planner._emit`` on requests with arbitrary offsets and strides (the model has symbolic
    ones) and answers of one part or several: each segment is ``theorem3.emit_model``'s, with the
    candidate's location and strides, the request's target location and strides, the part's
    extent."""
    check = Check("differential.emit", "every part of small 1-D requests; 3000 drawn requests up to 4 axes",
                  ["refplan.planner._emit", "refplan.planner._row_segments"])
    compiled: dict[int, Callable[..., tuple[Any, ...]]] = {}

    def model(request: ReplicaRequest, cand: ReplicaCandidate, part: Box) -> TransferSegment:
        ndim = len(request.logical_origin)
        fn = compiled.get(ndim)
        if fn is None:
            q, ts, rs, p = ints("q", ndim), ints("ts", ndim), ints("rs", ndim), ints("p", ndim)
            toff, roff = z3.Ints("toff roff")
            fn = compiled[ndim] = compile_terms([*q, toff, *ts, roff, *rs, *p],
                                                list(emit_model(q, toff, ts, roff, rs, p)))
        src, dst = fn(*request.logical_origin, request.target_offset, *request.target_strides, cand.source_offset,
                      *cand.source_strides, *part.origin)
        return make_segment(cand.source_rank, src, cand.source_strides, request.target_location, dst,
                            request.target_strides, part.extent)

    def one(requests: list[ReplicaRequest], answers: list[tuple[tuple[Box, ReplicaCandidate], ...]]) -> None:
        got = _emit(_Prepared("w", None, requests, False, None), answers)  # type: ignore[arg-type]
        want = [model(r, c, p) for r, parts in zip(requests, answers) for p, c in parts]
        check.same(("emit", requests, answers), got, want)
        if all(len(parts) == 1 and parts[0][0] == r.box for r, parts in zip(requests, answers)):
            # Whole answers: the rows' path makes the same segments from slabs (the request's
            # geometry, the candidate's read address) and the chosen locations.
            slabs = [(r.target_location, r.logical_origin, r.shape, r.target_offset, r.target_strides,
                      (parts[0][1].source_offset, parts[0][1].source_strides), prod(r.shape), r.locations)
                     for r, parts in zip(requests, answers)]
            chosen = [parts[0][1].source_rank for parts in answers]
            check.same(("rows", requests, answers), _row_segments(chosen, slabs), want)

    for q_origin, t_stride, c_stride, t_off, c_off in itertools.product((0, 3), (1, 2, -1), (1, 3), (0, 7), (0, 5)):
        request = ReplicaRequest("w", 4, None, (q_origin,), (4,), t_off, (t_stride,),
                                 (ReplicaCandidate(9, c_off, (c_stride,)),), (None,), None)
        for lo in range(q_origin, q_origin + 4):
            for hi in range(lo + 1, q_origin + 5):
                one([request], [((Box((lo,), (hi - lo,)), request.candidates[0]),)])
    for _ in range(3000):
        ndim = rng.randint(1, 4)
        requests, answers = [], []
        for _ in range(rng.randint(1, 3)):
            origin = tuple(rng.randint(-5, 5) for _ in range(ndim))
            shape = tuple(rng.randint(1, 5) for _ in range(ndim))
            cands = tuple(ReplicaCandidate(rng.randint(0, 9), rng.randint(0, 50),
                                           tuple(rng.randint(-4, 9) for _ in range(ndim)))
                          for _ in range(rng.randint(1, 3)))
            request = ReplicaRequest("w", rng.randint(0, 5), None, origin, shape, rng.randint(0, 50),
                                     tuple(rng.randint(-4, 9) for _ in range(ndim)), cands, (None,) * len(cands), None)
            tiles = random_tiling(rng, shape, rng.randint(0, 4))
            parts = tuple((Box(tuple(o + r for o, r in zip(t.origin, origin)), t.extent), rng.choice(cands))
                          for t in tiles)
            requests.append(request)
            answers.append(parts)
        one(requests, answers)
    return check


def check_addresses(rng: random.Random) -> Check:
    """Row-major strides, decoding, ``Frame.address`` and the offsets ``build_requests`` gives a
    request and each candidate, against ``kit.row_major`` and ``addresses.frame_start_model`` /
    ``theorem3.candidate_offset_model``, on real validated maps: every pair of tilings of small
    F where one location also holds every tile in a shard of shape F (so a region's holders
    differ in strides and shift)."""
    check = Check("differential.addresses", "every shape up to 4 axes of extent <= 4 and its coordinates; every "
                  "request of every pair of tilings of (5), (2, 3); 200 drawn pairs up to 3 axes",
                  ["refplan.box.row_major_strides", "refplan.box.decode_row_major", "refplan.frames.Frame.address",
                   "refplan.requests.build_requests"])
    for ndim in range(1, 5):
        shape_vars = ints("s", ndim)
        coord = ints("c", ndim)
        strides_fn = compile_terms(shape_vars, row_major(shape_vars))
        address_fn = compile_terms([*shape_vars, *coord], [dot(coord, row_major(shape_vars))])
        for shape in itertools.product(range(1, 5), repeat=ndim):
            check.same(("row_major_strides", shape), row_major_strides(shape), strides_fn(*shape))
            for c in itertools.product(*(range(s) for s in shape)):
                # the address of every coordinate in the shard decodes back to it (row_major_range,
                # row_major_injective), and nothing at or past numel decodes
                check.same(("decode", shape, c), decode_row_major(address_fn(*shape, *c)[0], shape), c)
            numel = 1
            for s in shape:
                numel *= s
            check.same(("decode outside", shape), [decode_row_major(o, shape) for o in (-1, numel)], [None, None])
    compiled: dict[int, Callable[..., tuple[Any, ...]]] = {}

    def start(local: Sequence[int], logical: Sequence[int], sub: Sequence[int], strides: Sequence[int]) -> int:
        ndim = len(local)
        fn = compiled.get(ndim)
        if fn is None:
            lo, g, x, st = ints("L", ndim), ints("G", ndim), ints("X", ndim), ints("st", ndim)
            fn = compiled[ndim] = compile_terms([*lo, *g, *x, *st], [frame_start_model(lo, g, x, st)])
        return int(fn(*local, *logical, *sub, *strides)[0])

    def moved(holder: int, region: Sequence[int], sub: Sequence[int], strides: Sequence[int]) -> int:
        ndim = len(region)
        key = -ndim
        fn = compiled.get(key)
        if fn is None:
            h, r, q, st = z3.Int("h"), ints("R", ndim), ints("Q", ndim), ints("st", ndim)
            fn = compiled[key] = compile_terms([h, *r, *q, *st], [candidate_offset_model(h, r, q, st)])
        return int(fn(holder, *region, *sub, *strides)[0])

    def layout(shape: tuple[int, ...], s_tiles: list[Box], t_tiles: list[Box]) -> None:
        whole = len(s_tiles) + len(t_tiles) + 10
        source = normalize(tiled_map(shape, s_tiles, whole), "source", "w")
        target = normalize(tiled_map(shape, t_tiles, whole), "target", "w")
        for frame in (*source.frames, *target.frames):
            sub = Box(frame.box.origin, frame.box.extent)
            check.same(("Frame.address", frame.location, frame.box), frame.address(sub),
                       start(frame.local.origin, frame.box.origin, sub.origin, frame.strides))
            check.same(("frame strides", frame.location), frame.strides, row_major_strides(frame.shard_shape))
        inters = intersections(target, source_regions(source, WorkCounter()), WorkCounter())
        for x, request in zip(inters, build_requests("w", inters)):
            f = x.target
            check.same(("request target offset", f.box, x.box), request.target_offset,
                       start(f.local.origin, f.box.origin, x.box.origin, f.strides))
            want = []
            for h in x.region.holders:
                at_region = start(h.local.origin, h.box.origin, x.region.box.origin, h.strides)
                want.append((h.location, moved(at_region, x.region.box.origin, x.box.origin, h.strides), h.strides))
            got = [(c.source_rank, c.source_offset, c.source_strides) for c in request.candidates]
            check.same(("candidates", x.region.box, x.box), got, want)

    for shape in ((5,), (2, 3)):
        every = tilings(shape)
        for s_tiles, t_tiles in itertools.product(every, every):
            layout(shape, s_tiles, t_tiles)
    for i in range(200):
        shape = tuple(rng.randint(1, 5) for _ in range(1 + i % 3))
        layout(shape, random_tiling(rng, shape, rng.randint(0, 6)), random_tiling(rng, shape, rng.randint(0, 6)))
    return check


# ---------------------------------------------------------------------------------------------
# Slab tilings (slabs.py)


def check_slabs(rng: random.Random) -> Check:
    """``box.separated`` decides ``slabs.slab_model`` (some axis separates every pair, the
    premise of the slab sweep) on non-empty boxes; ``box.covers`` finds a hole exactly when some
    point of the cell lies in no box (the pointwise conclusion the sweep proves for slabs)."""
    check = Check("differential.slabs", "every set of up to 3 boxes of a 1-D domain, up to 2 of a 2-D one; 3000 "
                  "drawn sets up to 3 axes", ["refplan.box.separated", "refplan.box.covers"])
    compiled: dict[tuple[int, int], Callable[..., tuple[Any, ...]]] = {}

    def slab(boxes: list[Box]) -> bool:
        ndim = boxes[0].ndim
        fn = compiled.get((ndim, len(boxes)))
        if fn is None:
            syms = [SymBox(f"P{i}", ndim) for i in range(len(boxes))]
            fn = compiled[ndim, len(boxes)] = compile_terms(
                [v for s in syms for v in (*s.origin, *s.extent)], [z3.Or(*[slab_model(syms, d) for d in range(ndim)])])
        return bool(fn(*[v for b in boxes for v in (*b.origin, *b.extent)])[0])

    def one(cell: Box, boxes: list[Box]) -> None:
        lo = [b.origin for b in boxes]
        hi = [b.end for b in boxes]
        import numpy as np

        got = separated(np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64))
        check.same(("separated", boxes), got, slab(boxes) if len(boxes) >= 2 else True)
        hole = covers(cell, boxes)
        covered = set().union(*(points(b) for b in boxes))
        check.same(("covers", cell, boxes), hole is None, points(cell) <= covered)
        if hole is not None:
            check.same(("covers hole", cell, boxes), bool(points(hole)) and not (points(hole) & covered)
                       and points(hole) <= points(cell), True)

    dom1 = grid_boxes(1, range(0, 4), range(1, 4))
    for k in (1, 2, 3):
        for boxes in itertools.product(dom1, repeat=k):
            one(Box((0,), (4,)), list(boxes))
    dom2 = grid_boxes(2, range(0, 2), range(1, 3))
    for k in (1, 2):
        for boxes in itertools.product(dom2, repeat=k):
            one(Box((0, 0), (2, 3)), list(boxes))
    for i in range(3000):
        ndim = 1 + i % 3
        cell = Box((0,) * ndim, tuple(rng.randint(1, 5) for _ in range(ndim)))
        tiles = random_tiling(rng, cell.extent, rng.randint(0, 6))
        if rng.random() < 0.5 and len(tiles) > 1:
            del tiles[rng.randrange(len(tiles))]
        one(cell, tiles)
    return check


CHECKS = (check_intersect, check_subtract, check_split_contains, check_pair_array, check_intersections,
          check_split_checks, check_coalesce, check_emit, check_addresses, check_slabs)


def main() -> int:
    ok = True
    for index, make in enumerate(CHECKS):
        start = time.perf_counter()
        check = make(random.Random(SEED + index))
        ok &= check.report(time.perf_counter() - start)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
