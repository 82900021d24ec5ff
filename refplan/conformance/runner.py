"""Run the conformance corpus against a planner: ``refplan conformance`` and ``python -m refplan.conformance.runner``.

``run_conformance(planner, cases=None, *, select=None) -> Report`` plans every selected case with
the planner (a plain function, an ``Adapter``, or one of the specs ``refplan``, ``deepspeed``,
``pkg.mod:fn`` and ``cmd:"<command>"``, see ``adapters``) and judges the outcome against the
case's expectation:

- ``pass``: the expected outcome. For ``accept``: every parameter's plan passes the independent
  oracle (``verify_plan``), scripted cases read every listed target region from exactly the
  scripted source, and the busiest sender stays within ``max_sender_load`` where one is given.
  For ``refuse``: the exact error class (and, for planners that promise refplan's wording, the
  message fragment; for others a differing message is only a note).
- ``fail``: accepted something that must be refused, refused something valid, wrong error
  class, a plan that fails the oracle, wrong sources for scripted answers, or too much load.
- ``contract``: a peer did what its own documented contract allows and only refplan's rules
  forbid (a partial load, a deliberate refusal of a layout its model classes never change); the
  adapter names the contract. Exits 0 like ``pass``, with its own count.
- ``unsupported``: the case needs a feature the planner does not have, or a peer's own front door
  cannot produce its input (never a pass).
- ``error``: the adapter or planner crashed (no refusal, no plan).

The report prints as a table (case, expected, got, verdict, time) ending in the summary line
``N passed, N failed, N unsupported`` (``, N errors`` when there are any), or as JSON, or as JUnit
XML; the exit code is 1 when anything failed or errored, and also when fewer than
``--min-supported`` cases (default 1) ran at all: a planner for which every case is
``unsupported`` checked nothing, and CI must not read that as green. Each FAIL line carries the
case's ``why``, cut to the terminal's width; ``--dump CASE`` writes a case's planner input (what a
``cmd:`` planner reads on stdin) for debugging it alone. ``--markdown FILE`` writes the committed
comparison of refplan and DeepSpeed (``docs/conformance.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._progress import Progress
from ..box import Box, box_in_shard, decode_row_major, volume
from ..errors import describe_exception
from ..formats import output_file_name, terminal_text, write_text_file, xml_text
from ..verify import verify_plans
from .adapters import Adapter, FunctionAdapter, Outcome, make_adapter
from .corpus import ALWAYS_INPUT_KEYS, CASES_DIR, INPUT_KEYS, Case, CaseFormatError, load_cases, select_cases

__all__ = [
    "CaseResult",
    "Interrupted",
    "Report",
    "add_conformance_arguments",
    "judge",
    "main",
    "run_conformance",
    "run_conformance_cli",
    "write_markdown",
]

VERDICTS = ("pass", "fail", "unsupported", "error", "quality", "contract", "unverifiable", "enhancement")


@dataclass(frozen=True)
class CaseResult:
    """One case's verdict."""

    case_id: str
    family: str
    why: str
    expected: str
    got: str
    verdict: str
    reason: str = ""
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    load_ratio: float | None = None
    """For an accepted, correct plan: busiest sender over the LP lower bound (``None`` when no
    sender is loaded or the case was not accepted)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "load_ratio": None if self.load_ratio is None else round(self.load_ratio, 4),
            "case": self.case_id,
            "family": self.family,
            "why": self.why,
            "expected": self.expected,
            "got": self.got,
            "verdict": self.verdict,
            "reason": self.reason,
            "seconds": round(self.seconds, 6),
            "notes": list(self.notes),
        }


@dataclass
class Report:
    """Verdicts of one planner over the selected cases, in corpus order."""

    planner: str
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    incomplete: bool = False
    """The run was interrupted (Ctrl-C): ``results`` holds the cases that finished, and every
    report form says so, so that a partial run is never read as the whole corpus."""

    def counts(self) -> dict[str, int]:
        """Cases per verdict. ``contract`` and ``enhancement`` (given only by peer adapters) and
        ``unverifiable`` are listed when any case has them, so the counts of every other planner
        keep their five keys."""
        out = dict.fromkeys(VERDICTS, 0)
        for r in self.results:
            out[r.verdict] += 1
        for rare in ("contract", "unverifiable", "enhancement"):
            if not out[rare]:
                del out[rare]
        return out

    def summary_line(self) -> str:
        c = self.counts()
        line = f"{c['pass']} passed, {c['fail']} failed, {c['unsupported']} unsupported"
        if c["error"]:
            line += f", {c['error']} errors"
        if c["quality"]:
            line += f", {c['quality']} quality"
        if c.get("enhancement"):
            line += f", {c['enhancement']} enhancement"
        if c.get("contract"):
            line += f", {c['contract']} contract"
        if c.get("unverifiable"):
            line += f", {c['unverifiable']} unverifiable"
        return line

    def quality_line(self) -> str:
        """Plan quality over every accepted, correct plan: worst and median busiest sender over
        the LP lower bound, and how many cases exceed what the case allows."""
        ratios = sorted(r.load_ratio for r in self.results if r.load_ratio is not None)
        c = self.counts()
        designed = c.get("enhancement", 0)
        over = f"{c['quality'] + designed} over the case's bound" + (
            f" ({designed} by the peer's documented design)" if designed else "")
        if not ratios:  # every lower bound is 0 (all local): no ratio, but a plan may still exceed a bound
            return f"quality: no lower bound above 0; {over}"
        median = ratios[len(ratios) // 2]
        return (f"quality: busiest sender / lower bound over {len(ratios)} plans: median {median:.2f}x, worst "
                f"{ratios[-1]:.2f}x; {over}")

    @property
    def ok(self) -> bool:
        """Nothing failed or errored, and every plan could be checked: a plan the oracle cannot
        judge shows no conformance, so it never lets a run read as clean."""
        c = self.counts()
        return c["fail"] == 0 and c["error"] == 0 and not c.get("unverifiable")

    @property
    def supported(self) -> int:
        """Cases that ran (every verdict but ``unsupported``): what the run actually checked."""
        return len(self.results) - self.counts()["unsupported"]

    def exit_code_for(self, min_supported: int = 1) -> int:
        """1 on any failure, error or unverifiable plan, or when fewer than ``min_supported`` cases
        ran; else 0."""
        return 0 if self.ok and self.supported >= min_supported else 1

    @property
    def exit_code(self) -> int:
        return self.exit_code_for(1)

    def by_id(self) -> dict[str, CaseResult]:
        return {r.case_id: r for r in self.results}

    def table(self, *, reasons: bool = True, width: int | None = None) -> str:
        """Fixed-width text: one row per case, then every non-pass reason, then the summary.

        Each reason line names the case and its ``why`` and is wrapped to ``width`` columns (the
        terminal's, by default) and cut after a few lines; ``--json`` keeps the full text.
        """
        rows = [("case", "expected", "got", "verdict", "load/LB", "time")]
        for r in self.results:
            ratio = "" if r.load_ratio is None else f"{r.load_ratio:.2f}x"
            rows.append((r.case_id, r.expected, terminal_text(r.got), r.verdict, ratio, f"{r.seconds * 1000:.1f} ms"))
        widths = [min(max(len(row[i]) for row in rows), 60) for i in range(5)]
        lines = []
        for row in rows:
            cells = [row[i][: widths[i]].ljust(widths[i]) for i in range(5)]
            lines.append("  ".join([*cells, row[5].rjust(9)]).rstrip())
        if reasons:
            cols = width if width is not None else shutil.get_terminal_size((100, 24)).columns
            for r in self.results:
                if r.verdict != "pass":
                    lines += _reason_lines(r, max(cols, 40))
        lines.append(self.quality_line())
        partial = " (interrupted: only the cases above ran)" if self.incomplete else ""
        lines.append(f"{self.planner}: {self.summary_line()} ({self.seconds:.2f} s){partial}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "incomplete": self.incomplete,
            "planner": self.planner,
            "summary": self.summary_line(),
            "counts": self.counts(),
            "quality": self.quality_line(),
            "seconds": round(self.seconds, 3),
            "results": [r.to_dict() for r in self.results],
        }

    def junit_xml(self, *, fail_on_quality: bool = False) -> str:
        """JUnit XML: one testcase per case (classname = family); fail, error, unverifiable (an
        error: the check could not be made) and unsupported mapped; quality, enhancement and contract
        results carry a property, and quality (never enhancement: the peer's design, not a defect) is
        a failure under ``fail_on_quality``, as in the exit code."""
        c = self.counts()
        quality_fails = c["quality"] if fail_on_quality else 0
        suite = ET.Element(
            "testsuite",
            # The planner's name is the user's command or entry point: escaped as reasons are.
            name=xml_text(f"refplan-conformance[{self.planner}]"),
            tests=str(len(self.results)),
            failures=str(c["fail"] + quality_fails),
            errors=str(c["error"] + c.get("unverifiable", 0)),
            skipped=str(c["unsupported"]),
            time=f"{self.seconds:.3f}",
        )
        if self.incomplete:
            properties = ET.SubElement(suite, "properties")
            ET.SubElement(properties, "property", name="incomplete", value="true")
        for r in self.results:
            case = ET.SubElement(suite, "testcase", classname=f"conformance.{r.family}", name=r.case_id,
                                 time=f"{r.seconds:.6f}")
            # A reason quotes a peer's own error text, which may hold what XML cannot (a terminal's
            # colour codes): written as ``xml_text`` escapes, or no CI reader could parse the file.
            reason = xml_text(r.reason)
            if r.verdict == "fail":
                failure = ET.SubElement(case, "failure", message=reason[:500])
                failure.text = xml_text(f"expected {r.expected}, got {r.got}")
            elif r.verdict in ("error", "unverifiable"):
                text = reason if r.verdict == "error" else f"unverifiable: {reason}"
                ET.SubElement(case, "error", message=text[:500]).text = text
            elif r.verdict == "quality" and fail_on_quality:
                failure = ET.SubElement(case, "failure", message=f"quality: {reason}"[:500])
                failure.text = xml_text(f"expected {r.expected}, got {r.got}")
            elif r.verdict == "quality":  # a pass for CI unless asked otherwise, marked as contract is
                properties = ET.SubElement(case, "properties")
                ET.SubElement(properties, "property", name="quality", value=reason[:500])
            elif r.verdict == "unsupported":
                ET.SubElement(case, "skipped", message=reason[:500])
            elif r.verdict in ("contract", "enhancement"):  # a pass for CI, marked so that it is never
                properties = ET.SubElement(case, "properties")  # read as conformance
                ET.SubElement(properties, "property", name=r.verdict, value=reason[:500])
        suites = ET.Element("testsuites")
        suites.append(suite)
        return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


_REASON_LINES = 4
_RULE_TAG = re.compile(r"R[0-9]+")
RULES_DOC = Path(__file__).resolve().parent.parent / "spec" / "validation.md"
"""The validation rules R0-R32 that case ids and tags name, installed with the package."""


def _reason_lines(result: CaseResult, width: int) -> list[str]:
    """``VERDICT case: why`` then the reason, indented, wrapped to ``width`` and cut short."""
    head = textwrap.shorten(f"{result.verdict.upper()} {result.case_id}: {terminal_text(result.why)}", width,
                            placeholder=" …")
    body = textwrap.wrap(terminal_text(result.reason), width - 4, break_on_hyphens=False) or [""]
    if len(body) > _REASON_LINES:
        suffix = " … (full text: --json)"
        last = body[_REASON_LINES - 1]
        room = width - 4 - len(suffix)
        if len(last) > room:
            last = last[:room].rsplit(" ", 1)[0] if " " in last[:room] else last[:room]
        body = [*body[: _REASON_LINES - 1], last + suffix]
    lines = [head, *("    " + line for line in body)]
    rules = [t for t in result.tags if _RULE_TAG.fullmatch(t)]
    if rules:
        lines.append(f"    rule {', '.join(rules)}: {RULES_DOC}")
    return lines


# ---------------------------------------------------------------------------------------------
# Judging an accepted plan beyond the oracle: exact sources and sender load.


class _Unverifiable(Exception):
    pass


_EXPAND_LIMIT = 1 << 16


def _local_boxes(offset: int, strides: Sequence[int], shape: Sequence[int], shard: Sequence[int]) -> list[Box]:
    """The shard boxes a segment writes: itself when it is a box, else its elements (bounded)."""
    origin = box_in_shard(offset, shape, strides, shard)
    if origin is not None:
        return [Box(origin, tuple(shape))]
    count = volume(shape)
    if count > _EXPAND_LIMIT:
        raise _Unverifiable(f"a {tuple(shape)} segment is not a box in its shard and too large to expand")
    out: list[Box] = []
    for flat in range(count):
        idx = []
        for size in reversed(shape):
            flat, i = divmod(flat, size)
            idx.append(i)
        address = offset + sum(i * s for i, s in zip(reversed(idx), strides))
        coord = decode_row_major(address, shard)
        if coord is None:
            raise _Unverifiable(f"address {address} lies outside the shard {tuple(shard)}")
        out.append(Box(coord, (1,) * len(shard)))
    return out


def _target_pieces(doc: Mapping[str, Any]) -> dict[int, tuple[tuple[int, ...], list[tuple[Box, tuple[int, ...]]]]]:
    """Per target location: shard shape and (local box, logical origin) of each non-empty piece."""
    logical = tuple(doc["logical_shape"])
    out: dict[int, tuple[tuple[int, ...], list[tuple[Box, tuple[int, ...]]]]] = {}
    for key, entry in doc["ranks"].items():
        shard = tuple(entry["shard_shape"] or ())
        pieces: list[tuple[Box, tuple[int, ...]]] = []
        for p in entry["pieces"]:
            if volume(p["shape"]) == 0:
                continue
            local = decode_row_major(p["dest"][0], shard)
            origin = decode_row_major(p["source"][0], logical)
            if local is None or origin is None:
                continue
            pieces.append((Box(local, tuple(p["shape"])), origin))
        out[int(key)] = (shard, pieces)
    return out


def _check_sources(case: Case, plans: Mapping[str, Any]) -> str | None:
    """``None`` if every listed target region is read from its scripted source, else why not."""
    sources = case.expect.sources or ()
    written: dict[tuple[str, int], list[tuple[Box, int]]] = {}
    for name in sorted({s["parameter"] for s in sources}):
        pieces = _target_pieces(case.parameters[name]["target"])
        for seg in plans[name]["segments"]:
            s_loc = seg["source"][0]
            t_loc, t_off, t_strides = seg["target"]
            shard, frames = pieces[t_loc]
            for lb in _local_boxes(t_off, t_strides, seg["shape"], shard):
                for local, origin in frames:
                    cut = lb.intersect(local)
                    if cut is None:
                        continue
                    logical = tuple(o + c - lo for o, c, lo in zip(origin, cut.origin, local.origin))
                    written.setdefault((name, t_loc), []).append((Box(logical, cut.extent), s_loc))
    for s in sources:
        box = Box(tuple(s["logical_origin"]), tuple(s["shape"]))
        covered = 0
        for wbox, loc in written.get((s["parameter"], s["target_location"]), []):
            cut = box.intersect(wbox)
            if cut is None:
                continue
            covered += cut.volume
            if loc != s["source_location"]:
                return (
                    f"parameter {s['parameter']!r}, target location {s['target_location']}: {cut} is read from "
                    f"source location {loc}, the answer names {s['source_location']}"
                )
        if covered != box.volume:
            return (
                f"parameter {s['parameter']!r}, target location {s['target_location']}: only {covered} of the "
                f"{box.volume} elements of {box} are written"
            )
    return None


def sender_loads(
    case: Case, plans: Mapping[str, Any], placement: Mapping[str, Mapping[int, int]] | None = None
) -> dict[int, int]:
    """Bytes (elements without ``element_size``) per sending process (location without endpoints,
    unless the adapter placed the locations: ``Outcome.placement``).

    ``element_size`` is read by ``Case.unit``: one ``int`` is every parameter's size (the maps
    format's ``"element_size": 2``, which ``parse_case`` accepts; before, ``sizes.get`` on it ended
    in ``AttributeError``), a mapping gives one per parameter (1 for a name it lacks)."""
    bound = case.processes(placement)
    src_proc, tgt_proc = bound if bound is not None else (None, None)
    load: dict[int, int] = {}
    for name, plan in plans.items():
        unit = case.unit(name)
        for seg in plan["segments"]:
            src, tgt = seg["source"][0], seg["target"][0]
            if src_proc is not None and tgt_proc is not None:
                if src_proc.get(src) is not None and src_proc.get(src) == tgt_proc.get(tgt):
                    continue  # a local copy (an unbound location is never one)
                src = src_proc.get(src, src)
            load[src] = load.get(src, 0) + volume(seg["shape"]) * unit
    return load


def _oracle_says(case: Case, outcome: Outcome) -> str:
    """What the oracle finds in a plan for a case that must be refused: the counterexample (or the
    map error) that shows why accepting it was wrong; empty when the plans cannot be judged."""
    try:
        pairs = case.map_pairs()
        checked = verify_plans(pairs, dict(outcome.plans or {}))
    except Exception:  # malformed maps the oracle's loader refuses: the class already says enough
        return ""
    bad = [str(v) for v in checked.verdicts.values() if not v.ok]
    return f"; the oracle: {bad[0]}" if bad else ""


def load_ratio(
    case: Case, plans: Mapping[str, Any], placement: Mapping[str, Mapping[int, int]] | None = None
) -> float | None:
    """Busiest sender of ``plans`` over the LP lower bound of the case's requests (``None`` when
    the bound is zero: nothing had to be sent, or the requests cannot be collected). With an
    adapter's ``placement`` (and no endpoints in the case), both on those processes."""
    from ..analysis import load_lower_bound
    from ..formats import parse_maps
    from ..planner import collect_requests
    from ..requests import TransferEndpoints

    try:
        batch = parse_maps(case.maps_doc())
        endpoints = batch.endpoints
        if endpoints is None and placement is not None:
            endpoints = TransferEndpoints(dict(placement["source"]), dict(placement["target"]))
        requests = collect_requests(batch.pairs, endpoints=endpoints, element_size=batch.element_size,
                                    process_node=batch.process_node)
    except Exception:  # a case refplan refuses has no bound; judge() has already said what matters
        return None
    bound = load_lower_bound(requests).bytes
    if bound <= 0:
        return None
    return max(sender_loads(case, plans, placement).values(), default=0) / float(bound)


