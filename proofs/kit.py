"""Shared harness for the z3 proof scripts (``proofs/*.py``).

A *claim* is a set of named premises and a goal over integer (and, in ``theorem3.py``,
uninterpreted) terms. ``prove`` asks z3 for a model of "all premises and not the goal": ``unsat``
means the claim holds for every value of its free symbols, which is what "proved" means here. The
bounds of a claim (number of axes, number of parts) are fixed by the script; the coordinates,
extents, shapes and strides inside those bounds are symbolic and unbounded.

Each claim is then checked for *non-vacuity* four ways: its premises together must be
satisfiable (a contradiction would prove anything); dropping each premise named in ``essential``
must let z3 find a counterexample; each named conjunct of the goal must fail in some assignment
once the premises are dropped, unless the claim declares it a fact of the encoding that holds
for every input (``outright``; ``claims.json`` pins the conjunct names, those declarations and a
fingerprint of every formula, so a dropped or weakened conjunct is noticed); and no premise may
hide a bound on a value: every integer variable of the premises must reach ``|v| >= PROBE`` in
some model of them (an extent capped at 2 by a stray premise would make a small-n proof say
nothing about larger boxes). A claim that fails any of these is reported as a failure, because it
means the encoding does not say what the document says it says.

Output, one line per result, which ``run_all.py`` and ``tests/test_proofs.py`` parse::

    proved <name> (<bounds>) in <t> s pins=<bounds as JSON> fp=<fingerprint>
    non-vacuous <name>: dropping <premise> gives counterexample <model>
    non-vacuous <name>: goal "<conjunct>" fails without the premises: <model>
    non-vacuous <name>: goal "<conjunct>" holds of the encoding for every input (outright)
    non-vacuous <name>: unbounded: <k> variables each reach |v| >= <PROBE> under the premises
    NOT PROVED <name> (<bounds>): <z3 status> [<counterexample>]
    VACUOUS <name>: <what went wrong>

A script exits 1 when any line is of the last two kinds. ``compile_terms`` turns an encoding
into a Python function, which ``differential.py`` compares with the production code.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

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

PROBE = 1000
"""The hidden-bound probe: every integer variable of a claim's premises must reach ``|v| >= PROBE``
in some model of them. A premise that caps a value below this (an extent ``<= 2``) is reported."""

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
    goal: z3.BoolRef | dict[str, z3.BoolRef]
    essential: Sequence[str]
    describe: Describe
    split: str | None = None
    cases: list[list[z3.BoolRef]] = field(default_factory=list)
    timeout_ms: int = TIMEOUT_MS
    pins: dict[str, int] = field(default_factory=dict)
    """The fixed bounds, machine-readable (``claims.json`` pins them); by default the ``k=v``
    integers of the name's ``[...]`` suffix."""
    outright: Sequence[str] = ()
    """Goal conjuncts that hold of the encoding for every input, premises or not (see
    ``goal_parts_matter``)."""
    fixed: dict[str, str] = field(default_factory=dict)
    """Variables the premises legitimately pin to a value (name: why), left out of the
    hidden-bound probe; ``claims.json`` pins this list too, so a new entry is visible."""

    def __post_init__(self) -> None:
        if not isinstance(self.goal, dict):
            self.goal = {"goal": self.goal}
        if not self.pins:
            suffix = re.search(r"\[(.*)\]$", self.name)
            if suffix is None:
                raise ValueError(f"claim {self.name}: no [...] bounds in its name, so pins must be given")
            self.pins = {k: int(v) for k, v in (item.split("=") for item in suffix.group(1).split(","))}

    @property
    def conjuncts(self) -> dict[str, z3.BoolRef]:
        assert isinstance(self.goal, dict)
        return self.goal

    @property
    def whole_goal(self) -> z3.BoolRef:
        parts = list(self.conjuncts.values())
        return parts[0] if len(parts) == 1 else z3.And(*parts)


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
    goal = claim.whole_goal
    if claim.split is None:
        queries = [[*fixed, z3.Not(goal)]]
    else:
        # The split premise must imply the disjunction of its cases.
        cover = z3.Or(*[z3.And(*case) for case in claim.cases])
        result, model = _check([claim.premises[claim.split], z3.Not(cover)], claim.timeout_ms)
        if result != z3.unsat:
            report.fail(f"NOT PROVED {claim.name} ({claim.bounds}): the case split of "
                        f"{claim.split!r} is not exhaustive ({result})")
            return
        queries = [[*fixed, *case, z3.Not(goal)] for case in claim.cases]
    for constraints in queries:
        result, model = _check(constraints, claim.timeout_ms)
        if result != z3.unsat:
            detail = f": counterexample {claim.describe(model)}" if model is not None else ""
            report.fail(f"NOT PROVED {claim.name} ({claim.bounds}): z3 says {result}{detail}")
            return
    elapsed = time.perf_counter() - start
    cases = f", {len(queries)} cases" if claim.split is not None else ""
    pins = json.dumps(claim.pins, separators=(",", ":"))
    report.say(f"proved {claim.name} ({claim.bounds}{cases}) in {elapsed:.3f} s pins={pins} fp={fingerprint(claim)}")
    non_vacuity(claim, report)
    goal_parts_matter(claim, report)
    no_hidden_bound(claim, report)


