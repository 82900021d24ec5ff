"""Shared harness for the z3 proof scripts (``proofs/*.py``).

A *claim* is a set of named premises and a goal over integer (and, in ``theorem3.py``,
uninterpreted) terms. ``prove`` asks z3 for a model of "all premises and not the goal": ``unsat``
means the claim holds for every value of its free symbols, which is what "proved" means here. The
bounds of a claim (number of axes, number of parts) are fixed by the script; the coordinates,
extents, shapes and strides inside those bounds are symbolic and unbounded.

Each claim is then checked for *non-vacuity* twice over: its premises together must be
satisfiable (a contradiction would prove anything), and dropping each premise named in
``essential`` must let z3 find a counterexample. A claim that still holds without a premise that
was meant to matter is reported as a failure, because it means the encoding does not say what the
document says it says.

Output, one line per result, which ``run_all.py`` and ``tests/test_proofs.py`` parse::

    proved <name> (<bounds>) in <t> s
    non-vacuous <name>: dropping <premise> gives counterexample <model>
    NOT PROVED <name> (<bounds>): <z3 status> [<counterexample>]
    VACUOUS <name>: <what went wrong>

A script exits 1 when any line is of the last two kinds.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import z3

RLIMIT = 20_000_000
"""Per-query resource limit (z3's deterministic work counter, about 10-15 s of one core here).
The heaviest query shipped uses about 7.8 million (``theorem3.identical_data`` at n = 3; every
other query stays under 4 million); a query that runs out reports ``unknown`` and fails its
claim. Unlike a wall-clock timeout, the verdict does not depend on machine load: the same z3
version on the same formula does the same work. ``PROOFS_STATS=1`` prints the work each query
used."""

TIMEOUT_MS = 120_000
"""Wall-clock backstop per query, far above what ``RLIMIT`` allows on a loaded 2-core machine."""

Describe = Callable[[z3.ModelRef], str]


# ---------------------------------------------------------------------------------------------
# Symbolic boxes


class SymBox:
    """A half-open integer box ``[origin, origin + extent)`` with z3 terms as coordinates."""

    def __init__(self, name: str, ndim: int, origin: Sequence[z3.ArithRef] | None = None,
                 extent: Sequence[z3.ArithRef] | None = None) -> None:
        self.name = name
        self.ndim = ndim
        self.origin = list(origin) if origin is not None else [z3.Int(f"{name}.o{d}") for d in range(ndim)]
        self.extent = list(extent) if extent is not None else [z3.Int(f"{name}.e{d}") for d in range(ndim)]

    @property
    def end(self) -> list[z3.ArithRef]:
        return [o + e for o, e in zip(self.origin, self.extent)]

    def has(self, point: Sequence[z3.ArithRef]) -> z3.BoolRef:
        """``point`` lies in the box."""
        return z3.And(*[z3.And(o <= p, p < o + e) for o, e, p in zip(self.origin, self.extent, point)])

    def positive(self) -> z3.BoolRef:
        return z3.And(*[e >= 1 for e in self.extent])

    def inside(self, other: SymBox) -> z3.BoolRef:
        """Every coordinate range of ``self`` lies in ``other``'s (the check ``contains`` makes)."""
        return z3.And(*[
            z3.And(b <= a, a + ae <= b + be)
            for a, ae, b, be in zip(self.origin, self.extent, other.origin, other.extent)
        ])

    def separated(self, other: SymBox, axis: int, before: bool) -> z3.BoolRef:
        """``self`` ends before ``other`` starts on ``axis`` (or the reverse when not ``before``)."""
        if before:
            return self.origin[axis] + self.extent[axis] <= other.origin[axis]
        return other.origin[axis] + other.extent[axis] <= self.origin[axis]

    def disjoint(self, other: SymBox) -> z3.BoolRef:
        """Some axis separates the two boxes (the pairwise test of ``check_answers``)."""
        return z3.Or(*[self.separated(other, d, b) for d in range(self.ndim) for b in (True, False)])

    def volume(self) -> z3.ArithRef:
        return product(self.extent)

    def same(self, other: SymBox) -> z3.BoolRef:
        return z3.And(*[a == b for a, b in zip(self.origin + self.extent, other.origin + other.extent)])

    def show(self, model: z3.ModelRef) -> str:
        spans = []
        for o, e in zip(self.origin, self.extent):
            lo = ev(model, o)
            spans.append(f"{lo}:{lo + ev(model, e)}")
        return f"{self.name}=[{', '.join(spans)}]"


def product(terms: Sequence[z3.ArithRef]) -> z3.ArithRef:
    if not terms:
        return z3.IntVal(1)
    out = terms[0]
    for t in terms[1:]:
        out = out * t
    return out


def ints(prefix: str, count: int) -> list[z3.ArithRef]:
    return [z3.Int(f"{prefix}{i}") for i in range(count)]


def count(conditions: Iterable[z3.BoolRef]) -> z3.ArithRef:
    """How many of ``conditions`` hold (a linear term)."""
    return z3.Sum(*[z3.If(c, 1, 0) for c in conditions]) if conditions else z3.IntVal(0)


def row_major(shape: Sequence[z3.ArithRef]) -> list[z3.ArithRef]:
    """Row-major element strides of ``shape`` as terms (``strides[-1] == 1``)."""
    strides: list[z3.ArithRef] = [z3.IntVal(1)] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return strides


def dot(xs: Sequence[z3.ArithRef], ys: Sequence[z3.ArithRef]) -> z3.ArithRef:
    return z3.Sum(*[x * y for x, y in zip(xs, ys)]) if xs else z3.IntVal(0)


def ev(model: z3.ModelRef, term: z3.ExprRef) -> int:
    value = model.eval(term, model_completion=True)
    return value.as_long() if z3.is_int_value(value) else value  # type: ignore[no-any-return]


def show_ints(model: z3.ModelRef, named: dict[str, Sequence[z3.ArithRef] | z3.ArithRef]) -> str:
    parts = []
    for label, value in named.items():
        if isinstance(value, (list, tuple)):
            parts.append(f"{label}=({', '.join(str(ev(model, v)) for v in value)})")
        else:
            parts.append(f"{label}={ev(model, value)}")
    return " ".join(parts)


def show_boxes(*boxes: SymBox, **named: Sequence[z3.ArithRef] | z3.ArithRef) -> Describe:
    def describe(model: z3.ModelRef) -> str:
        text = " ".join(b.show(model) for b in boxes)
        extra = show_ints(model, dict(named)) if named else ""
        return (text + " " + extra).strip()
    return describe


# ---------------------------------------------------------------------------------------------
# Claims


@dataclass
class Claim:
    """Premises ⇒ goal, with the premises whose removal must break it.

    ``cases`` optionally splits one premise (``split``) into an exhaustive list of cases, each a
    list of constraints that replaces it; the claim is proved when every case is ``unsat``.
    Exhaustiveness is itself checked by z3 (the premise implies the disjunction of the cases),
    so a case split can never hide a missing case.
    """

    name: str
    bounds: str
    premises: dict[str, z3.BoolRef]
    goal: z3.BoolRef
    essential: Sequence[str]
    describe: Describe
    split: str | None = None
    cases: list[list[z3.BoolRef]] = field(default_factory=list)
    timeout_ms: int = TIMEOUT_MS


@dataclass
class Report:
    ok: bool = True
    lines: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def fail(self, line: str) -> None:
        self.ok = False
        self.say(line)


def _solver(timeout_ms: int) -> z3.Solver:
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.set("rlimit", RLIMIT)
    return solver


_SPENT = [0]  # z3's resource counter is per process; remember where the last query left it


def _check(constraints: Sequence[z3.BoolRef], timeout_ms: int) -> tuple[z3.CheckSatResult, z3.ModelRef | None]:
    solver = _solver(timeout_ms)
    solver.add(*constraints)
    result = solver.check()
    if os.environ.get("PROOFS_STATS"):
        try:
            total = solver.statistics().get_key_value("rlimit count")
        except z3.Z3Exception:
            total = _SPENT[0]
        print(f"  [rlimit {total - _SPENT[0]} {result}]", flush=True)
        _SPENT[0] = total
    return result, (solver.model() if result == z3.sat else None)


def prove(claim: Claim, report: Report) -> None:
    start = time.perf_counter()
    fixed = [p for name, p in claim.premises.items() if name != claim.split]
    if claim.split is None:
        queries = [[*fixed, z3.Not(claim.goal)]]
    else:
        # The split premise must imply the disjunction of its cases.
        cover = z3.Or(*[z3.And(*case) for case in claim.cases])
        result, model = _check([claim.premises[claim.split], z3.Not(cover)], claim.timeout_ms)
        if result != z3.unsat:
            report.fail(f"NOT PROVED {claim.name} ({claim.bounds}): the case split of "
                        f"{claim.split!r} is not exhaustive ({result})")
            return
        queries = [[*fixed, *case, z3.Not(claim.goal)] for case in claim.cases]
    for constraints in queries:
        result, model = _check(constraints, claim.timeout_ms)
        if result != z3.unsat:
            detail = f": counterexample {claim.describe(model)}" if model is not None else ""
            report.fail(f"NOT PROVED {claim.name} ({claim.bounds}): z3 says {result}{detail}")
            return
    elapsed = time.perf_counter() - start
    cases = f", {len(queries)} cases" if claim.split is not None else ""
    report.say(f"proved {claim.name} ({claim.bounds}{cases}) in {elapsed:.3f} s")
    non_vacuity(claim, report)


def non_vacuity(claim: Claim, report: Report) -> None:
    result, _ = _check(list(claim.premises.values()), claim.timeout_ms)
    if result != z3.sat:
        report.fail(f"VACUOUS {claim.name}: the premises together are {result}, so the proof says nothing")
        return
    for dropped in claim.essential:
        rest = [p for name, p in claim.premises.items() if name != dropped]
        result, model = _check([*rest, z3.Not(claim.goal)], claim.timeout_ms)
        if result == z3.sat and model is not None:
            report.say(f"non-vacuous {claim.name}: dropping {dropped} gives counterexample {claim.describe(model)}")
        else:
            report.fail(f"VACUOUS {claim.name}: dropping {dropped} gives no counterexample ({result})")


def separation_cases(parts: Sequence[SymBox]) -> list[list[z3.BoolRef]]:
    """Every way to pick, for each pair of parts, one axis and one side that separates them."""
    pairs = list(itertools.combinations(range(len(parts)), 2))
    options = [(d, b) for d in range(parts[0].ndim) for b in (True, False)]
    cases = []
    for choice in itertools.product(options, repeat=len(pairs)):
        cases.append([parts[i].separated(parts[j], d, b) for (i, j), (d, b) in zip(pairs, choice)])
    return cases


def pairwise_disjoint(parts: Sequence[SymBox]) -> z3.BoolRef:
    return z3.And(*[a.disjoint(b) for a, b in itertools.combinations(parts, 2)])


def main(claims: Iterable[Claim]) -> None:
    """Prove every claim (built lazily, so a slow builder still shows progress); exit 1 on failure."""
    report = Report()
    for claim in claims:
        prove(claim, report)
    sys.exit(0 if report.ok else 1)
