"""``refplan.verify``: the independent oracle's public face, and the ``refplan verify`` command.

The oracle itself lives in ``refplan.oracle`` (verdicts, its own map validation, segments, the
judgement), which imports nothing of the planner. This module re-exports its public names, so
``from refplan.verify import verify_plan`` keeps working, and holds the command-line front end,
which reads files through ``files`` — a tool's concern, kept out of the oracle's import closure.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import limits
from .errors import AffineTransferError, InputFileError, InvalidMapError
from .formats import (
    STDIN,
    MapsBatch,
    PlansStream,
    check_keys,
    load_json,
    parse_plans,
    read_maps,
    stdout_gone,
    unwritable,
    write_text_file,
    xml_text,
)
from .oracle import FALLBACK_MAX_ELEMENTS, MAX_COORDINATE, BatchVerdict, Verdict, verify_plan, verify_plans
from .oracle.stream import verify_stream
from .plan import TransferPlan

__all__ = [
    "FALLBACK_MAX_ELEMENTS",
    "MAX_COORDINATE",
    "BatchVerdict",
    "Verdict",
    "run_verify_cli",
    "segment_counterexamples",
    "verify_plan",
    "verify_plans",
    "verify_stream",
]


SEGMENT_COUNTEREXAMPLES = 20
"""How many wrong segments ``segment_counterexamples`` (and ``refplan verify --all``) lists per parameter."""
SEGMENTS_SCANNED = 10_000
"""How many of a plan's segments it judges one by one, at most (the first ones, in plan order)."""


def segment_counterexamples(
    target_map: Any, source_map: Any, plan: Any, *, limit: int = SEGMENT_COUNTEREXAMPLES,
    scan: int = SEGMENTS_SCANNED,
) -> tuple[list[tuple[int, Verdict]], int]:
    """Every segment of ``plan`` that is wrong on its own, with the oracle's judgement of it, up to
    ``limit`` among the first ``scan``; and how many segments were judged.

    The oracle stops at a plan's first counterexample, which is what a verdict needs and not what
    someone fixing a planner with five bugs wants. What a segment does by itself (stay inside both
    shards, write each target address once, read the logical element each target address needs
    from a source address that holds it) does not depend on the other segments, so each is judged
    alone by the same oracle, only the gap check left out; an address written by two segments or
    by none is the plan's verdict's business. Each verdict names its segment as ``segment 0``.
    """
    from .oracle.judge import segment_errors

    return segment_errors(target_map, source_map, plan, limit=limit, scan=scan)


