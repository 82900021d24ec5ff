"""What ``check_answers`` buys (theorem3.md §3.5, §4): its checks imply an exact tiling.

* ``exact_tiling``: for a split answer, the geometric checks ``check_answers`` makes — extents
  positive, part inside the request box, parts pairwise disjoint, volumes summing to the request's
  volume — imply that every point of the request is covered by exactly one part and that no part
  covers a point outside the request. (An ``int`` answer is the one-part case, part = request
  box.) That each part names a candidate is a membership check of the code, not a theorem.
  Bounds as for the tiling lemma (``tiling.py``), which carries the nonlinear step.
* ``premise_c``: if the source regions cover F exactly (Premise B plus coverage) and a target
  frame lies inside F, then the frame is covered exactly by its intersections with the regions,
  as ``Box.intersect`` computes them (``boxes.intersect_model``). Linear, pointwise, so the volume
  check ``regions.intersections`` also makes (R28) is a second line of defence, not the argument.
* ``premise_c_arrays``: the same, for the int64 array arithmetic ``regions.intersections`` runs
  (pair presence as ``box.overlapping_pair_array`` decides it, part = max origin to min end).
  ``boxes.array_pair_is_intersect`` shows that arithmetic is ``Box.intersect`` for every n <= 8.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import z3
from boxes import array_part_model, intersect_model, pair_model
from kit import Claim, SymBox, count, ints, main, pairwise_disjoint, show_boxes
from tiling import wlog_fixed


def split_checks_model(request: SymBox, parts: list[SymBox]) -> dict[str, z3.BoolRef]:
    """The geometric checks ``check_answers`` makes of a split answer (``_check_split``), as the
    premises of ``exact_tiling``: it accepts the parts' geometry exactly when all four hold
    (``differential.py`` holds the code to this, for the general pairwise form of "disjoint")."""
    return {
        "positive extents": z3.And(*[q.positive() for q in parts]),
        "inside the request": z3.And(*[q.inside(request) for q in parts]),
        "disjoint": pairwise_disjoint(parts),
        "volumes sum to the request's": z3.Sum(*[q.volume() for q in parts]) == request.volume(),
    }


def exact_tiling(n: int, k: int) -> Claim:
    """The geometric checks of a split imply an exact tiling of the request, pointwise.

    Which location serves a part is not part of this claim: "every part names a candidate" is a
    membership check ``check_answers`` makes (``_candidate``), and restating it as a premise and
    again as a goal would prove nothing (issue 17). The claim is the geometry alone.
    """
    request = SymBox("Q", n) if n == 1 else SymBox("Q", n, origin=[z3.IntVal(0)] * n)
    parts = [SymBox(f"P{i}", n) for i in range(k)]
    x = ints("x", n)
    premises: dict[str, z3.BoolRef] = {"request positive": request.positive(), **split_checks_model(request, parts)}
    if n == 1:
        premises["sorted (wlog)"] = z3.And(*[a.origin[0] <= b.origin[0] for a, b in itertools.pairwise(parts)])
    elif k == 2:
        # WLOG, as in tiling.lemma: the separation case "P0 before P1 on axis 0" stands for all 2n.
        premises["disjoint"] = parts[0].separated(parts[1], 0, True)
    fixed = wlog_fixed(n) if n >= 2 and k == 2 else {}
    goal = count([q.has(x) for q in parts]) == z3.If(request.has(x), 1, 0)
    essential = ["inside the request", "volumes sum to the request's"]
    if k >= 2:
        essential.append("disjoint")
    if n >= 2:
        essential.append("positive extents")
    return Claim(
        f"answers.exact_tiling[n={n},k={k}]",
        f"n={n}, k={k}" + (", sorted" if n == 1 else ", wlog P0 before P1 on axis 0"),
        premises, goal, essential, show_boxes(request, *parts, x=x), fixed=fixed,
    )


def premise_c(n: int, regions: int) -> Claim:
    logical = SymBox("F", n)
    region = [SymBox(f"R{i}", n) for i in range(regions)]
    frame = SymBox("f", n)
    x = ints("x", n)
    pieces = [intersect_model(frame, r) for r in region]
    return Claim(
        f"answers.premise_c[n={n},regions={regions}]", f"n={n}, {regions} regions, pointwise",
        {
            "regions cover F exactly at x": count([r.has(x) for r in region]) == z3.If(logical.has(x), 1, 0),
            "frame inside F": frame.inside(logical),
        },
        count([z3.And(present, box.has(x)) for present, box in pieces]) == z3.If(frame.has(x), 1, 0),
        ["regions cover F exactly at x", "frame inside F"], show_boxes(logical, frame, *region, x=x),
    )


def premise_c_arrays(n: int, regions: int) -> Claim:
    """``premise_c`` for the arithmetic ``regions.intersections`` actually runs: a (frame, region)
    pair counts when ``overlapping_pair_array`` reports it (``boxes.pair_model``), and its part is
    ``max`` of the origins to ``min`` of the ends (``boxes.array_part_model``). Frames and regions
    are positive boxes (validated pieces, their groups)."""
    logical = SymBox("F", n)
    region = [SymBox(f"R{i}", n) for i in range(regions)]
    frame = SymBox("f", n)
    x = ints("x", n)
    pieces = [(pair_model(frame, r), array_part_model(frame, r)) for r in region]
    return Claim(
        f"answers.premise_c_arrays[n={n},regions={regions}]", f"n={n}, {regions} regions, pointwise",
        {
            "regions cover F exactly at x": count([r.has(x) for r in region]) == z3.If(logical.has(x), 1, 0),
            "frame inside F": frame.inside(logical),
            "frame and regions positive": z3.And(frame.positive(), *[r.positive() for r in region]),
        },
        count([z3.And(reported, part.has(x)) for reported, part in pieces]) == z3.If(frame.has(x), 1, 0),
        ["regions cover F exactly at x", "frame inside F"], show_boxes(logical, frame, *region, x=x),
    )


def claims() -> Iterator[Claim]:
    for k in (1, 2, 3, 4):
        yield exact_tiling(1, k)
    for n in (2, 3):
        yield exact_tiling(n, 2)
    for n in (1, 2, 3):
        yield premise_c(n, 4)
        yield premise_c_arrays(n, 4)


if __name__ == "__main__":
    main(claims())