def read_plans(outcome: Outcome) -> tuple[Outcome, str | None]:
    """An accepted outcome with each plan read once by ``TransferPlan.from_dict``, as ``refplan
    verify`` reads a plans file, and given back in its dict form; or the outcome and why its
    plans cannot be read (a name that is not a string, a plan without ``logical_shape``, segments
    that are not a list of segments).

    Why: the judge reads plans in several places (the oracle, the scripted sources, the loads, the
    report's "got" column). Read raw, a plan the oracle's reader let through (no
    ``logical_shape``) passed, and one it refused crashed a later reader with a traceback; read
    once here, every reader sees one well-formed plan, and a malformed one is that case's ``fail``.
    """
    if outcome.kind != "accept":
        return outcome, None
    from ..plan import TransferPlan

    read: dict[str, Any] = {}
    for name, plan in (outcome.plans or {}).items():
        if not isinstance(name, str):
            return outcome, f"the plans are malformed: parameter names must be strings, got {type(name).__name__}"
        try:
            read[name] = TransferPlan.from_dict(plan).to_dict()
        except Exception as exc:
            return outcome, f"the plan for parameter {name!r} is malformed: {describe_exception(exc)}"
    return dataclasses.replace(outcome, plans=read), None


def judge(case: Case, outcome: Outcome, adapter: Adapter) -> tuple[str, str, tuple[str, ...]]:
    """(verdict, reason, notes) for one outcome: ``_judge``'s, where a ``fail`` or ``quality`` the
    adapter explains by the peer's own contract (``Outcome.contract``) becomes ``contract``, its
    reason the contract and then what refplan's rules say, and a ``quality`` result the adapter
    names as the peer's documented design (``by_design``) becomes ``enhancement``; one whose loads
    the adapter says are no load the peer's users meet (``Outcome.unjudged_loads``) is a ``pass``
    with that note. Plans that cannot be read (``read_plans``) are a ``fail`` that no contract
    excuses."""
    outcome, malformed = read_plans(outcome)
    return _judge_read(case, outcome, malformed, adapter)


