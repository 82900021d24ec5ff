"""Box algebra: ``Box.intersect`` and ``Box.subtract`` do what their names say (theorem3.md §3.2),
and the array form of intersection that ``regions.intersections`` runs is ``Box.intersect``.

Both functions are re-encoded here step for step as z3 terms (``intersect_model``,
``subtract_model``), then proved correct for every box with symbolic coordinates, for up to
``MAX_AXES`` axes. ``differential.py`` (run by ``make proofs``) evaluates the same encodings on
every pair of boxes of small domains and on drawn larger ones and compares them with
``refplan.box`` itself, which is what ties these proofs to the code rather than to a paraphrase
of it. All claims here are linear, so they are complete proofs at their bounds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import z3
from kit import Claim, SymBox, count, ints, main, show_boxes

MAX_AXES = 8
SUBTRACT_AXES = 8


def _max(a: z3.ArithRef, b: z3.ArithRef) -> z3.ArithRef:
    return z3.If(a > b, a, b)


def _min(a: z3.ArithRef, b: z3.ArithRef) -> z3.ArithRef:
    return z3.If(a < b, a, b)


def intersect_model(a: SymBox, b: SymBox) -> tuple[z3.BoolRef, SymBox]:
    """``Box.intersect``: (the result is a box rather than ``None``, that box)."""
    origin = [_max(x, y) for x, y in zip(a.origin, b.origin)]
    end = [_min(x, y) for x, y in zip(a.end, b.end)]
    present = z3.And(*[hi > lo for lo, hi in zip(origin, end)])
    return present, SymBox(f"{a.name}&{b.name}", a.ndim, origin, [hi - lo for lo, hi in zip(origin, end)])


def overlaps_model(a: SymBox, b: SymBox) -> z3.BoolRef:
    """``Box.overlaps``."""
    return z3.And(*[
        z3.Not(z3.Or(ae <= 0, be <= 0, a0 >= b0 + be, b0 >= a0 + ae))
        for a0, ae, b0, be in zip(a.origin, a.extent, b.origin, b.extent)
    ])


def pair_model(a: SymBox, b: SymBox) -> z3.BoolRef:
    """When ``box.overlapping_pair_array`` reports the pair (a, b), as its code decides it.

    Boxes with a non-positive extent are dropped first (the ``live`` filter); what remains is
    reported when every axis has ``a.lo < b.hi`` and ``b.lo < a.hi``: the leaf's strict numpy
    comparison, and the test the sorted interval join applies to its candidates. (That the k-d
    partition and the join bring every such pair to that test is **[tests]**, exhaustive on small
    domains in ``tests/test_proofs.py``.)
    """
    return z3.And(a.positive(), b.positive(), *[
        z3.And(a0 < b0 + be, b0 < a0 + ae) for a0, ae, b0, be in zip(a.origin, a.extent, b.origin, b.extent)
    ])


def array_part_model(a: SymBox, b: SymBox) -> SymBox:
    """The part ``regions.intersections`` computes for a reported pair, on int64 arrays:
    ``lo = max(origins)``, ``extent = min(ends) - lo``."""
    lo = [_max(x, y) for x, y in zip(a.origin, b.origin)]
    hi = [_min(x, y) for x, y in zip(a.end, b.end)]
    return SymBox(f"{a.name}^{b.name}", a.ndim, lo, [h - o for o, h in zip(lo, hi)])


def subtract_model(a: SymBox, b: SymBox) -> list[tuple[z3.BoolRef, SymBox]]:
    """``Box.subtract``: the slab decomposition, each slab guarded by the condition that emits it.

    When the boxes do not overlap the function returns ``[a]``; that is the first entry, guarded
    by "not overlaps", and every slab is guarded by "overlaps".
    """
    hit = overlaps_model(a, b)
    out: list[tuple[z3.BoolRef, SymBox]] = [(z3.Not(hit), a)]
    origin = list(a.origin)
    extent = list(a.extent)
    for axis in range(a.ndim):
        lo, hi = origin[axis], origin[axis] + extent[axis]
        cut_lo = _max(lo, b.origin[axis])
        cut_hi = _min(hi, b.origin[axis] + b.extent[axis])
        low_extent = list(extent)
        low_extent[axis] = cut_lo - lo
        out.append((z3.And(hit, cut_lo > lo), SymBox(f"lo{axis}", a.ndim, list(origin), low_extent)))
        high_origin = list(origin)
        high_origin[axis] = cut_hi
        high_extent = list(extent)
        high_extent[axis] = hi - cut_hi
        out.append((z3.And(hit, cut_hi < hi), SymBox(f"hi{axis}", a.ndim, high_origin, high_extent)))
        origin[axis] = cut_lo
        extent[axis] = cut_hi - cut_lo
    return out


def intersect_claims(n: int) -> Iterator[Claim]:
    """Complete (a common point yields a box containing it) and sound (its points are common)."""
    a, b = SymBox("A", n), SymBox("B", n)
    p = ints("p", n)
    present, box = intersect_model(a, b)
    yield Claim(
        f"boxes.intersect_complete[n={n}]", f"n={n}",
        {"p in A": a.has(p), "p in B": b.has(p)},
        {"the result is a box holding p": z3.And(present, box.has(p))}, ["p in A", "p in B"], show_boxes(a, b, p=p),
    )
    yield Claim(
        f"boxes.intersect_sound[n={n}]", f"n={n}",
        {"result is a box": present, "p in result": box.has(p)},
        {"p in A": a.has(p), "p in B": b.has(p), "the result is positive": box.positive(),
         "the result lies inside A": box.inside(a), "the result lies inside B": box.inside(b)},
        ["p in result"], show_boxes(a, b, p=p),
        outright=["the result lies inside A", "the result lies inside B"],
    )


def array_pair_claim(n: int) -> Claim:
    """The array arithmetic of ``regions.intersections`` is ``Box.intersect``, and its pair test is
    the separation predicate of Lemma T: for positive boxes, the pair is reported exactly when no
    axis separates them, exactly when ``Box.intersect`` finds a box, and then the array part is
    that box. The ``live`` filter matters: drop "A positive" and a zero-extent box lying across
    B's span passes the strict comparison although the two share no point."""
    a, b = SymBox("A", n), SymBox("B", n)
    strict = z3.And(*[
        z3.And(a0 < b0 + be, b0 < a0 + ae) for a0, ae, b0, be in zip(a.origin, a.extent, b.origin, b.extent)
    ])
    present, box = intersect_model(a, b)
    part = array_part_model(a, b)
    return Claim(
        f"boxes.array_pair_is_intersect[n={n}]", f"n={n}",
        # The two premises are what the ``live`` filter establishes before the strict test.
        {"A positive": a.positive(), "B positive": b.positive()},
        {
            "the pair test is 'not separated'": strict == z3.Not(a.disjoint(b)),
            "the pair test is intersect's presence": strict == present,
            "the array part is intersect's box": z3.Implies(strict, part.same(box)),
        },
        ["A positive"], show_boxes(a, b),
        outright=["the pair test is 'not separated'", "the array part is intersect's box"],
    )