def run_verify_cli(
    maps_path: str,
    plans_path: str,
    *,
    as_json: bool = False,
    quiet: bool = False,
    stream: bool | None = None,
    verbose: bool = False,
    junit: str | None = None,
    all_failures: bool = False,
) -> int:
    """``refplan verify MAPS.json PLANS.json``: print a report, return the exit code.

    Exit 0 ok, 1 invalid, 3 unverifiable, 2 bad input: a file that cannot be read or parsed, or a
    map that fails validation, each one line on stderr (``refplan verify: <class>: <message>``,
    the line ``refplan plan`` and ``refplan show`` print for the same input). A map whose sizes
    the planner refuses (an extent or a tensor above 2**62 elements) is refused here too, with
    the planner's message, before the oracle (which would only call it unverifiable) sees it,
    and so is a file whose ``endpoints`` or ``process_node`` the planner refuses (``_check_bindings``).
    The plans file is a ``refplan.plans/1`` batch, or a bare ``{logical_shape, segments}`` plan
    dict (DeepSpeed's) when the maps file holds exactly one parameter. ``quiet`` prints no text
    report (the exit code says it all; ``--json`` is still printed, since it was asked for).

    The text report is a summary line and every parameter that is not ok, at most
    ``_CLI_SHOWN`` of them unless ``all_failures`` (the oracle gives one counterexample per
    parameter, the first it finds); a map error is printed once, on stderr. ``verbose`` adds the
    ok parameters and, under each failing one, the offending segments in their dict form.
    ``junit`` writes a JUnit XML file: one testcase per parameter, ``invalid`` a failure,
    ``invalid_map`` an error, ``unverifiable`` skipped, each with the verdict's text.

    ``stream`` reads the plans file one parameter at a time (``formats.PlansStream``,
    ``oracle.stream.verify_stream``), holding one plan instead of the batch; ``None`` (the
    default) streams files of at least ``limits.STREAM_PLANS_BYTES``. The report, the exit code
    and every error line are the same either way; streaming adds one line on stderr saying so
    (not with ``quiet``).
    """
    if maps_path == STDIN and plans_path == STDIN:
        return _cli_error(InputFileError("-: standard input is named for both the maps and the plans; it can be "
                                         "read once"))
    if plans_path == STDIN:
        # Read once and whole: the streaming reader reads its file twice (a document that is not
        # an object is read again whole), and a pipe has no size to choose by.
        if stream:
            return _cli_error(InputFileError("-: --stream reads its file twice, and standard input can be read "
                                             "once: save the plans to a file"))
        stream = False
    if junit is not None:
        if junit == STDIN and as_json:  # one stream, two documents: neither would parse
            print("refplan verify: --junit - and --json both write to standard output; write one to a file",
                  file=sys.stderr)
            return 2
        problem = unwritable(junit)
        if problem is not None:  # before the run: a verdict computed and then dropped for a path's typo
            print(f"refplan verify: {problem}", file=sys.stderr)
            return 2
    try:
        batch = read_maps(maps_path)
        _cli_check_sizes(batch)
    except (AffineTransferError, InputFileError) as exc:
        return _cli_error(exc)
    if stream is None:
        try:
            size = os.path.getsize(plans_path)
        except OSError:
            size = 0  # the reader reports it
        stream = size >= limits.STREAM_PLANS_BYTES
        why = f"{size} bytes, at least the {limits.STREAM_PLANS_BYTES}-byte threshold"
    else:
        why = "as asked"
    if stream and not quiet:
        print(f"refplan verify: streaming {plans_path} ({why}): one parameter at a time", file=sys.stderr)
    details = _Details()
    wanted = not as_json and not quiet and (verbose or all_failures)

    def note(name: str, plan: Any, verdict: Verdict) -> None:
        details.add(batch, name, plan, verdict, verbose, all_failures)

    try:
        if stream:
            result = _verify_streaming(batch, plans_path, note if wanted else None)
        else:
            plans = _plans_of(load_json(plans_path), batch, plans_path)
            result = verify_plans(batch.pairs, plans)
            if wanted:
                for name, plan in plans.items():
                    note(name, plan, result.verdicts[name])
    except InputFileError as exc:
        return _cli_error(exc)
    except AffineTransferError as exc:
        text = str(exc)
        return _cli_error(exc, text if text.startswith(str(plans_path)) else f"{plans_path}: {text}")
    if junit is not None:
        try:
            write_text_file(junit, _cli_junit(result, maps_path, plans_path))
        except OSError as exc:
            print(f"refplan verify: cannot write {junit}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    try:
        if as_json:
            print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        elif not quiet:  # beside a JUnit file on standard output, the text goes to stderr
            print(_cli_report(result, verbose=verbose, all_failures=all_failures, offending=details.offending,
                              more=details.more), file=sys.stderr if junit == STDIN else sys.stdout)
        for name in sorted(result.verdicts):
            verdict = result.verdicts[name]
            if verdict.status == "invalid_map":
                kind, _, text = (verdict.map_error or "").partition(": ")
                print(_cli_one_line(f"refplan verify: {kind}: parameter {name!r}: {text}"), file=sys.stderr)
                if not all_failures:  # ``--all`` lists every parameter that is not ok, these included
                    break
        sys.stdout.flush()
    except BrokenPipeError:
        # The report's reader went away (``| head``); the verdict stands. This returned 0, whatever
        # the verdict, so ``set -o pipefail`` passed an unverifiable plan (an outside probe, 2026-12-07).
        stdout_gone()
    return result.exit_code


_CLI_SHOWN = 20
"""Parameters listed in ``refplan verify``'s text report without ``--all`` (a batch of 10⁵
parameters that all fail the same way says so in 20 lines; ``--json`` and ``--all`` have all)."""


def _cli_one_line(text: str) -> str:
    return "\\n".join(text.splitlines())


def _cli_error(exc: BaseException, text: str | None = None) -> int:
    """One line on stderr, ``refplan verify: <class>: <message>`` as ``refplan plan`` prints it; exit 2."""
    message = str(exc) if text is None else text
    print(_cli_one_line(f"refplan verify: {type(exc).__name__}: {message}"), file=sys.stderr)
    return 2


def _cli_check_sizes(batch: MapsBatch) -> None:
    """Refuse a maps file the planner refuses for its sizes or its bindings, with the planner's
    class and message form.

    The oracle calls a tensor above 2**62 elements ``unverifiable`` (exit 3, "could not check"),
    which is right for the oracle as a library and wrong for a file no tool can use: ``refplan
    plan`` and ``refplan show`` refuse it as ``InvalidMapError`` (exit 2), and so must verify.
    The same holds for the file's ``endpoints`` and ``process_node``: they are planner arguments,
    not map rules, so the oracle never reads them, but a file whose endpoints leave a location
    that holds data unbound (or whose ``process_node`` comes without endpoints, or leaves such a
    location's process without a node) is one ``plan`` refuses, and verify answered ``ok`` for
    it. Only these rules are borrowed (``frames.check_sizes`` and ``_check_bindings``); the plan
    is still judged by the independent oracle alone.
    """
    from .frames import check_sizes

    check_sizes(batch.pairs)
    _check_bindings(batch)


def _check_bindings(batch: MapsBatch) -> None:
    """The planner's binding rules for a maps file (``requests._process_of`` / ``_node_of``):
    every location with a non-empty piece has a process, and with ``process_node`` every such
    process a node. A target covers the tensor and the source regions tile it (R25, R26), so
    exactly these locations are the ones the planner's requests bind. Parameters in name order,
    target side first, smallest location first: one message, the first this order meets."""
    from .endpoints import PROCESS_NODE_NEEDS_ENDPOINTS
    from .requests import _node_of, _process_of

    if batch.process_node is not None and batch.endpoints is None:
        raise InvalidMapError(PROCESS_NODE_NEEDS_ENDPOINTS)
    if batch.endpoints is None:
        return
    nodes = batch.process_node
    for name in sorted(batch.pairs):
        for side, mapping in zip(("target", "source"), batch.pairs[name]):
            table = batch.endpoints.target if side == "target" else batch.endpoints.source
            holding = sorted(loc for loc, pieces in mapping.pieces_by_rank.items()
                             if any(piece.numel > 0 for piece in pieces))
            for location in holding:
                process = _process_of(table, location, side, name)
                if nodes is not None:
                    _node_of(nodes, process, name)


def _cli_summary(result: BatchVerdict) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in result.counts().items() if n)
    return f"refplan verify: {len(result.verdicts)} parameter(s): {counts or 'none'} -> {result.status}"