def _judge_read(
    case: Case, outcome: Outcome, malformed: str | None, adapter: Adapter
) -> tuple[str, str, tuple[str, ...]]:
    """``judge`` of an outcome ``read_plans`` has read (``malformed``: why its plans could not be)."""
    if malformed is not None:
        return "fail", malformed, tuple(outcome.notes)
    verdict, reason, notes = _judge(case, outcome, adapter)
    kind = ""
    if verdict == "quality":
        kind = "quality"
    elif verdict == "fail" and outcome.kind == "accept" and case.expect.outcome == "refuse":
        kind = "accept"  # accepted what refplan must refuse; a wrong plan for a valid case is never excused
    elif verdict == "fail" and outcome.kind == "refuse" and case.expect.outcome == "accept":
        kind = "refuse"
    elif verdict == "fail" and outcome.kind == "refuse" and case.expect.outcome == "refuse":
        kind = "class"  # refused, as it must be, under another class than refplan's
    if verdict == "quality" and outcome.unjudged_loads:  # the copies passed; the loads are no user's
        return "pass", "", (*notes, f"{outcome.unjudged_loads} (refplan: {reason})")
    for excused, why, *refusal in outcome.contract:
        if excused == kind and (not refusal or re.search(refusal[0], outcome.message)):
            return "contract", f"{why} (refplan: {reason})", notes
    by_design = getattr(adapter, "by_design", None)
    if verdict == "quality" and outcome.design:
        # The answer reads every region where the peer's documented rule puts it (checked on the
        # answer by its adapter): the load is that design's, an enhancement to ask for.
        return "enhancement", f"{reason} — by design: {outcome.design}", notes
    if verdict == "quality" and callable(by_design) and by_design(case.id):
        # The peer's documented design makes this load (findings.py names where it says so): an
        # enhancement to ask for, counted apart from the defects a maintainer would take as bugs.
        verdict = "enhancement"
    return verdict, reason, notes