def non_vacuity(claim: Claim, report: Report) -> None:
    result, _ = _check(list(claim.premises.values()), claim.timeout_ms)
    if result != z3.sat:
        report.fail(f"VACUOUS {claim.name}: the premises together are {result}, so the proof says nothing")
        return
    for dropped in claim.essential:
        rest = [p for name, p in claim.premises.items() if name != dropped]
        result, model = _check([*rest, z3.Not(claim.whole_goal)], claim.timeout_ms)
        if result == z3.sat and model is not None:
            report.say(f"non-vacuous {claim.name}: dropping {dropped} gives counterexample {claim.describe(model)}")
        else:
            report.fail(f"VACUOUS {claim.name}: dropping {dropped} gives no counterexample ({result})")


def goal_parts_matter(claim: Claim, report: Report) -> None:
    """Each conjunct of the goal says something: z3 finds an assignment that falsifies it when
    the premises are dropped, so the premises (not the shape of the formula) carry it.

    A conjunct that holds of every input is a fact about the encoding alone (``Box.intersect``'s
    result lies inside both boxes whatever they are); it is accepted only when the claim declares
    it ``outright``, and the declaration is pinned in ``claims.json``. ``claims.json`` also pins
    each conjunct's name and a fingerprint of every premise and conjunct, so a goal that loses a
    conjunct or is weakened in place fails ``run_all.py``.
    """
    for label, part in claim.conjuncts.items():
        result, model = _check([z3.Not(part)], claim.timeout_ms)
        if result == z3.sat and model is not None:
            if label in claim.outright:
                report.fail(f'VACUOUS {claim.name}: goal "{label}" is declared outright but needs the premises')
            else:
                report.say(f'non-vacuous {claim.name}: goal "{label}" fails without the premises: '
                           f"{claim.describe(model)}")
        elif result == z3.unsat and label in claim.outright:
            report.say(f'non-vacuous {claim.name}: goal "{label}" holds of the encoding for every input (outright)')
        else:
            report.fail(f'VACUOUS {claim.name}: goal "{label}" holds without any premise ({result}) '
                        "and is not declared outright")