def _cli_report(
    result: BatchVerdict, *, verbose: bool, all_failures: bool, offending: Mapping[str, list[dict[str, Any]]],
    more: Mapping[str, list[str]] | None = None,
) -> str:
    """The text report: summary, then the parameters that failed (a map error is left to the
    stderr line, so that it is printed once), bounded unless ``all_failures``."""
    lines = [_cli_summary(result)]
    failing = [n for n in sorted(result.verdicts) if result.verdicts[n].status in ("invalid", "unverifiable")]
    shown = failing if all_failures else failing[:_CLI_SHOWN]
    listed = set(shown)
    for name in sorted(result.verdicts) if verbose else shown:
        verdict = result.verdicts[name]
        if verdict.status == "invalid_map" or (name not in listed and verdict.status != "ok"):
            continue
        lines.append(f"  {verdict}")
        for index, segment in zip(verdict.segments, offending.get(name, ())):
            lines.append(f"    segment {index}: {json.dumps(segment, sort_keys=True)}")
        lines.extend(f"    also: {text}" for text in (more or {}).get(name, ()))
    if len(failing) > len(shown):
        lines.append(f"  ... and {len(failing) - len(shown)} more parameter(s) not ok (--all lists every one, "
                     "--json gives them all)")
    return "\n".join(lines)


def _more_lines(verdict: Verdict, target: Any, source: Any, plan: TransferPlan) -> list[str]:
    """``--all``: every other segment of an invalid plan that is wrong on its own
    (``segment_counterexamples``), bounded, and a line saying when the bound cut the list."""
    first = set(verdict.segments)
    found, scanned = segment_counterexamples(target, source, plan, limit=SEGMENT_COUNTEREXAMPLES + len(first) + 1)
    rest = [(k, v) for k, v in found if k not in first]
    # A one-segment plan's verdict calls its segment "segment 0": name it as the plan does.
    lines = [re.sub(r"\bsegment 0\b", f"segment {k}", v.reason) for k, v in rest[:SEGMENT_COUNTEREXAMPLES]]
    if len(rest) > SEGMENT_COUNTEREXAMPLES:
        lines.append(f"... (at most {SEGMENT_COUNTEREXAMPLES} wrong segments listed per parameter)")
    if scanned < len(plan.segments):
        lines.append(f"... (the first {scanned} of {len(plan.segments)} segments were judged one by one)")
    return lines


