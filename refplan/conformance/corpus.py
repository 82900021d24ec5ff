"""The conformance case format: loading, checking, writing.

A case file is ``{"format": "refplan.conformance/1", "family": str, "description": str,
"cases": [case, ...]}``. A case is one batch planning problem and the outcome the facts demand:

``id``
    ``"<family>/<slug>"``, unique across the corpus (``[A-Za-z0-9._/-]+``).
``why``
    One line: what the case checks and why the expected outcome is right.
``tags``
    Rule and case names it covers (``"R17"``, ``"A5"``, ``"layout"``, ``"answer:gap"``, ...).
``parameters``
    ``{name: {"target": map, "source": map}}``; maps in DeepSpeed's ``ParamAffineMap.to_dict()``
    form (``{logical_shape, ranks: {loc: {shard_shape, pieces: [{shape, source: [off, strides],
    dest: [off, strides], locations, scale?}]}}}``). ``shard_shape`` may be ``null`` (a location
    that lists pieces but declares no shard shape).
``endpoints``, ``process_node``, ``element_size``, ``min_split_bytes`` (optional)
    As in a ``refplan.maps/1`` file and ``plan_transfers``: ``{"source": {loc: proc}, "target":
    {loc: proc}}``, ``{proc: node}``, ``{name: bytes}``, an int.
``budget`` (optional)
    ``{field: int}`` over ``PlanBudget`` fields; unnamed fields keep the planner's defaults.
``requests`` (optional, informational)
    The replica requests in the RFC's order (parameter, target location, logical origin), each
    ``{parameter, target_location, logical_origin, shape, candidates: [loc]}``. Present whenever
    ``answers`` is, so that a planner can map its own requests to answer indices.
``answers`` (optional)
    Scripted policy answers, one per request index: an int location, or a list of parts
    ``{logical_origin, shape, source_location}``. Deliberately wrong answers (wrong count, wrong
    types, malformed parts) are stored as the JSON they are. Absent: the planner's default policy.
``expect``
    ``{"outcome": "accept", "sources"?: [{parameter, target_location, logical_origin, shape,
    source_location}], "max_sender_load"?: int}`` or ``{"outcome": "refuse", "error": class name,
    "message"?: regex}``. ``accept`` means the plans must pass ``verify_plan`` for every parameter;
    ``sources`` pins the source location of every element of each listed target region;
    ``max_sender_load`` bounds the busiest sender (bytes with ``element_size``, else elements; per
    process with ``endpoints``, else per source location; local copies excluded). ``refuse`` names
    the exact error class (``InvalidMapError``, ``UnsupportedLayoutError``,
    ``InvalidReplicaPolicyError``, or ``AffineTransferError`` for budgets) and a case-insensitive
    regex the message should match.

What a planner under test receives is ``Case.input_doc()``: the case without ``why``, ``tags`` and
``expect`` and with ``"format": "refplan.conformance-input/1"``.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputFileError, InvalidMapError
from ..formats import load_json, path_key
from ..maps import is_int

__all__ = [
    "ALWAYS_INPUT_KEYS",
    "CASES_DIR",
    "CASE_FORMAT",
    "ERROR_CLASSES",
    "FEATURES",
    "INPUT_FORMAT",
    "INPUT_KEYS",
    "Case",
    "CaseFormatError",
    "Expect",
    "dump_case_file",
    "load_cases",
    "parse_case",
    "select_cases",
]

CASE_FORMAT = "refplan.conformance/1"
INPUT_FORMAT = "refplan.conformance-input/1"
CASES_DIR = Path(__file__).resolve().parent / "cases"

ERROR_CLASSES = ("AffineTransferError", "InvalidMapError", "InvalidReplicaPolicyError", "UnsupportedLayoutError")

FEATURES = {
    "multi_parameter": "batches of more than one parameter",
    "endpoints": "location -> process bindings (TransferEndpoints)",
    "process_node": "process -> node bindings",
    "element_size": "bytes per element per parameter",
    "min_split_bytes": "a floor on split parts",
    "budget": "PlanBudget limits (each field is also a feature 'budget.<field>')",
    "answers": "scripted answers a per-request selector can give (an int per multi-holder request)",
    "batch_answers": "scripted answers only a batch policy can be checked on (count, single-holder requests)",
    "splits": "answers that split a request into parts",
    "batch_policy": "the RFC's default batch policy (balance across the whole batch, local first)",
}
"""What a case may need from a planner; ``Case.features()`` derives them from its content."""

INPUT_KEYS = {
    "format": "always: \"refplan.conformance-input/1\"",
    "id": "always: the case id, for the planner's own logs",
    "parameters": "always: {name: {\"target\": map, \"source\": map}} in DeepSpeed's dict form",
    "endpoints": "{\"source\": {loc: proc}, \"target\": {loc: proc}}: which process holds each location",
    "process_node": "{proc: node}: which node each process is on (only with endpoints)",
    "element_size": "{name: bytes}: bytes per element of each parameter",
    "min_split_bytes": "int: the smallest part a split may have, in bytes",
    "budget": "{PlanBudget field: int}: limits the plan must stay within, else refuse",
    "requests": "informational, present with answers: the replica requests the answers index into",
    "answers": "scripted replica answers, one per request: an int location or a list of parts",
}
"""Every key of a planner's input document (``Case.input_doc()``), with what it holds.