def fingerprint(claim: Claim) -> str:
    """A short hash of the claim's premises and goal conjuncts (names and formulas)."""
    text = "\n".join(
        [f"premise {name}: {term.sexpr()}" for name, term in claim.premises.items()]
        + [f"goal {name}: {term.sexpr()}" for name, term in claim.conjuncts.items()]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _variables(terms: Iterable[z3.ExprRef]) -> list[z3.ArithRef]:
    """The integer constants (free variables) of ``terms``, in first-seen order."""
    seen: dict[int, z3.ArithRef] = {}
    done: set[int] = set()
    stack = list(terms)
    while stack:
        node = stack.pop()
        if node.get_id() in done:
            continue
        done.add(node.get_id())
        if z3.is_const(node) and node.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            if z3.is_int(node):
                seen.setdefault(node.get_id(), node)
            continue
        stack.extend(node.children())
    return sorted(seen.values(), key=str)


def no_hidden_bound(claim: Claim, report: Report) -> None:
    """Every integer variable of the premises reaches ``|v| >= PROBE`` in some model of them.

    Greedy and incremental: ask for a model where at least one not yet probed variable is that
    large, strike every variable that model makes large, repeat; when that disjunction is not
    found (z3's nonlinear search does better on one bound at a time), ask variable by variable,
    ``v >= PROBE`` then ``v <= -PROBE``. A premise that caps a variable (``e <= 2``) leaves it
    unreachable, and the claim is reported.
    """
    present = _variables(claim.premises.values())
    unknown = set(claim.fixed) - {str(v) for v in present}
    if unknown:
        report.fail(f"VACUOUS {claim.name}: fixed variables {sorted(unknown)} are not variables of its premises")
        return
    remaining = [v for v in present if str(v) not in claim.fixed]
    total = len(remaining)
    solver = _solver(claim.timeout_ms)
    solver.add(*claim.premises.values())
    queries = 0

    def large(*constraints: z3.BoolRef) -> z3.ModelRef | None:
        nonlocal queries
        queries += 1
        solver.push()
        solver.add(*constraints)
        found = solver.model() if solver.check() == z3.sat else None
        solver.pop()
        return found

    stuck: list[z3.ArithRef] = []
    while remaining:
        model = large(z3.Or(*[v >= PROBE for v in remaining]))
        if model is None:
            for v in remaining:
                model = large(v >= PROBE) or large(v <= -PROBE)
                if model is not None:
                    break
            else:
                stuck = remaining
                break
        remaining = [v for v in remaining if abs(ev(model, v)) < PROBE]
    if stuck:
        names = ", ".join(str(v) for v in stuck)
        report.fail(f"VACUOUS {claim.name}: the premises keep {names} below |{PROBE}|: a hidden bound")
        return
    fixed = f", fixed by the premises: {', '.join(sorted(claim.fixed))}" if claim.fixed else ""
    report.say(f"non-vacuous {claim.name}: unbounded: {total} variables each reach |v| >= {PROBE} "
               f"under the premises ({queries} queries){fixed}")


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


# ---------------------------------------------------------------------------------------------
# Evaluating an encoding on concrete values (the differential checks, ``differential.py``)


_INFIX = {
    z3.Z3_OP_ADD: " + ", z3.Z3_OP_SUB: " - ", z3.Z3_OP_MUL: " * ", z3.Z3_OP_LE: " <= ",
    z3.Z3_OP_LT: " < ", z3.Z3_OP_GE: " >= ", z3.Z3_OP_GT: " > ", z3.Z3_OP_EQ: " == ",
    z3.Z3_OP_AND: " and ", z3.Z3_OP_OR: " or ",
}


def compile_terms(variables: Sequence[z3.ExprRef], terms: Sequence[z3.ExprRef]) -> Callable[..., tuple[Any, ...]]:
    """A Python function of ``variables`` (in order) that returns the value of every term.

    The terms themselves are translated, node by node (z3 shares equal subterms, so each node is
    computed once), not a paraphrase of them: what the differential checks compare with the code
    is exactly what the proofs are about. Integer and Boolean terms only; a node of any other kind
    raises ``ValueError`` rather than being guessed at.
    """
    names: dict[int, str] = {}
    for i, v in enumerate(variables):
        if not z3.is_const(v) or v.decl().kind() != z3.Z3_OP_UNINTERPRETED:
            raise ValueError(f"{v} is not a variable")
        names[v.get_id()] = f"v{i}"
    lines: list[str] = []

    def emit(term: z3.ExprRef) -> str:
        stack = [term]
        while stack:
            node = stack[-1]
            key = node.get_id()
            if key in names:
                stack.pop()
                continue
            pending = [c for c in node.children() if c.get_id() not in names]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            names[key] = _node(node, [names[c.get_id()] for c in node.children()], lines, len(names))
        return names[term.get_id()]

    results = [emit(t) for t in terms]
    params = ", ".join(f"v{i}" for i in range(len(variables)))
    body = "\n".join(f"    {line}" for line in lines)
    source = f"def evaluate({params}):\n{body}\n    return ({', '.join(results)},)\n"
    scope: dict[str, Any] = {}
    exec(compile(source, "<encoding>", "exec"), scope)  # the source is built above from z3 nodes only
    return scope["evaluate"]  # type: ignore[no-any-return]


def _node(node: z3.ExprRef, args: list[str], lines: list[str], index: int) -> str:
    kind = node.decl().kind()
    if kind == z3.Z3_OP_ANUM:
        return f"({node.as_long()})"
    if kind == z3.Z3_OP_TRUE:
        return "True"
    if kind == z3.Z3_OP_FALSE:
        return "False"
    name = f"t{index}"
    if kind in _INFIX and args:
        expr = "(" + _INFIX[kind].join(args) + ")"
    elif kind == z3.Z3_OP_UMINUS:
        expr = f"(-{args[0]})"
    elif kind == z3.Z3_OP_NOT:
        expr = f"(not {args[0]})"
    elif kind == z3.Z3_OP_IMPLIES:
        expr = f"((not {args[0]}) or {args[1]})"
    elif kind == z3.Z3_OP_ITE:
        expr = f"({args[1]} if {args[0]} else {args[2]})"
    elif kind == z3.Z3_OP_DISTINCT:
        expr = f"(len({{{', '.join(args)}}}) == {len(args)})"
    elif kind == z3.Z3_OP_AND:
        expr = "True"
    elif kind == z3.Z3_OP_OR:
        expr = "False"
    else:
        raise ValueError(f"cannot evaluate a {node.decl()} node ({node.sexpr()[:80]})")
    lines.append(f"{name} = {expr}")
    return name