def _judge(case: Case, outcome: Outcome, adapter: Adapter) -> tuple[str, str, tuple[str, ...]]:
    """(verdict, reason, notes) for one outcome, before any contract.

    Correctness comes first: a wrong plan, a crash or a wrong refusal is a ``fail``. A correct plan
    that misses only what the RFC's *batch policy* promises (the busiest sender within
    ``max_sender_load``, local holders used where the case pins them without scripting answers)
    is ``quality``: reported in its own count, never hiding or hidden by a correctness result.
    Scripted sources stay correctness: the planner was told exactly whom to read from.
    """
    expect = case.expect
    notes = list(outcome.notes)
    if outcome.kind == "unsupported":
        return "unsupported", outcome.message, tuple(notes)
    if outcome.kind == "error":
        return "error", outcome.message, tuple(notes)
    if outcome.kind == "crash":
        return "fail", f"the planner crashed: {outcome.error}: {outcome.message}", tuple(notes)
    peer = getattr(adapter, "peer_refusals", False)
    if expect.outcome == "refuse":
        if outcome.kind == "accept" and peer and expect.error == "UnsupportedLayoutError":
            # The reference leaves this layout out of its scope (rebuild and re-shard); a peer that
            # plans it is judged by the oracle alone: only a wrong plan is a failure.
            pairs = case.map_pairs()
            checked = verify_plans(pairs, dict(outcome.plans or {}))
            if checked.ok:
                notes.append("plans a layout the reference leaves unsupported; the oracle finds the plan exact")
                return "pass", "", tuple(notes)
            bad = [str(v) for v in checked.verdicts.values() if not v.ok]
            if all(v.status in ("invalid_map", "unverifiable") for v in checked.verdicts.values() if not v.ok):
                return "unsupported", ("plans a layout outside the reference's scope, which the oracle cannot "
                                       "judge: " + "; ".join(bad)), tuple(notes)
            return "fail", "planned a layout the reference leaves unsupported, wrongly: " + "; ".join(bad), tuple(notes)
        if outcome.kind == "accept":
            why = f"accepted something that must be refused ({expect.error}){_oracle_says(case, outcome)}"
            return "fail", why, tuple(notes)
        if peer:
            notes.append(f"refused with its own {outcome.error}: {outcome.message}")
            return "pass", "", tuple(notes)
        if outcome.error != expect.error:
            return "fail", f"wrong error class: expected {expect.error}, got {outcome.error}: {outcome.message}", tuple(
                notes
            )
        if expect.message and not re.search(expect.message, outcome.message, re.IGNORECASE):
            what = f"message does not match /{expect.message}/: {outcome.message}"
            if adapter.strict_messages:
                return "fail", what, tuple(notes)
            notes.append(what)
        return "pass", "", tuple(notes)
    if outcome.kind == "refuse":
        return "fail", f"refused something valid: {outcome.error}: {outcome.message}", tuple(notes)
    plans = dict(outcome.plans or {})
    missing = sorted(set(case.parameters) - set(plans))
    if missing:
        return "fail", f"no plan for parameter(s) {', '.join(map(repr, missing))}", tuple(notes)
    pairs = case.map_pairs()
    verdict = verify_plans(pairs, plans)
    if not verdict.ok:
        bad = [str(v) for v in verdict.verdicts.values() if not v.ok]
        if all(v.status == "unverifiable" for v in verdict.verdicts.values() if not v.ok):
            # Neither shown right nor shown wrong: a correct plan in a form the oracle cannot reason
            # about must not read as a failure, nor anything the oracle did not check as a pass.
            return "unverifiable", "the oracle cannot check the plan: " + "; ".join(bad), tuple(notes)
        return "fail", "plan fails the oracle: " + "; ".join(bad), tuple(notes)
    over = _over_budget(case, plans)
    if over is not None:
        return "fail", over, tuple(notes)
    differ = [n for n in notes if "requests differ" in n]
    if differ:
        return "fail", differ[0], tuple(notes)
    scripted = case.answers is not None
    if expect.sources is not None:
        try:
            problem = _check_sources(case, plans)
        except _Unverifiable as exc:
            problem = f"sources could not be checked: {exc}"
        if problem is not None:
            if scripted:
                return "fail", f"wrong sources: {problem}", tuple(notes)
            return "quality", f"a local holder was not used: {problem}", tuple(notes)
    if expect.max_sender_load is not None:
        load = sender_loads(case, plans, outcome.placement)
        busiest = max(load.values(), default=0)
        if busiest > expect.max_sender_load:
            who = max(load, key=lambda k: (load[k], -k))
            return "quality", (
                f"the busiest sender ({who}) moves {busiest} > {expect.max_sender_load}; "
                f"loads {dict(sorted(load.items()))}"
            ), tuple(notes)
    return "pass", "", tuple(notes)


# ---------------------------------------------------------------------------------------------


PLAN_LIMITS = ("max_segments", "max_plan_bytes")
"""The budget fields a plan's own size shows, checked on every accepted plan of a case that sets
them (``_over_budget``); the others bound the planner's work or its input, which no answer shows."""


def _over_budget(case: Case, plans: Mapping[str, Any]) -> str | None:
    """Why an accepted plan breaks the case's budget, or ``None``. A budget is a limit the plan must
    stay within, else refuse (spec/conformance.md), the same per parameter as refplan's planner
    applies it (R31, R32); a planner that ignored it and split every copy into one-element segments
    passed the cases that exist to test it (an outside probe, 2026-12-07)."""
    from ..plan import TransferPlan

    budget = case.raw.get("budget") or {}
    limits = {name: budget[name] for name in PLAN_LIMITS if name in budget}
    if not limits:
        return None
    for name in sorted(plans):
        plan = TransferPlan.from_dict(plans[name])
        sizes = {"max_segments": (len(plan.segments), "segments"), "max_plan_bytes": (len(plan.encode()), "bytes")}
        for field_name, limit in limits.items():
            size, unit = sizes[field_name]
            if size > limit:
                return (f"over the case's budget: parameter {name!r}'s plan has {size} {unit}, above "
                        f"{field_name}={limit} (a plan stays within its budget, else the case is refused)")
    return None