The protocol's declaration (``--supports``, a planner function's ``supports`` attribute) names
keys of this table; ``ALWAYS_INPUT_KEYS`` are in every input and ``requests`` only indexes
``answers``, so neither makes a case need anything."""

ALWAYS_INPUT_KEYS = frozenset({"format", "id", "parameters"})
_NEVER_NEEDED = ALWAYS_INPUT_KEYS | {"requests"}

_ID = re.compile(r"[A-Za-z0-9._/-]+")
_CASE_KEYS = {
    "id", "why", "tags", "parameters", "endpoints", "process_node", "element_size", "min_split_bytes",
    "budget", "requests", "answers", "expect",
}
_OPTIONAL_INPUTS = ("endpoints", "process_node", "element_size", "min_split_bytes", "budget", "requests", "answers")
_KEY_ORDER = (
    "id", "why", "tags", "parameters", "endpoints", "process_node", "element_size", "min_split_bytes", "budget",
    "requests", "answers", "expect",
)


class CaseFormatError(ValueError):
    """A case file or case does not follow the format; the message names the file and JSON path."""


@dataclass(frozen=True)
class Expect:
    """The outcome a case demands."""

    outcome: str
    error: str | None = None
    message: str | None = None
    sources: tuple[Mapping[str, Any], ...] | None = None
    max_sender_load: int | None = None

    def describe(self) -> str:
        if self.outcome == "refuse":
            return f"refuse {self.error}"
        extra = []
        if self.sources is not None:
            extra.append("sources")
        if self.max_sender_load is not None:
            extra.append(f"load<={self.max_sender_load}")
        return "accept" + (f" ({', '.join(extra)})" if extra else "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome}
        if self.error is not None:
            out["error"] = self.error
        if self.message is not None:
            out["message"] = self.message
        if self.sources is not None:
            out["sources"] = [dict(s) for s in self.sources]
        if self.max_sender_load is not None:
            out["max_sender_load"] = self.max_sender_load
        return out


@dataclass(frozen=True)
class Case:
    """One conformance case; ``raw`` is its JSON object exactly as stored."""

    id: str
    why: str
    family: str
    tags: tuple[str, ...]
    raw: Mapping[str, Any]
    expect: Expect
    source_file: str = ""

    @property
    def parameters(self) -> Mapping[str, Mapping[str, Any]]:
        params: Mapping[str, Mapping[str, Any]] = self.raw["parameters"]
        return params

    @property
    def answers(self) -> list[Any] | None:
        value = self.raw.get("answers")
        return None if value is None else list(value)

    @property
    def requests(self) -> list[Mapping[str, Any]] | None:
        value = self.raw.get("requests")
        return None if value is None else list(value)

    def maps_doc(self) -> dict[str, Any]:
        """The case's problem as a ``refplan.maps/1`` document (parameters, endpoints, process
        nodes, element sizes), for the refplan planner and for the lower bound of its requests."""
        from ..formats import MAPS_FORMAT

        raw = self.raw
        doc: dict[str, Any] = {"format": MAPS_FORMAT, "parameters": raw["parameters"]}
        for key in ("endpoints", "process_node", "element_size"):
            if raw.get(key) is not None:
                doc[key] = raw[key]
        return doc

    def unit(self, name: str) -> int:
        """Bytes per element of parameter ``name`` as the judge counts loads: one ``int``
        ``element_size`` is every parameter's (the maps format's ``"element_size": 2``), a mapping
        gives one per parameter, 1 for a name it lacks or without one (loads in elements)."""
        given = self.raw.get("element_size")
        if type(given) is int:  # bool excluded, as in limits.element_sizes
            return given
        return int(given.get(name, 1)) if isinstance(given, Mapping) else 1

    def processes(
        self, placement: Mapping[str, Mapping[int, int]] | None = None
    ) -> tuple[dict[int, Any], dict[int, Any]] | None:
        """(source location -> process, target location -> process) for judging loads: the case's
        endpoints, else the locations an adapter ran them on (``Outcome.placement``), else ``None``
        (every location its own sender, nothing local)."""
        ends = self.raw.get("endpoints")
        if ends:
            return ({int(k): v for k, v in ends["source"].items()}, {int(k): v for k, v in ends["target"].items()})
        if placement is not None:
            return dict(placement["source"]), dict(placement["target"])
        return None

    def map_pairs(self) -> dict[str, tuple[Any, Any]]:
        """Parameter name -> (target map dict, source map dict), as the oracle takes them."""
        return {name: (pair["target"], pair["source"]) for name, pair in self.parameters.items()}

    def input_doc(self) -> dict[str, Any]:
        """What the planner under test sees: the problem, never the expectation."""
        doc: dict[str, Any] = {"format": INPUT_FORMAT, "id": self.id, "parameters": self.raw["parameters"]}
        for key in _OPTIONAL_INPUTS:
            if self.raw.get(key) is not None:
                doc[key] = self.raw[key]
        return doc

    def input_keys(self) -> frozenset[str]:
        """The input keys a planner must understand to answer this case: the optional keys of
        ``input_doc()`` it carries, less ``requests`` (only an index for ``answers``). A planner
        that ignored one of them would plan another problem than the case's, so the protocol's
        declaration (``supports``) is checked against these."""
        return frozenset(k for k in _OPTIONAL_INPUTS if self.raw.get(k) is not None) - _NEVER_NEEDED

    def features(self) -> frozenset[str]:
        """The planner features this case needs (``FEATURES``)."""
        raw = self.raw
        out: set[str] = set()
        if len(raw["parameters"]) > 1:
            out.add("multi_parameter")
        for key in ("endpoints", "process_node", "element_size", "min_split_bytes"):
            if raw.get(key) is not None:
                out.add(key)
        budget = raw.get("budget")
        if budget:
            out.add("budget")
            out.update(f"budget.{name}" for name in budget)
        answers = self.answers
        if answers is not None:
            if any(isinstance(a, list) for a in answers):
                out.add("splits")
            if self._selector_expressible(answers):
                out.add("answers")
            else:
                out.add("batch_answers")
        # The batch policy's promises (load bound, local first) are judged as quality, which any
        # planner can be measured on: they need no feature to run.
        return frozenset(out)

    def _selector_expressible(self, answers: list[Any]) -> bool:
        """Whether a per-request selector (called only for multi-holder requests) gives these answers."""
        requests = self.requests or []
        if len(answers) != len(requests):
            return False
        for request, answer in zip(requests, answers):
            if isinstance(answer, list):
                return False
            if len(request["candidates"]) == 1 and not (
                type(answer) is int and answer == request["candidates"][0]
            ):
                return False
        return True


def _fail(where: str, problem: str) -> CaseFormatError:
    return CaseFormatError(f"{where}: {problem}")


def _parse_expect(value: Any, where: str) -> Expect:
    if not isinstance(value, Mapping):
        raise _fail(where, "expected an object")
    outcome = value.get("outcome")
    if outcome == "refuse":
        error = value.get("error")
        if error not in ERROR_CLASSES:
            raise _fail(f"{where}.error", f"expected one of {list(ERROR_CLASSES)}, got {error!r}")
        message = value.get("message")
        if message is not None:
            if not isinstance(message, str):
                raise _fail(f"{where}.message", "expected a regex string")
            try:
                re.compile(message)
            except re.error as exc:
                raise _fail(f"{where}.message", f"not a valid regex: {exc}") from None
        extra = set(value) - {"outcome", "error", "message"}
        if extra:
            raise _fail(where, f"unexpected keys {sorted(extra)} for a refusal")
        return Expect("refuse", error, message)
    if outcome == "accept":
        extra = set(value) - {"outcome", "sources", "max_sender_load"}
        if extra:
            raise _fail(where, f"unexpected keys {sorted(extra)} for an acceptance")
        sources = value.get("sources")
        if sources is not None:
            if not isinstance(sources, list):
                raise _fail(f"{where}.sources", "expected a list")
            for i, entry in enumerate(sources):
                keys = {"parameter", "target_location", "logical_origin", "shape", "source_location"}
                if not isinstance(entry, Mapping) or set(entry) != keys:
                    raise _fail(f"{where}.sources[{i}]", f"expected an object with keys {sorted(keys)}")
        load = value.get("max_sender_load")
        if load is not None and (not is_int(load) or load < 0):
            raise _fail(f"{where}.max_sender_load", "expected a non-negative int")
        return Expect("accept", sources=None if sources is None else tuple(sources), max_sender_load=load)
    raise _fail(f"{where}.outcome", f"expected 'accept' or 'refuse', got {outcome!r}")


def parse_case(value: Any, family: str, where: str) -> Case:
    """Check one case object's shape (not its maps: judging those is the planner's job)."""
    if not isinstance(value, Mapping):
        raise _fail(where, "a case must be an object")
    unknown = set(value) - _CASE_KEYS
    if unknown:
        raise _fail(where, f"unknown keys {sorted(unknown)}")
    case_id = value.get("id")
    if not isinstance(case_id, str) or not _ID.fullmatch(case_id) or not case_id.startswith(family + "/"):
        raise _fail(f"{where}.id", f"expected '{family}/<slug>' of [A-Za-z0-9._/-], got {case_id!r}")
    why = value.get("why")
    if not isinstance(why, str) or not why.strip() or "\n" in why:
        raise _fail(f"{where}.why", "expected a non-empty one-line string")
    tags = value.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise _fail(f"{where}.tags", "expected a list of strings")
    params = value.get("parameters")
    if not isinstance(params, Mapping) or not params:
        raise _fail(f"{where}.parameters", "expected a non-empty object of name -> {target, source}")
    for name, pair in params.items():
        if not isinstance(pair, Mapping) or set(pair) != {"target", "source"}:
            raise _fail(path_key(f"{where}.parameters", name), "expected {\"target\": map, \"source\": map}")
    min_split = value.get("min_split_bytes")
    if min_split is not None and not is_int(min_split):
        raise _fail(f"{where}.min_split_bytes", "expected an int")
    budget = value.get("budget")
    if budget is not None and (not isinstance(budget, Mapping) or not all(is_int(v) for v in budget.values())):
        raise _fail(f"{where}.budget", "expected an object of PlanBudget field -> int")
    answers = value.get("answers")
    requests = value.get("requests")
    if answers is not None:
        if not isinstance(answers, list):
            raise _fail(f"{where}.answers", "expected a list (one answer per request)")
        if not isinstance(requests, list):
            raise _fail(f"{where}.requests", "required with answers: the requests the answers index into")
    if requests is not None:
        keys = {"parameter", "target_location", "logical_origin", "shape", "candidates"}
        for i, r in enumerate(requests):
            if not isinstance(r, Mapping) or set(r) != keys:
                raise _fail(f"{where}.requests[{i}]", f"expected an object with keys {sorted(keys)}")
            _check_region(r, params, f"{where}.requests[{i}]")
            if not isinstance(r["candidates"], list) or not r["candidates"] or not all(
                is_int(c) for c in r["candidates"]
            ):
                raise _fail(f"{where}.requests[{i}].candidates", "expected a non-empty list of location ints")
    endpoints = value.get("endpoints")
    if endpoints is not None and not (
        isinstance(endpoints, Mapping) and set(endpoints) == {"source", "target"}
        and all(isinstance(side, Mapping) and all(is_int(p) for p in side.values()) for side in endpoints.values())
    ):
        raise _fail(f"{where}.endpoints", "expected {\"source\": {location: process}, \"target\": {...}}")
    expect = _parse_expect(value.get("expect"), f"{where}.expect")
    for i, entry in enumerate(expect.sources or ()):
        at = f"{where}.expect.sources[{i}]"
        _check_region(entry, params, at)
        if not is_int(entry["source_location"]):
            raise _fail(f"{at}.source_location", "expected a location int")
        ranks = params[entry["parameter"]]["target"].get("ranks") if isinstance(
            params[entry["parameter"]]["target"], Mapping) else None
        if isinstance(ranks, Mapping) and str(entry["target_location"]) not in {str(k) for k in ranks}:
            # Checked here, or a typo in the case would be charged to the planner as a failure.
            raise _fail(f"{at}.target_location", f"{entry['target_location']} is not a location of the target map")
    return Case(case_id, why, family, tuple(tags), value, expect)


def _check_region(entry: Mapping[str, Any], params: Mapping[str, Any], where: str) -> None:
    """A request's or an expected source's parameter, target location and box are of the right
    types, and the parameter is one of the case's (the runner reads them as such)."""
    if not isinstance(entry["parameter"], str) or entry["parameter"] not in params:
        raise _fail(f"{where}.parameter", f"expected one of the case's parameters, got {entry['parameter']!r}")
    if not is_int(entry["target_location"]):
        raise _fail(f"{where}.target_location", "expected a location int")
    origin, shape = entry["logical_origin"], entry["shape"]
    for key, item in (("logical_origin", origin), ("shape", shape)):
        if not isinstance(item, list) or not all(is_int(x) for x in item):
            raise _fail(f"{where}.{key}", "expected a list of ints")
    if len(origin) != len(shape):
        raise _fail(where, "logical_origin and shape have different numbers of axes")


