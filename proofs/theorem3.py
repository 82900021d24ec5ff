"""Theorem 3's value step at one point, with uninterpreted functions (theorem3.md §4).

Setting, for one request Q (a target frame f intersected with a source region R) and two answers
A and B that both pass ``check_answers``:

* ``truth(y)`` is element y of the logical tensor F; ``mem(l, a)`` is the word at address a of
  source location l's shard; ``old(t)`` is what the target held at address t before the copy.
  All three are uninterpreted: nothing is assumed about values.
* Candidate c holds R at offset ``off_c`` with strides ``ss_c`` (its own layout, as
  ``ReplicaCandidate`` carries it). The replication premise (P2 with Premise A: every holder's
  shard equals ``S.extract(F)`` on its frame) is ``mem(loc_c, off_c + Σ (y - R.origin)·ss_c) =
  truth(y)`` for y in R; z3 gets it at the point in question (an instance of the ∀ premise).
* A part P of an answer served by location l is emitted as a segment whose source offset is the
  candidate's offset moved to P's origin and whose target offset is f's offset moved to P's
  origin; element y of P is read at ``src + Σ (y - P.origin)·ss`` and written at
  ``dst + Σ (y - P.origin)·ts``. A location that is not a candidate has no frame for R, so the
  planner could only read some unrelated address of it: modelled as free offset and strides.
* The value an answer leaves at x is that of the (first) part covering x, or ``old`` if none does.

Claim (the *value step*): if A and B each cover x exactly once (given: that is what Lemma Q
proves, not this claim), with candidate locations, then both write x at the same target address,
``f``'s own address of x, and both write ``truth(x)``. It does not carry the tiling: the parts'
count and containment play no role in the conclusion (it holds with "at least once" too), and
that every target address has exactly one writer is Theorem 1. With those, this step gives
Theorem 3 (target bytes independent of the answer, splits included) and Theorem 2 (target shard =
``T.extract(F)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import z3
from kit import Claim, SymBox, count, dot, ints, main, show_boxes

Value = z3.DeclareSort("Value")


def _diff(a: Sequence[z3.ArithRef], b: Sequence[z3.ArithRef]) -> list[z3.ArithRef]:
    return [x - y for x, y in zip(a, b)]


def emit_model(request_origin: Sequence[z3.ArithRef], target_offset: z3.ArithRef, target_strides: Sequence[z3.ArithRef],
               read_offset: z3.ArithRef, read_strides: Sequence[z3.ArithRef],
               part_origin: Sequence[z3.ArithRef]) -> tuple[z3.ArithRef, z3.ArithRef]:
    """``planner._emit`` for one part: (source offset, target offset) of its segment, the request's
    and the chosen candidate's offsets moved to the part's origin along their own strides. The
    segment's shape is the part's extent, its locations the candidate's and the request's, its
    strides the candidate's and the request's (``differential.py`` checks all of these)."""
    delta = _diff(part_origin, request_origin)
    return read_offset + dot(delta, read_strides), target_offset + dot(delta, target_strides)


def candidate_offset_model(holder_offset: z3.ArithRef, region_origin: Sequence[z3.ArithRef],
                           request_origin: Sequence[z3.ArithRef], strides: Sequence[z3.ArithRef]) -> z3.ArithRef:
    """A candidate's read offset for request Q (``build_requests``): its offset for the region's
    origin moved to Q's origin along its own strides."""
    return holder_offset + dot(_diff(request_origin, region_origin), strides)