def run_conformance(
    planner: str | Adapter | Callable[[dict[str, Any]], Any],
    cases: str | Path | Sequence[Case] | None = None,
    *,
    select: str | Sequence[str] | None = None,
    timeout: float = 60.0,
    progress: Callable[[CaseResult], None] | None = None,
    supports: Iterable[str] | None = None,
    once: bool = False,
) -> Report:
    """Run ``cases`` (default: the packaged corpus; or a case file, directory, glob or list of
    ``Case``) through ``planner`` and judge each one.

    ``planner`` is a spec string (``make_adapter``), an ``Adapter``, or a plain function taking a
    case input dict and returning an answer dict (the ``cmd:`` protocol, in-process).

    ``select`` keeps the cases whose id, family prefix or tag matches one of its globs (e.g.
    ``"rules/*"``, ``"R17"``, ``"*billion*"``). Raises ``ValueError`` for an unusable planner spec
    and ``CaseFormatError`` for a malformed case file.

    ``supports`` declares the input keys (``corpus.INPUT_KEYS``) the planner implements; without
    it, a planner function's own ``supports`` attribute does. A case whose input carries a key
    outside the declaration (``Case.input_keys()``) is ``unsupported``, naming the keys, and is
    not run: a planner that ignores ``answers`` or ``budget`` would plan another problem and
    read as ``fail``. No declaration at all: every case runs, as before.

    An external planner (a function or ``cmd:``; ``Adapter.twice``) plans each case twice, and
    two different answers on one input are a ``fail`` (``_run_case``); ``once=True`` plans it once.

    Ctrl-C (``KeyboardInterrupt``) during the run raises ``Interrupted``, a ``KeyboardInterrupt``
    carrying the report of the cases that finished (``incomplete`` set).
    """
    if isinstance(planner, Adapter):
        adapter = planner
    elif isinstance(planner, str):
        adapter = make_adapter(planner, timeout=timeout)
    elif callable(planner):
        adapter = FunctionAdapter(planner)
    else:
        raise TypeError(f"planner must be a spec string, an Adapter or a function, got {type(planner).__name__}")
    declared = _declared_keys(supports if supports is not None else _supports_attribute(planner, adapter))
    loaded = list(cases) if isinstance(cases, Sequence) and not isinstance(cases, str) else load_cases(cases)
    chosen = select_cases(loaded, select)
    report = Report(adapter.name)
    start = time.perf_counter()
    try:
        for case in chosen:
            undeclared = sorted(case.input_keys() - declared) if declared is not None else []
            if undeclared:
                result = CaseResult(
                    case.id, case.family, case.why, case.expect.describe(), "unsupported", "unsupported",
                    f"needs input key(s) {', '.join(undeclared)}, which the planner does not declare in supports",
                    0.0, (), case.tags,
                )
            else:
                result = _run_case(case, adapter, twice=adapter.twice and not once)
            report.results.append(result)
            if progress is not None:
                progress(result)
    except KeyboardInterrupt:
        report.incomplete = True
        report.seconds = time.perf_counter() - start
        raise Interrupted(report, len(chosen)) from None
    report.seconds = time.perf_counter() - start
    return report


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_conformance``: still a ``KeyboardInterrupt`` (a caller that does not
    know this class stops as it would), carrying ``report`` (the finished cases, ``incomplete``
    set) and ``selected`` (how many cases the run had), so the CLI can write what it has."""

    def __init__(self, report: Report, selected: int) -> None:
        super().__init__(f"interrupted after {len(report.results)} of {selected} cases")
        self.report = report
        self.selected = selected


def _run_case(case: Case, adapter: Adapter, *, twice: bool = False) -> CaseResult:
    """One case planned and judged. ``twice``: planned once more, and a second answer other than the
    first (another outcome, error class or plan) fails a case the first answer did not already
    fail. Why: every process of a sync plans for itself and the executor agrees on the plans'
    digest, so the same input must give the same plan; a planner that picked a random holder and
    shuffled its segments passed every case it was given (an outside probe, 2026-12-07)."""
    outcome, malformed = read_plans(adapter.run(case))  # once: the judge and the loads read these plans
    verdict, reason, notes = _judge_read(case, outcome, malformed, adapter)
    if twice and verdict not in ("fail", "error", "unsupported"):
        again, _ = read_plans(adapter.run(case))
        first, second = _answer_key(outcome), _answer_key(again)
        if first != second:
            what = "a different plan" if first[0] == second[0] else f"{second[0]} after {first[0]}"
            verdict, reason = "fail", f"not deterministic: planned twice, the same input gave {what}"
    cause = getattr(adapter, "cause", None)
    if verdict in ("fail", "quality", "enhancement") and callable(cause):  # a peer names the root cause
        named = cause(case.id, verdict)
        if verdict == "quality" and outcome.defect and "not yet explained" in named:
            named = outcome.defect  # a drawn case whose answer the adapter recognised as a published defect
        if not (verdict == "enhancement" and outcome.design and "not yet explained" in named):
            reason = f"{reason} — {named}"  # a drawn case's design check is its own explanation
    ratio = None
    if (verdict in ("pass", "quality", "enhancement", "contract") and outcome.kind == "accept"
            and case.expect.outcome == "accept"):
        ratio = load_ratio(case, outcome.plans or {}, outcome.placement)
    return CaseResult(
        case.id, case.family, case.why, case.expect.describe(), outcome.describe(), verdict, reason,
        outcome.seconds, notes, case.tags, ratio,
    )


def _answer_key(outcome: Outcome) -> tuple[str, str]:
    """What two calls on one input must agree on: the outcome, a refusal's class, the plans
    (canonical JSON of what ``read_plans`` read). Messages and timings may differ."""
    if outcome.kind == "refuse":
        return f"a refusal ({outcome.error})", ""
    if outcome.kind == "accept":
        return "a plan", json.dumps(outcome.plans, sort_keys=True, separators=(",", ":"), default=str)
    return outcome.describe(), outcome.message if outcome.kind == "error" else ""


def _supports_attribute(planner: Any, adapter: Adapter) -> Any:
    """A planner function's ``supports`` attribute (also through ``pkg.module:function``), or ``None``."""
    function = planner if callable(planner) and not isinstance(planner, Adapter) else getattr(adapter, "_fn", None)
    return getattr(function, "supports", None)


def _declared_keys(value: Any) -> frozenset[str] | None:
    """The declared input keys as a set, the always-present ones added; ``ValueError`` for a key
    the input format does not have, so a misspelt declaration cannot silently skip cases."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"supports must be a set of input key names, got {type(value).__name__}")
    keys = list(value)
    unknown = sorted(str(k) for k in keys if k not in INPUT_KEYS)
    if unknown:
        raise ValueError(
            f"supports names unknown input key(s) {', '.join(unknown)}; the input keys are {', '.join(INPUT_KEYS)}"
        )
    return frozenset(keys) | ALWAYS_INPUT_KEYS


# ---------------------------------------------------------------------------------------------
# docs/conformance.md

_REPRO_DIR = "docs/peers"


def _repro(case_id: str, planner: str) -> str:
    """The standalone script under ``docs/peers/`` that shows ``planner``'s result on a case with
    the peer alone: the script of the finding (``peers.findings``) the case witnesses."""
    from .peers.findings import FINDINGS

    for finding in FINDINGS:
        script = Path(__file__).resolve().parents[2] / _REPRO_DIR / finding.script
        if planner.startswith(finding.peer) and case_id in finding.witnesses and finding.script and script.exists():
            return f" Reproduce with the peer alone: `python {_REPRO_DIR}/{finding.script}`."
    return ""


def _quality_lines(report: Report) -> list[str]:
    """The quality results of the DeepSpeed section: correct plans whose busiest sender exceeds the
    case's bound. Its adapter names no cause per result (the cause it knows, the first-holder
    default, is a ``contract``), so any listed here are unexplained, and the heading says so."""
    quality = [r for r in report.results if r.verdict == "quality"]
    if not quality:
        return []
    lines = ["### Quality, not yet explained (correct plans, busiest sender over the case's bound)", ""]
    for r in quality:
        ratio = "" if r.load_ratio is None else f" ({r.load_ratio:.2f}x the LP lower bound)"
        lines.append(f"- `{r.case_id}` ({_md(r.why)}): {_md(r.reason)}{ratio}." + _repro(r.case_id, report.planner))
    return [*lines, ""]


def _finding_lines(report: Report) -> list[str]:
    """A peer's ``fail``, ``quality`` and ``enhancement`` results grouped by root cause (``peers.findings``): one
    entry per cause with its peer file:line, the configuration that reaches it, its witnesses and
    its script; then any result no entry explains, case by case."""
    from .peers.findings import cause_of

    found = [r for r in report.results if r.verdict in ("fail", "quality", "enhancement", "error")]
    if not found:
        return []
    lines = ["### Findings, by root cause", ""]
    groups: dict[str, tuple[Any, list[CaseResult]]] = {}
    loose: list[CaseResult] = []
    for r in found:
        finding = cause_of(report.planner, r.case_id, r.verdict)
        if finding is None:
            loose.append(r)
        else:
            groups.setdefault(finding.title, (finding, []))[1].append(r)
    for finding, results in groups.values():
        lines += [f"#### {finding.title} ({finding.verdict}, {len(results)} cases)", "",
                  f"{finding.why}", "",
                  f"- Cause ({finding.version}): {finding.cause}.",
                  f"- Reached by: {finding.configuration}."]
        if finding.script:
            lines.append(f"- Reproduce with the peer alone (expected beside actual): "
                         f"`python {_REPRO_DIR}/{finding.script}`.")
        lines.append("- Witnesses:")
        for r in results:
            ratio = "" if r.load_ratio is None else f" ({r.load_ratio:.2f}x the LP lower bound)"
            head = _md(r.reason.split(" — ")[0])
            lines.append(f"  - `{r.case_id}` ({_md(r.why)}): {head}{ratio}.")
        lines.append("")
    if loose:
        lines += ["#### Not yet explained", ""]
        for r in loose:
            lines.append(f"- `{r.case_id}` ({_md(r.why)}): {r.verdict}: expected {r.expected}, got {r.got}. "
                         f"{_md(r.reason)}")
        lines.append("")
    return lines


def _contract_lines(report: Report) -> list[str]:
    """The ``contract`` results, grouped by the peer's contract that allows them."""
    groups: dict[str, list[str]] = {}
    for r in report.results:
        if r.verdict == "contract":
            key = r.reason.split(" (refplan: ")[0]
            key = re.sub(r" \(parameter '[^']*'\)", "", key)
            key = re.sub(r"partition_dim \d+ -> \d+", "partition_dim changes", key)
            key = re.sub(r"inference TP \d+ and training TP \d+", "inference and training TP sizes", key)
            groups.setdefault(key, []).append(r.case_id)
    if not groups:
        return []
    lines = [f"### Contract ({sum(map(len, groups.values()))}): what the peer's own contract allows and refplan's "
             "rules forbid", ""]
    for key, ids in groups.items():
        lines.append(f"- {_md(key)} ({len(ids)}): " + ", ".join(f"`{i}`" for i in ids) + ".")
    return [*lines, ""]