def _load_file(path: Path) -> list[Case]:
    """One case file, read as strictly as maps and plans files (``formats.load_json``): a file
    nested too deeply, with a key twice in one object (the second ``"cases"`` silently won), or
    not UTF-8 (a gzipped file) is a ``CaseFormatError`` naming the file, never a bare traceback."""
    try:
        doc = load_json(path)
    except (InputFileError, InvalidMapError) as exc:
        raise CaseFormatError(str(exc)) from None
    if not isinstance(doc, Mapping) or doc.get("format") != CASE_FORMAT:
        raise CaseFormatError(f"{path}: $.format: expected \"{CASE_FORMAT}\"")
    family = doc.get("family")
    if not isinstance(family, str) or not _ID.fullmatch(family):
        raise CaseFormatError(f"{path}: $.family: expected a name")
    cases = doc.get("cases")
    if not isinstance(cases, list):
        raise CaseFormatError(f"{path}: $.cases: expected a list")
    out = []
    for i, value in enumerate(cases):
        case = parse_case(value, family, f"{path}: $.cases[{i}]")
        out.append(Case(case.id, case.why, case.family, case.tags, case.raw, case.expect, str(path)))
    return out


def load_cases(source: str | Path | Iterable[str | Path] | None = None) -> list[Case]:
    """Cases from the packaged corpus (default), a case file, a directory of them, or a glob.

    Raises ``CaseFormatError`` naming the file and JSON path of the first problem, including two
    cases with the same id.
    """
    paths: list[Path] = []
    sources: Iterable[str | Path]
    if source is None:
        sources = [CASES_DIR]
    elif isinstance(source, (str, Path)):
        sources = [source]
    else:
        sources = source
    for item in sources:
        path = Path(item)
        if path.is_dir():
            paths.extend(sorted(path.glob("*.json")))
        elif path.exists():
            paths.append(path)
        else:
            matches = sorted(Path(p) for p in glob.glob(str(item)))
            if not matches:
                raise CaseFormatError(f"{item}: no such case file or directory")
            paths.extend(matches)
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for path in paths:
        for case in _load_file(path):
            if case.id in seen:
                raise CaseFormatError(f"{path}: case {case.id!r} is also defined in {seen[case.id]}")
            seen[case.id] = str(path)
            cases.append(case)
    return cases