def _offending_dicts(verdict: Verdict, plan: TransferPlan) -> list[dict[str, Any]]:
    """``-v``: the dict form of the segments a verdict that is not ok names."""
    segments = plan.segments
    return [segments[i].to_dict() for i in verdict.segments if 0 <= i < len(segments)]


@dataclass
class _Details:
    """What ``-v`` (``offending``) and ``--all`` (``more``) print under the failing parameters."""

    offending: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    more: dict[str, list[str]] = field(default_factory=dict)

    def add(self, batch: MapsBatch, name: str, plan: Any, verdict: Verdict, verbose: bool, every: bool) -> None:
        """Called with each plan while it is held (``verify_stream``'s ``on_verdict``), or over a
        whole file's plans: no plan is ever read twice (a pipe cannot be)."""
        self.offending.pop(name, None)  # a name given twice keeps its later plan's details only
        self.more.pop(name, None)
        if not isinstance(plan, TransferPlan):
            return
        if verbose and verdict.status != "ok" and verdict.segments:
            self.offending[name] = _offending_dicts(verdict, plan)
        if every and verdict.status == "invalid" and name in batch.pairs:
            target, source = batch.pairs[name]
            self.more[name] = _more_lines(verdict, target, source, plan)


def _cli_junit(result: BatchVerdict, maps_path: str, plans_path: str) -> str:
    """JUnit XML for CI: one testcase per parameter; ``invalid`` is a failure, ``invalid_map`` an
    error (the input, not the plan), ``unverifiable`` skipped (not checked), each with the
    verdict's text, so a CI page shows the counterexample without the log."""
    import xml.etree.ElementTree as ET

    counts = result.counts()
    suite = ET.Element(
        "testsuite", name=xml_text(f"refplan-verify[{plans_path}]"), tests=str(len(result.verdicts)),
        failures=str(counts["invalid"]), errors=str(counts["invalid_map"]), skipped=str(counts["unverifiable"]),
    )
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="maps", value=xml_text(str(maps_path)))
    ET.SubElement(properties, "property", name="status", value=result.status)
    for name in sorted(result.verdicts):
        verdict = result.verdicts[name]
        # Names and texts as XML can hold them (``xml_text``): a name is any JSON string.
        case = ET.SubElement(suite, "testcase", classname="refplan.verify", name=xml_text(name))
        text = xml_text(str(verdict))
        if verdict.status == "invalid":
            ET.SubElement(case, "failure", message=text[:500], type="invalid").text = text
        elif verdict.status == "invalid_map":
            ET.SubElement(case, "error", message=text[:500], type="invalid_map").text = text
        elif verdict.status == "unverifiable":
            ET.SubElement(case, "skipped", message=text[:500])
    suites = ET.Element("testsuites")
    suites.append(suite)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _plans_of(doc: Any, batch: MapsBatch, plans_path: str) -> dict[str, TransferPlan]:
    """The plans of a whole plans document: a ``refplan.plans/1`` batch, or a bare plan dict
    for a maps file of one parameter."""
    if isinstance(doc, Mapping) and "format" not in doc and "segments" in doc:
        if len(batch.pairs) != 1:
            raise InvalidMapError(
                f"{plans_path}: $: a bare plan needs a maps file with exactly one parameter, "
                f"this one has {len(batch.pairs)}"
            )
        (name,) = batch.pairs
        check_keys(doc, "plan")
        return {name: TransferPlan.from_dict(doc, "$")}
    return parse_plans(doc, from_json=True)


def _verify_streaming(
    batch: MapsBatch, plans_path: str, note: Callable[[str, Any, Verdict], None] | None = None
) -> BatchVerdict:
    """Judge each plan as ``PlansStream`` reads it (``note`` sees each while it is held); a
    document that turns out not to be a plans batch (a bare plan) is handled as the whole-file
    path handles it, from the document already read."""
    plans = PlansStream(plans_path)
    result = verify_stream(batch.pairs, plans, on_verdict=note)
    if not plans.streamed:
        whole = _plans_of(plans.document, batch, plans_path)
        result = verify_plans(batch.pairs, whole)
        if note is not None:
            for name, plan in whole.items():
                note(name, plan, result.verdicts[name])
    return result
