"""Slab tilings: the tiling lemma for every number of parts, n <= 8 axes (theorem3.md §3.1).

A *slab* tiling is one where a single axis separates every pair of parts: every split along one
axis, and the cells ``refplan.box.covers`` and ``refplan.box._separated`` short-cut on (boxes
separated along one axis whose volumes add up to the cell's cover it). For these the tiling lemma
is proved for **every k**, by induction over the parts sorted along that axis; base, step and end
are z3 queries, nonlinear (products of extents) but small, and the induction rule is on paper.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import z3
from kit import Claim, SymBox, ints, main, product, show_boxes

MAX_AXES = 8


def slab_model(parts: Sequence[SymBox], axis: int) -> z3.BoolRef:
    """``axis`` separates every pair of parts: the premise of a slab tiling. Sorted along that
    axis, it is the sweep's "starts after the previous end on axis 0" (axis 0 wlog);
    ``box.separated`` decides whether some axis does (``differential.py`` holds it to this)."""
    return z3.And(*[z3.Or(a.separated(b, axis, True), a.separated(b, axis, False))
                    for a, b in itertools.combinations(parts, 2)])


def sweep(n: int) -> Iterator[Claim]:
    """n axes, any k, when one axis (axis 0, WLOG by renaming) separates every pair: a *slab* tiling.

    The same induction as ``tiling.sweep_1d``, over the parts sorted along axis 0, with the cross-section
    R = vol of B's other axes: invariant G = (pos - b0)·R - S >= 0, b0 <= pos <= b0 + E0, and
    G == 0 implies every x in B with x0 < pos is covered. The step needs vol(P) <= e0·R with
    equality only for a part spanning B's cross-section, which is where the products are; z3
    proves it for every n <= 8. This is the shape ``box.covers`` and ``box._separated`` rely on
    (boxes separated along one axis whose volumes add up cover their cell), and the shape of
    every split along one axis, for any number of parts.
    """
    whole = SymBox("B", n)
    part = SymBox("P", n)
    x = ints("x", n)
    pos, total = z3.Ints("pos S")
    cov = z3.Bool("cov")
    section = product(whole.extent[1:])
    b0, e0 = whole.origin[0], whole.extent[0]

    def inv(done: z3.ArithRef, end: z3.ArithRef, covered: z3.BoolRef) -> z3.BoolRef:
        gap = (end - b0) * section - done
        return z3.And(gap >= 0, b0 <= end, end <= b0 + e0,
                      z3.Implies(z3.And(gap == 0, whole.has(x), x[0] < end), covered))

    describe = show_boxes(whole, part, x=x, pos=pos, S=total)
    yield Claim(
        f"slabs.sweep_base[n={n}]", f"n={n}, i=0",
        {"B positive": whole.positive()}, inv(z3.IntVal(0), b0, z3.BoolVal(False)),
        ["B positive"], describe,
    )
    yield Claim(
        f"slabs.sweep_step[n={n}]", f"n={n}, i -> i+1, any i",
        {
            "B positive": whole.positive(),
            "invariant": inv(total, pos, cov),
            "starts after previous end on axis 0": part.origin[0] >= pos,
            "positive": part.positive(),
            "inside B": part.inside(whole),
        },
        inv(total + part.volume(), part.end[0], z3.Or(cov, part.has(x))),
        ["invariant", "starts after previous end on axis 0", "inside B"], describe,
    )
    yield Claim(
        f"slabs.sweep_end[n={n}]", f"n={n}, i=k, any k",
        {
            "B positive": whole.positive(),
            "invariant": inv(total, pos, cov),
            "volumes sum to vol(B)": total == whole.volume(),
            "x in B": whole.has(x),
        },
        cov, ["invariant", "volumes sum to vol(B)"], describe,
    )


def claims() -> Iterator[Claim]:
    for n in range(2, MAX_AXES + 1):
        yield from sweep(n)


if __name__ == "__main__":
    main(claims())