def identical_data(n: int, k: int, candidates: int) -> Claim:
    truth = z3.Function("truth", *([z3.IntSort()] * n), Value)
    mem = z3.Function("mem", z3.IntSort(), z3.IntSort(), Value)
    old = z3.Function("old", z3.IntSort(), Value)

    region, request, frame = SymBox("R", n), SymBox("Q", n), SymBox("f", n)
    x = ints("x", n)
    loc = ints("loc", candidates)
    off = ints("off", candidates)
    ss = [ints(f"ss{c}.", n) for c in range(candidates)]
    toff, ts = z3.Int("f.off"), ints("ts", n)

    def target_address(y: Sequence[z3.ArithRef]) -> z3.ArithRef:
        return toff + dot(_diff(y, frame.origin), ts)

    premises: dict[str, z3.BoolRef] = {
        "Q inside R": request.inside(region),
        "Q inside f": request.inside(frame),
        "x in Q": request.has(x),
    }
    for c in range(candidates):
        held = mem(loc[c], off[c] + dot(_diff(x, region.origin), ss[c]))
        premises[f"replica {c} holds F on R"] = z3.Implies(region.has(x), held == truth(*x))

    def answer(tag: str) -> tuple[z3.ExprRef, z3.ArithRef, list[SymBox]]:
        parts = [SymBox(f"{tag}{i}", n) for i in range(k)]
        source = ints(f"{tag}.loc", k)
        # per part: the layout the planner reads with (the chosen candidate's), and the
        # segment's two offsets; a location that is no candidate leaves the layout unconstrained
        read_off = ints(f"{tag}.read_off", k)
        read_strides = [ints(f"{tag}{i}.ss", n) for i in range(k)]
        seg_src, seg_dst = ints(f"{tag}.src", k), ints(f"{tag}.dst", k)
        premises[f"{tag}: locations are candidates"] = z3.And(
            *[z3.Or(*[s == holder for holder in loc]) for s in source])
        # The value step at x. Exactly-once coverage at x is *given* here (Lemma Q proves it);
        # this claim does not establish the tiling, and neither the parts' count nor "inside Q"
        # carries its conclusion: it also holds with "at least one part covers x", which z3
        # proves at n = 1, 2 but at n = 3 only with 19.7 of the 20 million rlimit, too close to
        # ship. "Inside Q" keeps the queries small.
        premises[f"{tag}: parts inside Q"] = z3.And(*[p.inside(request) for p in parts])
        premises[f"{tag} covers x exactly once (Lemma Q)"] = count([p.has(x) for p in parts]) == 1
        premises[f"{tag}: layout of the chosen candidate"] = z3.And(*[
            z3.Implies(source[i] == loc[c], z3.And(
                read_off[i] == candidate_offset_model(off[c], region.origin, request.origin, ss[c]),
                *[a == b for a, b in zip(read_strides[i], ss[c])],
            ))
            for i in range(k) for c in range(candidates)
        ])
        emitted = [emit_model(request.origin, target_address(request.origin), ts, read_off[i], read_strides[i],
                              parts[i].origin) for i in range(k)]
        premises[f"{tag}: offsets moved to each part's origin"] = z3.And(*[
            z3.And(seg_src[i] == emitted[i][0], seg_dst[i] == emitted[i][1]) for i in range(k)
        ])
        value: z3.ExprRef = old(target_address(x))
        address: z3.ArithRef = target_address(x)
        for i in reversed(range(k)):
            index = _diff(x, parts[i].origin)
            value = z3.If(parts[i].has(x), mem(source[i], seg_src[i] + dot(index, read_strides[i])), value)
            address = z3.If(parts[i].has(x), seg_dst[i] + dot(index, ts), address)
        return value, address, parts

    value_a, address_a, parts_a = answer("A")
    value_b, address_b, parts_b = answer("B")
    goal = {
        "A writes truth(x)": value_a == truth(*x),
        "B writes what A writes": value_b == value_a,
        "A writes at the target frame's address of x": address_a == target_address(x),
        "B writes where A writes": address_b == address_a,
    }
    return Claim(
        f"theorem3.identical_data[n={n},k={k},candidates={candidates}]",
        f"n={n}, {k} parts per answer, {candidates} candidates, two answers",
        premises, goal,
        ["A: locations are candidates", "replica 1 holds F on R", "A covers x exactly once (Lemma Q)", "Q inside R",
         "A: layout of the chosen candidate", "A: offsets moved to each part's origin"],
        show_boxes(region, request, *parts_a, *parts_b, x=x, loc=loc),
    )


def claims() -> Iterator[Claim]:
    yield identical_data(1, 2, 2)
    yield identical_data(2, 3, 3)
    yield identical_data(3, 2, 3)


if __name__ == "__main__":
    main(claims())