def _peer_section(report: Report) -> list[str]:
    """One peer's section: counts, the findings by root cause, the contract results by contract,
    and the unsupported cases grouped by reason."""
    c = report.counts()
    expressible = len(report.results) - c["unsupported"]
    from .peers import PEER_NOTES

    note = next((text for key, text in PEER_NOTES.items() if report.planner.startswith(key)), "")
    lines = [
        f"## {report.planner}",
        "",
        *([note, ""] if note else []),
        f"Expresses {expressible} of the {len(report.results)} cases: {c['pass']} pass, "
        f"{c.get('contract', 0)} contract, {c['fail']} fail, {c['quality']} quality, "
        f"{c.get('enhancement', 0)} enhancement, {c['error']} errors. "
        f"{report.quality_line()[0].upper()}{report.quality_line()[1:]}.",
        "",
    ]
    lines += _finding_lines(report)
    lines += _contract_lines(report)
    from .peers import PEER_FINDINGS_OUTSIDE_CORPUS

    extra = next((v for key, v in PEER_FINDINGS_OUTSIDE_CORPUS.items() if report.planner.startswith(key)), [])
    if extra:
        lines += ["### Findings outside the corpus", ""]
        for text, script in extra:
            repro = f" Reproduce with the peer alone: `python {_REPRO_DIR}/{script}`." if script else ""
            lines.append(f"- {text}{repro}")
        lines.append("")
    noted = [r for r in report.results if r.verdict == "pass" and r.notes]
    if noted:
        lines += [f"### Passing with a note ({len(noted)})", ""]
        lines += [f"- `{r.case_id}`: {_md('; '.join(r.notes))[:300]}" for r in noted]
        lines.append("")
    groups: dict[str, list[str]] = {}
    for r in report.results:
        if r.verdict == "unsupported":
            key = re.sub(r"^parameter '[^']*'(, (source|target))?: ", "", r.reason)
            key = re.sub(r"\d+", "N", key.split(" (")[0])[:120]
            groups.setdefault(key, []).append(r.case_id)
    if groups:
        lines += ["### Unsupported, by reason", ""]
        for key, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            shown = ", ".join(f"`{i}`" for i in ids[:6]) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")
            lines.append(f"- {_md(key)} ({len(ids)}): {shown}")
        lines.append("")
    return lines


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _cell(result: CaseResult | None) -> str:
    if result is None:
        return "–"
    if result.verdict in ("pass", "unsupported"):
        return result.verdict
    return f"**{result.verdict}**: {result.got}"


def write_markdown(
    path: str | Path,
    reference: Report,
    peer: Report | None,
    *,
    corpus_size: int,
    peer_budget: Mapping[str, int] | None = None,
    others: Sequence[Report] = (),
) -> str:
    """Write the conformance document (refplan, DeepSpeed, and every other peer in ``others``);
    returns its text.

    ``peer_budget`` (the peer's ``PlanBudget`` defaults) adds the budget comparison.
    """
    from .differences import budget_notes, explain

    lines = [
        "# Conformance: refplan, DeepSpeed, PyTorch DCP, Megatron-Core and Awex",
        "",
        "<!-- Generated by `python -m refplan.conformance.runner --markdown docs/conformance.md`. "
        "Do not edit by hand. -->",
        "",
        f"The conformance corpus (`refplan/conformance/cases/*.json`, {corpus_size} cases) states, for each",
        "batch of (target map, source map) pairs, what the facts (`deepspeed-affine-facts.md` §4.4 rules",
        "R0-R32, §4.6 accepted layouts, §6 refusal cases A1-A22) and the batch replica-selection RFC",
        "demand: **accept** (every plan must pass the independent oracle `verify_plan`; for scripted",
        "answers every target region must be read from the scripted source) or **refuse** with an exact",
        "error class. `unsupported` means the planner lacks a feature the case needs; it never counts as",
        "a pass. Check any planner with `refplan conformance --planner SPEC` (see the README).",
        "",
        "## Summary",
        "",
        "| planner | result |",
        "|---|---|",
        f"| {reference.planner} | `{reference.summary_line()}` |",
    ]
    if peer is not None:
        lines.append(f"| {peer.planner} | `{peer.summary_line()}` |")
    for other in others:
        lines.append(f"| {other.planner} | `{other.summary_line()}` |")
    lines += [
        "",
        "Verdicts: `pass`; `fail` (a wrong plan, a crash, a refusal of a valid case, or an accepted invalid",
        "one); `quality` (a correct plan whose busiest sender exceeds what the case allows: the batch policy's",
        "promise, reported apart from correctness); `enhancement` (such a plan where the peer's documented",
        "design makes that choice: a request for an enhancement, not a defect; counted apart from `quality`);",
        "`contract` (a peer did what its own documented contract",
        "allows and only refplan's rules forbid: the reason names the peer's file:line); `unsupported` (the",
        "planner cannot express the case, or the peer's front door cannot produce it; never a pass); `error`",
        "(the adapter broke); `unverifiable` (the oracle cannot check the plan: never a pass, never a fail).",
        "Every peer `fail`, `quality` and `enhancement` names its root cause (peer version, file:line, a",
        "configuration that reaches it). `refplan conformance` exits 0 when nothing failed, errored or was",
        "unverifiable, 1 otherwise (quality, enhancement and contract results exit 0; quality exits 1 with",
        "`--fail-on-quality`), 2 for bad input.",
        "",
    ]
    own = [r for r in reference.results if r.verdict != "pass"]
    if own:
        lines += [
            "## Where refplan fails its own corpus",
            "",
            "Cases whose expectation follows from the facts or the RFC but which refplan does not meet yet.",
            "They are kept, not weakened: each is a refplan bug (or a reading of the facts to settle).",
            "",
        ]
        for r in own:
            lines.append(f"- `{r.case_id}` ({_md(r.why)}): expected {r.expected}, got {r.got}. {_md(r.reason)}")
        lines.append("")
    if peer is not None:
        lines += [f"## Where {peer.planner} differs from the reference", ""]
        c = peer.counts()
        expressible = len(peer.results) - c["unsupported"]
        lines += [
            f"Of the {expressible} cases {peer.planner} can express, it passes {c['pass']}"
            + (f" and fails {c['fail']}" if c["fail"] else "") + (f" with {c['error']} errors" if c["error"] else "")
            + (f"; {c['contract']} more {'does' if c['contract'] == 1 else 'do'} what its own contract allows "
               "and refplan's rules forbid (listed below)" if c.get("contract") else "")
            + ". Its plans are judged by the same oracle, and scripted int answers reach it as a per-request",
            "`replica_selector`, so its reads must come from exactly the scripted holders. The other",
            f"{c['unsupported']} cases need features of the batch RFC that its one-parameter `plan_transfer` does",
            "not have; they are listed by the feature they need.",
            "",
        ]
        groups: dict[str, tuple[str, str, list[CaseResult]]] = {}
        order: list[str] = []
        for r in peer.results:
            if r.verdict == "pass":
                continue
            key, title, text = explain(r)
            if key not in groups:
                groups[key] = (title, text, [])
                order.append(key)
            groups[key][2].append(r)
        for section, verdict in (("Failures", "fail"), ("Errors", "error"), ("Unsupported", "unsupported")):
            keys = [k for k in order if any(r.verdict == verdict for r in groups[k][2])]
            if not keys:
                continue
            lines += [f"### {section}", ""]
            for key in keys:
                title, text, results = groups[key]
                chosen = [r for r in results if r.verdict == verdict]
                lines += [f"#### {title} ({len(chosen)})", "", text, ""]
                if verdict == "unsupported":
                    lines.append("Cases: " + ", ".join(f"`{r.case_id}`" for r in chosen) + ".")
                else:
                    for r in chosen:
                        lines.append(f"- `{r.case_id}`: expected {r.expected}, got {r.got}. {_md(r.reason)}")
                lines.append("")
        lines += _quality_lines(peer)
        lines += _contract_lines(peer)
        if peer_budget is not None:
            lines += ["### Other differences (not failures)", "", *budget_notes(peer.planner, peer_budget), ""]
        noted = [r for r in peer.results if r.verdict == "pass" and r.notes]
        if noted:
            lines += [
                "### Passing with different messages",
                "",
                "These refusals have the right class but DeepSpeed words them differently from the fragment the",
                "case names (the fragment is refplan's wording; only the class is the contract).",
                "",
            ]
            for r in noted:
                lines.append(f"- `{r.case_id}`: {_md('; '.join(r.notes))}")
            lines.append("")
    for other in others:
        lines += _peer_section(other)
    lines += ["## All cases", ""]
    peer_by_id = peer.by_id() if peer is not None else {}
    header = "| case | why | expected | " + reference.planner + (f" | {peer.planner} |" if peer else " |")
    lines += [header, "|---|---|---|---|" + ("---|" if peer else "")]
    for r in reference.results:
        row = f"| `{r.case_id}` | {_md(r.why)} | {r.expected} | {_cell(r)} |"
        if peer is not None:
            row += f" {_md(_cell(peer_by_id.get(r.case_id)))} |"
        lines.append(row)
    text = "\n".join(lines) + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_file(path, text)
    return text