def subtract_claim(n: int) -> Claim:
    a, b = SymBox("A", n), SymBox("B", n)
    p = ints("p", n)
    pieces = subtract_model(a, b)
    # "At most 2n pieces" is no goal: it holds by construction of the encoding (the one entry for
    # disjoint boxes excludes the 2n slabs), so z3 would find it true of every assignment; the
    # differential check holds the code's piece list equal to the encoding's, count included.
    goals = {
        "p lies in exactly one piece iff p is in A and not in B":
            count([z3.And(g, s.has(p)) for g, s in pieces]) == z3.If(z3.And(a.has(p), z3.Not(b.has(p))), 1, 0),
        "every piece is positive and inside A":
            z3.And(*[z3.Implies(g, z3.And(s.positive(), s.inside(a))) for g, s in pieces]),
        "the pieces are pairwise separated":
            z3.And(*[z3.Implies(z3.And(g, h), s.disjoint(t)) for (g, s), (h, t) in itertools.combinations(pieces, 2)]),
    }
    return Claim(
        f"boxes.subtract[n={n}]", f"n={n}, {2 * n} slabs",
        {"A positive": a.positive(), "B positive": b.positive()},
        goals, ["A positive"], show_boxes(a, b, p=p),
        outright=["p lies in exactly one piece iff p is in A and not in B", "the pieces are pairwise separated"],
    )


def claims() -> Iterator[Claim]:
    for n in range(1, MAX_AXES + 1):
        yield from intersect_claims(n)
        yield array_pair_claim(n)
    for n in range(1, SUBTRACT_AXES + 1):
        yield subtract_claim(n)


if __name__ == "__main__":
    main(claims())