def select_cases(cases: Sequence[Case], select: str | Sequence[str] | None) -> list[Case]:
    """Cases whose id (or family, or a tag) matches any of the globs in ``select``."""
    if select is None:
        return list(cases)
    patterns = [select] if isinstance(select, str) else list(select)

    def hit(case: Case) -> bool:
        names = [case.id, *case.tags]
        return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)

    return [c for c in cases if hit(c)]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


def dump_case_file(family: str, description: str, cases: Sequence[Mapping[str, Any]]) -> str:
    """The canonical text of a case file: one top-level key of each case per line, values compact.

    Deterministic (fixed key order, no floats written differently across runs), so regenerating
    the corpus gives byte-identical files and a diff shows which case changed.
    """
    lines = [
        "{",
        f'"format": {_compact(CASE_FORMAT)},',
        f'"family": {_compact(family)},',
        f'"description": {_compact(description)},',
        '"cases": [',
    ]
    for index, case in enumerate(cases):
        keys = [k for k in _KEY_ORDER if k in case]
        extra = sorted(set(case) - set(_KEY_ORDER))
        if extra:
            raise CaseFormatError(f"case {case.get('id')!r}: unknown keys {extra}")
        body = ",\n".join(f"  {_compact(k)}: {_compact(case[k])}" for k in keys)
        tail = "," if index + 1 < len(cases) else ""
        lines.append("{\n" + body + "\n}" + tail)
    lines.append("]")
    lines.append("}")
    return "\n".join(lines) + "\n"