# ---------------------------------------------------------------------------------------------
# CLI


def add_conformance_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``refplan conformance`` (also ``python -m refplan.conformance.runner``)."""
    parser.add_argument(
        "--planner", default="refplan", metavar="SPEC",
        help="refplan | deepspeed | dcp | dcp-lowest | megatron (0.19.2) | megatron-0.16 | awex (the pinned peers, "
             "`make peers`) | "
             "pkg.module:function (the current directory is importable; 'module:' may prefix it) | "
             "cmd:\"<command>\" (reads a case on stdin, prints an answer; default: refplan)",
    )
    parser.add_argument("--case", action="append", metavar="GLOB",
                        help="only cases whose id or tag matches (repeatable), e.g. 'rules/*', 'R17', '*1e9*'")
    parser.add_argument("--cases", metavar="PATH", help=f"case file, directory or glob (default: {CASES_DIR.name}/)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--junit", metavar="FILE", type=output_file_name, help="also write a JUnit XML report")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case for cmd: planners")
    parser.add_argument("--once", action="store_true",
                        help="plan each case once: no check that a function or cmd: planner answers the same input "
                             "the same way twice (by default each case is planned twice, and differing answers fail)")
    parser.add_argument("--markdown", metavar="FILE", type=output_file_name,
                        help="write the conformance document of refplan and every installed peer "
                             "(docs/conformance.md); it runs every installed peer itself, so --planner and --timeout "
                             "are refused beside it")
    parser.add_argument("--fail-on-quality", action="store_true",
                        help="exit 1 also when a correct plan loads its busiest sender above the case's bound "
                             "(not for an enhancement result: a choice the peer's documented design makes)")
    parser.add_argument("--min-supported", type=int, default=1, metavar="N",
                        help="exit 1 unless at least N cases ran (were not unsupported); default 1, so a run "
                             "that checked nothing fails")
    parser.add_argument("--supports", metavar="KEY,...",
                        help="the input keys the planner implements (of " + ", ".join(
                            k for k in INPUT_KEYS if k not in ALWAYS_INPUT_KEYS) + "); a case whose input "
                        "carries any other is unsupported, naming it, and is not run (default: every key, or a "
                        "Python planner's own 'supports' attribute)")
    parser.add_argument("--explore", type=int, metavar="N",
                        help="instead of the corpus, draw N configurations (hypothesis) from a peer's own domain "
                             "(dcp, dcp-lowest, megatron, megatron-0.16, awex, deepspeed) or, for any other planner, "
                             "the general one; run each like a corpus case and shrink the first fail and the first "
                             "quality result to minimal cases")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="--explore's seed (default 0): the same seed draws the same configurations")
    parser.add_argument("--explore-out", metavar="FILE", type=output_file_name,
                        help="write --explore's shrunk case's input (refplan.conformance-input/1) to FILE: the "
                             "fail's, else the quality finding's")
    parser.add_argument("--dump", metavar="CASE",
                        help="write CASE's planner input (refplan.conformance-input/1, as a cmd: planner reads it) "
                             "to stdout and exit")


def _one_line(text: str) -> str:
    return "\\n".join(str(text).splitlines())


def _dump(cases: Sequence[Case], case_id: str) -> int:
    """Print one case's planner input, exactly what a ``cmd:`` planner reads on stdin."""
    found = [c for c in cases if c.id == case_id] or select_cases(cases, case_id)
    if len(found) != 1:
        what = "no case" if not found else f"{len(found)} cases ({', '.join(c.id for c in found[:5])}, ...)"
        print(f"refplan conformance: --dump {case_id}: {what} match; give one case id", file=sys.stderr)
        return 2
    print(json.dumps(found[0].input_doc(), indent=1, sort_keys=True))
    return 0


