"""The box tiling lemma and the linear facts around it (``proofs/theorem3.md`` §3.1).

Lemma (tiling). Let B be a box and P_1..P_k boxes with positive extents, each inside B, pairwise
disjoint (some axis separates every pair), whose volumes sum to vol(B). Then every integer point
of B lies in exactly one P_i, and no P_i has a point outside B.

The general lemma is proved on paper by counting (theorem3.md). Volumes are products, so the
general statement is nonlinear integer arithmetic, where z3 has no complete procedure; what is
mechanized here, and how far:

* 1 axis, every k: by induction over the parts in sorted order (base, step and end are three
  linear queries; the ordering fact is a fourth), plus direct bounded instances as a cross-check.
* n axes, k = 2 parts, n <= 5; n = 2 axes, k = 3 parts: direct, symbolic coordinates, with the
  disjunction "some axis separates each pair" split into its exhaustive cases.
* guillotine split, n <= 8 axes, one claim per axis: cutting a positive box strictly inside on
  that one axis (other extents may be 1) gives two boxes that tile it; with the refinement lemma
  (an exact cover of the parts of an exact cover is an exact cover of the whole) and induction
  over the cut tree, which is the paper step, this covers every guillotine tiling, any k, n <= 8.
* slab tilings (one axis separates every pair), n <= 8 axes, every k: ``slabs.py``.
* disjointness: "some axis separates" is exactly "no common integer point", n <= 8.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import z3
from kit import (
    Claim,
    SymBox,
    count,
    ints,
    main,
    pairwise_disjoint,
    separation_cases,
    show_boxes,
    show_ints,
)

MAX_AXES = 8


def disjoint_iff_no_common_point(n: int) -> Iterator[Claim]:
    a, b = SymBox("A", n), SymBox("B", n)
    p = ints("p", n)
    yield Claim(
        f"tiling.separated_has_no_common_point[n={n}]", f"n={n}",
        {"separated": a.disjoint(b), "p in A": a.has(p)},
        z3.Not(b.has(p)),
        ["separated"], show_boxes(a, b, p=p),
    )
    witness = [z3.If(x >= y, x, y) for x, y in zip(a.origin, b.origin)]
    yield Claim(
        f"tiling.unseparated_has_common_point[n={n}]", f"n={n}",
        {"A positive": a.positive(), "B positive": b.positive(), "not separated": z3.Not(a.disjoint(b))},
        {"max of the origins lies in A": a.has(witness), "max of the origins lies in B": b.has(witness)},
        ["A positive", "not separated"], show_boxes(a, b),
    )


def split_model(box: SymBox, axis: int, at: z3.ArithRef) -> tuple[SymBox, SymBox]:
    """``Box.split(axis, at)``: the halves ``[lo, at)`` and ``[at, hi)`` on ``axis``."""
    lo, hi = box.origin[axis], box.origin[axis] + box.extent[axis]
    left_extent = list(box.extent)
    left_extent[axis] = at - lo
    right_origin = list(box.origin)
    right_origin[axis] = at
    right_extent = list(box.extent)
    right_extent[axis] = hi - at
    return SymBox("L", box.ndim, box.origin, left_extent), SymBox("R", box.ndim, right_origin, right_extent)


def guillotine_split(n: int, axis: int) -> Claim:
    """Box.split(axis, at): the two halves are positive, inside, disjoint and cover the box.

    One claim per axis, with only *that* axis's cut strictly inside: a box of extent 1 on some
    other axis is covered too (an earlier form asked every axis's cut to be strictly inside at
    once, which left out every box with an extent-1 axis)."""
    box = SymBox("B", n)
    p = ints("p", n)
    at = z3.Int("cut")
    lo, hi = box.origin[axis], box.origin[axis] + box.extent[axis]
    left, right = split_model(box, axis, at)
    goal = {
        "both halves positive": z3.And(left.positive(), right.positive()),
        "both halves inside B": z3.And(left.inside(box), right.inside(box)),
        "the halves are separated": left.disjoint(right),
        "p lies in exactly one half iff in B": count([left.has(p), right.has(p)]) == z3.If(box.has(p), 1, 0),
        "the volumes add up to vol(B)": left.volume() + right.volume() == box.volume(),
    }
    return Claim(
        f"tiling.guillotine_split[n={n},axis={axis}]", f"n={n}, cut on axis {axis} only",
        {"B positive": box.positive(), "cut strictly inside on the axis": z3.And(lo < at, at < hi)},
        goal, ["cut strictly inside on the axis"], show_boxes(box, cut=at, p=p),
        outright=["the halves are separated", "the volumes add up to vol(B)"],
    )


def refinement(n: int, k: int, m: int) -> Claim:
    """An exact cover of each part of an exact cover is an exact cover of the whole (pointwise)."""
    whole = SymBox("B", n)
    parts = [SymBox(f"A{i}", n) for i in range(k)]
    subs = [[SymBox(f"A{i}.{j}", n) for j in range(m)] for i in range(k)]
    p = ints("p", n)
    premises = {"A tile B at p": count([a.has(p) for a in parts]) == z3.If(whole.has(p), 1, 0)}
    for i, a in enumerate(parts):
        premises[f"A{i}.* tile A{i} at p"] = count([s.has(p) for s in subs[i]]) == z3.If(a.has(p), 1, 0)
    goal = count([s.has(p) for row in subs for s in row]) == z3.If(whole.has(p), 1, 0)
    return Claim(
        f"tiling.refinement[n={n},k={k},m={m}]", f"n={n}, {k} parts of {m} sub-parts each",
        premises, goal, ["A tile B at p", "A0.* tile A0 at p"], show_boxes(whole, *parts, p=p),
    )


def order_1d() -> Claim:
    """Sorted by origin, disjoint and positive: the next part starts where the previous ends or later."""
    a, b = SymBox("P_i", 1), SymBox("P_i+1", 1)
    return Claim(
        "tiling.sorted_order_1d", "n=1, adjacent parts",
        {"sorted": a.origin[0] <= b.origin[0], "disjoint": a.disjoint(b), "positive": b.positive()},
        a.end[0] <= b.origin[0],
        ["sorted", "disjoint", "positive"], show_boxes(a, b), pins={"n": 1},
    )


def sweep_1d() -> Iterator[Claim]:
    """1 axis, any k: induction over the parts sorted by origin.

    State after the first i parts: S (their total length), pos (end of the i-th part; b for i=0),
    gap G = pos - b - S, and for one arbitrary point x the bit ``cov`` (x lies in one of them).
    Invariant: G >= 0, pos <= b + E, and G == 0 implies every x in [b, pos) is covered.
    """
    b, size, pos, total, o, e, x = z3.Ints("b E pos S o e x")
    cov = z3.Bool("cov")

    def inv(gap: z3.ArithRef, end: z3.ArithRef, covered: z3.BoolRef) -> z3.BoolRef:
        return z3.And(gap >= 0, end <= b + size, z3.Implies(z3.And(gap == 0, b <= x, x < end), covered))

    names = {"b": b, "E": size, "pos": pos, "S": total, "o": o, "e": e, "x": x}
    yield Claim(
        "tiling.sweep_1d_base", "n=1, i=0",
        {"B positive": size >= 1}, inv(z3.IntVal(0), b, z3.BoolVal(False)),
        ["B positive"], lambda m: show_ints(m, names), pins={"n": 1},
    )
    gap = pos - b - total
    new_total, new_pos = total + e, o + e
    yield Claim(
        "tiling.sweep_1d_step", "n=1, i -> i+1, any i",
        {
            "invariant": inv(gap, pos, cov),
            "starts after previous end": o >= pos,
            "positive": e >= 1,
            "inside B": o + e <= b + size,
        },
        inv(new_pos - b - new_total, new_pos, z3.Or(cov, z3.And(o <= x, x < o + e))),
        ["invariant", "starts after previous end", "inside B"], lambda m: show_ints(m, names), pins={"n": 1},
    )
    yield Claim(
        "tiling.sweep_1d_end", "n=1, i=k, any k",
        {
            "invariant": inv(gap, pos, cov),
            "volumes sum to vol(B)": total == size,
            "x in B": z3.And(b <= x, x < b + size),
        },
        cov,
        ["invariant", "volumes sum to vol(B)"], lambda m: show_ints(m, names), pins={"n": 1},
    )


def lemma(n: int, k: int, *, sorted_1d: bool = False) -> Claim:
    # For n >= 2, B sits at the origin WLOG: every premise and the goal compare coordinates only
    # through differences, so translating all boxes and p by -origin(B) maps any counterexample to
    # one with B at 0 (theorem3.md §3.1). Pinning it cuts the nonlinear search by an order of magnitude.
    whole = SymBox("B", n) if n == 1 else SymBox("B", n, origin=[z3.IntVal(0)] * n)
    parts = [SymBox(f"P{i}", n) for i in range(k)]
    p = ints("p", n)
    premises: dict[str, z3.BoolRef] = {
        "B positive": whole.positive(),  # implied by "p in B"; stated first, it guides z3's search
        "positive extents": z3.And(*[q.positive() for q in parts]),
        "inside B": z3.And(*[q.inside(whole) for q in parts]),
        "disjoint": pairwise_disjoint(parts),
        "volumes sum to vol(B)": z3.Sum(*[q.volume() for q in parts]) == whole.volume(),
        "p in B": whole.has(p),
    }
    if sorted_1d:
        # WLOG (theorem3.md §3.1): the statement is symmetric in the parts, so sort them by origin.
        premises["sorted (wlog)"] = z3.And(*[a.origin[0] <= b.origin[0] for a, b in itertools.pairwise(parts)])
    essential = ["inside B", "volumes sum to vol(B)"]
    if k >= 2:
        essential.append("disjoint")
    if n >= 2:
        essential.append("positive extents")  # two negative extents multiply to a positive volume
    split = None if sorted_1d or k < 2 else "disjoint"
    bounds = f"n={n}, k={k}" + (", sorted" if sorted_1d else "")
    fixed: dict[str, str] = {}
    if k == 2 and n >= 2:
        # WLOG P0 ends before P1 starts on axis 0: the statement is invariant under renaming the
        # axes and swapping the parts, and each of the other 2n - 1 separation cases is this query
        # with its variables renamed. (The exhaustive split of the k = 3 claim needs no symmetry.)
        premises["disjoint"] = parts[0].separated(parts[1], 0, True)
        split = None
        bounds += ", wlog P0 before P1 on axis 0"
        fixed = wlog_fixed(n)
    return Claim(
        f"tiling.lemma[n={n},k={k}]", bounds,
        premises, z3.Or(*[q.has(p) for q in parts]), essential, show_boxes(whole, *parts, p=p),
        split=split, cases=separation_cases(parts) if split else [], fixed=fixed,
    )


def wlog_fixed(n: int) -> dict[str, str]:
    """What two parts tiling B at the origin, P0 before P1 on axis 0, must start at (the
    hidden-bound probe leaves these out): P0 holds B's origin, and P1 spans B's other axes."""
    why = "0: the two parts tile B, which sits at the origin (wlog)"
    return {**{f"P0.o{d}": why for d in range(n)}, **{f"P1.o{d}": why for d in range(1, n)}}


def claims() -> Iterator[Claim]:
    for n in range(1, MAX_AXES + 1):
        yield from disjoint_iff_no_common_point(n)
    for n in range(1, MAX_AXES + 1):
        for axis in range(n):
            yield guillotine_split(n, axis)
    yield refinement(3, 3, 2)
    yield order_1d()
    yield from sweep_1d()
    for k in (1, 2, 3, 4, 8, 16, 32):
        yield lemma(1, k, sorted_1d=True)
    for n in range(2, 6):
        yield lemma(n, 2)
    yield lemma(2, 3)


if __name__ == "__main__":
    main(claims())