def run_conformance_cli(args: argparse.Namespace) -> int:
    """0 everything passed (or was unsupported, with at least ``--min-supported`` cases run), 1 a
    failure or error or too few cases run, 2 bad input."""
    prog = "refplan conformance"
    quiet = bool(getattr(args, "quiet", False))
    verbose = bool(getattr(args, "verbose", False))
    min_supported = int(getattr(args, "min_supported", 1))
    problem = _option_problem(args)
    if problem is not None:
        print(_one_line(f"{prog}: {problem}"), file=sys.stderr)
        return 2
    if getattr(args, "explore", None) is not None:
        return _explore_cli(args, prog)
    try:
        cases = load_cases(args.cases)
        if getattr(args, "dump", None):
            return _dump(cases, args.dump)
        if args.markdown:
            from .adapters import DeepSpeedAdapter

            reference = run_conformance("refplan", cases, select=args.case)
            ds: DeepSpeedAdapter | None
            try:
                ds = DeepSpeedAdapter()
            except Exception as exc:  # ImportError, or whatever its torch import raises here
                print(f"{prog}: DeepSpeed is not importable ({exc}); writing refplan only", file=sys.stderr)
                ds = None
            peer = run_conformance(ds, cases, select=args.case) if ds is not None else None
            budget = ds.budget_defaults() if ds is not None else None
            others: list[Report] = []
            from .peers import PEER_SPECS

            for spec in PEER_SPECS:
                try:
                    others.append(run_conformance(spec, cases, select=args.case))
                except ValueError as exc:
                    print(_one_line(f"{prog}: {exc}; left out of the document"), file=sys.stderr)
            write_markdown(args.markdown, reference, peer, corpus_size=len(select_cases(cases, args.case)),
                           peer_budget=budget, others=others)
            for report in (reference, peer, *others):  # beside a document on stdout, on stderr
                if report is not None:
                    print(f"{report.planner}: {report.summary_line()}",
                          file=sys.stderr if args.markdown == "-" else sys.stdout)
            return reference.exit_code
        selected = select_cases(cases, args.case)
        if not selected:
            if args.case:
                print(f"{prog}: no case matches {args.case}", file=sys.stderr)
            else:  # an empty directory: "no case matches None" said nothing of where it looked
                print(f"{prog}: {args.cases}: holds no case (no *.json file)", file=sys.stderr)
            return 2
        progress = Progress(prog, len(selected), quiet=quiet or args.json)
        done = 0

        def step(result: CaseResult) -> None:
            nonlocal done
            done += 1
            progress.update(done, result.case_id)

        supports = getattr(args, "supports", None)
        declared = None if supports is None else [k.strip() for k in supports.split(",") if k.strip()]
        interrupted: Interrupted | None = None
        try:
            report = run_conformance(args.planner, selected, timeout=args.timeout, progress=step, supports=declared,
                                     once=args.once)
        except Interrupted as exc:
            interrupted, report = exc, exc.report
        finally:
            progress.close()
    except (CaseFormatError, ValueError) as exc:
        print(_one_line(f"{prog}: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside a case run (loading the corpus, the planner's import, --markdown)
        print(f"{prog}: interrupted; nothing written", file=sys.stderr)
        return 130
    code = _report_out(args, report, prog, quiet=quiet, verbose=verbose, min_supported=min_supported)
    if interrupted is not None:
        # One line, not a traceback: what ran is reported above (and in --junit/--json, marked
        # incomplete), and 130 is the shell's code for a run stopped by SIGINT.
        print(f"{prog}: interrupted after {len(report.results)} of {interrupted.selected} cases; "
              "the results so far are reported as incomplete", file=sys.stderr)
        return 130
    return code


def _option_problem(args: argparse.Namespace) -> str | None:
    """Why the options cannot run together (bad input), or None; asked before anything runs.

    Each mode reads its own options: ``--explore`` and ``--markdown`` returned before the corpus
    run's options were read, so ``--junit``, ``--supports bogus`` or ``--case`` were silently
    ignored there (no JUnit file, exit 0), and ``--seed`` or ``--explore-out`` without
    ``--explore`` were too. An output path that cannot be written is refused before the run, not
    after it (the finished report was dropped), and two documents on standard output (``--junit
    -`` with ``--json``) could not be read apart. ``--timeout`` is held to its range for every
    planner (in-process ones took 0, -1, nan and inf)."""
    from ..formats import STDIN, unwritable
    from ..limits import MAX_TIMEOUT

    given = {
        "--junit": getattr(args, "junit", None) is not None,
        "--json": bool(getattr(args, "json", False)),
        "--case": bool(getattr(args, "case", None)),
        "--cases": getattr(args, "cases", None) is not None,
        "--supports": getattr(args, "supports", None) is not None,
        "--min-supported": int(getattr(args, "min_supported", 1)) != 1,
        "--fail-on-quality": bool(getattr(args, "fail_on_quality", False)),
        "--dump": getattr(args, "dump", None) is not None,
        "--markdown": getattr(args, "markdown", None) is not None,
        "--explore-out": getattr(args, "explore_out", None) is not None,
        "--seed": int(getattr(args, "seed", 0) or 0) != 0,
        # --markdown runs every installed peer itself and --dump plans nothing: a planner named
        # beside them was dropped, and a CI line asking for a report on its own planner went
        # green without importing it (an outside probe, 2026-12-07)
        "--planner": getattr(args, "planner", "refplan") != "refplan",
        "--timeout": getattr(args, "timeout", 60.0) != 60.0,
        "--once": bool(getattr(args, "once", False)),
    }
    timeout = getattr(args, "timeout", 60.0)
    longest = MAX_TIMEOUT.total_seconds()
    if not isinstance(timeout, (int, float)) or not 0 < timeout <= longest:
        return f"--timeout must be above 0 and at most {longest:g} seconds (365 days), got {timeout!r}"
    if getattr(args, "explore", None) is not None:
        mode, used = "--explore", {"--json", "--explore-out", "--seed", "--planner", "--timeout", "--min-supported"}
    elif given["--dump"]:
        mode, used = "--dump", {"--cases", "--dump"}
    elif given["--markdown"]:
        mode, used = "--markdown", {"--cases", "--case", "--markdown"}
    else:
        mode, used = "a corpus run", {"--junit", "--json", "--case", "--cases", "--supports", "--min-supported",
                                      "--fail-on-quality", "--planner", "--timeout", "--once"}
    unused = [option for option, on in given.items() if on and option not in used]
    if unused:
        return f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing with {mode}; leave it out"
    if given["--junit"] and given["--json"] and args.junit == STDIN:
        return "--junit - and --json both write to standard output; write one to a file"
    if given["--explore-out"] and given["--json"] and args.explore_out == STDIN:
        return "--explore-out - and --json both write to standard output; write one to a file"
    for option in ("junit", "markdown", "explore_out"):
        path = getattr(args, option, None)
        if path is not None and given[f"--{option.replace('_', '-')}"]:
            problem = unwritable(path)
            if problem is not None:
                return problem
    return None


def _explore_cli(args: argparse.Namespace, prog: str) -> int:
    """``--explore N``: 0 nothing failed, 1 a ``fail`` or adapter error (its shrunk case printed), 2 bad input."""
    from .explore import explore

    if args.explore < 1:
        print(f"{prog}: --explore needs a positive number of configurations", file=sys.stderr)
        return 2
    try:
        adapter = make_adapter(args.planner, timeout=args.timeout)
    except ValueError as exc:
        print(_one_line(f"{prog}: {exc}"), file=sys.stderr)
        return 2
    try:
        report = explore(args.planner, adapter, args.explore, args.seed)
    except ModuleNotFoundError as exc:
        if exc.name != "hypothesis":
            raise
        print(f"{prog}: --explore draws its configurations with hypothesis, which is not installed "
              "(pip install hypothesis)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing written", file=sys.stderr)
        return 130
    found = report.shrunk.get("fail") or report.shrunk.get("quality")
    if args.explore_out and found is not None:
        try:
            write_text_file(args.explore_out, json.dumps(found[1].input_doc(), indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            print(_one_line(f"{prog}: cannot write {args.explore_out}: {exc.strerror or exc}"), file=sys.stderr)
            return 2
    print(json.dumps(report.to_dict(), indent=1, sort_keys=True) if args.json else report.text(),
          file=sys.stderr if args.explore_out == "-" and found is not None else sys.stdout)  # the case alone there
    ran = report.explored - report.counts.get("unsupported", 0)
    least = int(getattr(args, "min_supported", 1))
    if ran < least:  # as in a corpus run: a planner answering `unsupported` to every draw checked nothing
        print(f"{prog}: only {ran} of {report.explored} drawn configurations ran (--min-supported {least})",
              file=sys.stderr)
        return 1
    return 0 if report.ok else 1


def _report_out(
    args: argparse.Namespace, report: Report, prog: str, *, quiet: bool, verbose: bool, min_supported: int
) -> int:
    """Write ``report`` as asked (JUnit file, JSON or table) and return the exit code."""
    if args.junit:
        try:
            write_text_file(args.junit, report.junit_xml(fail_on_quality=bool(getattr(args, "fail_on_quality", False))))
        except OSError as exc:
            print(_one_line(f"{prog}: cannot write {args.junit}: {exc.strerror or exc}"), file=sys.stderr)
            return 2
    # Beside a JUnit report on standard output, the table goes to stderr.
    out = sys.stderr if args.junit == "-" else sys.stdout
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, sort_keys=True))
    elif quiet:
        lines = report.table().splitlines()
        print("\n".join(line for line in lines[len(report.results) + 1:]), file=out)  # reasons and the summary
    else:
        print(report.table(), file=out)
        if verbose:
            for r in report.results:
                for note in r.notes:
                    print(f"note {r.case_id}: {note}", file=out)
    if report.ok and report.supported < min_supported and not report.incomplete:
        print(f"{prog}: only {report.supported} of {len(report.results)} selected cases ran (the rest are "
              f"unsupported), fewer than --min-supported {min_supported}: nothing to call a pass", file=sys.stderr)
    if getattr(args, "fail_on_quality", False) and report.counts()["quality"]:
        return 1
    return report.exit_code_for(min_supported)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m refplan.conformance.runner", description="Hold a planner to the reference's conformance corpus"
    )
    add_conformance_arguments(parser)
    quiet = parser.add_mutually_exclusive_group()  # `refplan conformance` has these for every command
    quiet.add_argument("-q", "--quiet", action="store_true", help="no table and no progress: failures and the summary")
    quiet.add_argument("-v", "--verbose", action="store_true", help="also print every case's notes")
    from .._progress import escaping_unencodable

    with escaping_unencodable():  # as `refplan conformance` runs (README's and the Makefile's entry point)
        return run_conformance_cli(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
