"""The conformance runner against planners written to fool it, and case files written wrong.

A ``pass`` must be trusted: a wrong or malformed answer never gets one, a correct one never gets
``fail``, and nothing a planner answers (or a case file says) crashes the run, loses its report or
gives a wrong exit code. Each test here failed before the fix it names (an outside review,
2026-12-06): malformed plans crashed the runner or passed (no ``logical_shape``), a plan the
oracle cannot check was a ``fail``, ``SystemExit`` in a planner ended the run with exit 0,
non-UTF-8 stderr made a correct command planner an ``error``, a command that exited leaving a
child on its stdout was "timed out", a malformed case file was a traceback, and JUnit showed
``quality`` as a plain pass and broke on a control character in the planner's name.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from refplan.conformance import load_cases, run_conformance
from refplan.conformance.adapters import CommandAdapter, RefplanAdapter, make_adapter
from refplan.conformance.corpus import CaseFormatError
from refplan.conformance.corpus import load_cases as load_case_files
from refplan.conformance.runner import add_conformance_arguments, run_conformance_cli

CASE = "layouts/row_even-2to4"
CASES = {c.id: c for c in load_cases()}
PY = sys.executable


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    return run_conformance_cli(parser.parse_args(list(argv)))


def _right(doc: dict[str, Any]) -> dict[str, Any]:
    """refplan's own (correct) answer to a case input."""
    outcome = RefplanAdapter().plan(CASES[doc["id"]])
    if outcome.kind == "accept":
        return {"format": "refplan.plans/1", "parameters": copy.deepcopy(dict(outcome.plans or {}))}
    return {"error": outcome.error, "message": outcome.message}


def _with_segments(value: Any) -> Any:
    def planner(doc: dict[str, Any]) -> dict[str, Any]:
        answer = _right(doc)
        for plan in answer["parameters"].values():
            plan["segments"] = value(plan["segments"]) if callable(value) else value
        return answer
    return planner


@pytest.mark.parametrize(
    "segments", [None, 5, "x", lambda segs: {"segments": segs}, lambda segs: [segs]],
    ids=["null", "int", "str", "nested-object", "nested-list"],
)
def test_a_malformed_plan_is_a_fail_of_its_case_not_a_crash_of_the_run(segments: Any) -> None:
    report = run_conformance(_with_segments(segments), select=[CASE, "layouts/row_even-4to2"])
    assert [r.verdict for r in report.results] == ["fail", "fail"], report.table()
    assert all("is malformed" in r.reason for r in report.results), [r.reason for r in report.results]
    assert report.exit_code == 1
    ET.fromstring(report.junit_xml())  # the report is still written, and parses


def test_a_plan_without_its_logical_shape_does_not_pass() -> None:
    def planner(doc: dict[str, Any]) -> dict[str, Any]:
        answer = _right(doc)
        for plan in answer["parameters"].values():
            del plan["logical_shape"]
        return answer

    (result,) = run_conformance(planner, select=CASE).results
    assert result.verdict == "fail" and "logical_shape" in result.reason, result


def test_parameter_names_that_are_not_strings_are_a_fail_not_a_crash() -> None:
    def planner(doc: dict[str, Any]) -> dict[Any, Any]:
        plan = _right(doc)["parameters"]["param"]
        return {0: plan, "param": plan}  # names that do not sort together

    (result,) = run_conformance(planner, select=CASE).results
    assert result.verdict == "fail", result


def test_a_planner_that_calls_sys_exit_is_an_error_and_the_run_goes_on() -> None:
    calls = []

    def planner(doc: dict[str, Any]) -> dict[str, Any]:
        calls.append(doc["id"])
        if len(calls) == 1:
            return {"error": "InvalidMapError", "message": "refuses a valid case"}  # a failure
        sys.exit(0)

    report = run_conformance(planner, select=[CASE, "layouts/row_even-4to2"])
    assert [r.verdict for r in report.results] == ["fail", "error"], report.table()
    assert "SystemExit" in report.results[1].reason
    assert report.exit_code == 1


@pytest.mark.parametrize(
    "body", ["def plan(doc:\n", "raise RuntimeError('boom at import')\n", "import sys\nsys.exit(0)\n"],
    ids=["syntax", "raises", "exits"],
)
def test_a_planner_module_that_cannot_be_imported_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], body: str
) -> None:
    name = f"hostile_planner_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"importing '{name}' raised"):
        make_adapter(f"{name}:plan")
    assert _cli("--planner", f"{name}:plan", "--case", CASE) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _command_planner(tmp_path: Path, tail: str) -> str:
    """A command that answers right (refplan's plan) and then does ``tail``."""
    script = tmp_path / "planner.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_conformance_hostile import _right
        doc = json.load(sys.stdin)
        answer = json.dumps(_right(doc))
    """) + textwrap.dedent(tail), encoding="utf-8")
    return f"{PY} {script}"


def test_a_command_planner_may_write_any_bytes_on_stderr_and_log_lines_before_its_answer(tmp_path: Path) -> None:
    command = _command_planner(tmp_path, """
        sys.stderr.buffer.write(b"\\xff\\xfe not utf-8\\n")
        sys.stdout.buffer.write(b"log \\xff\\n" + answer.encode() + b"\\n")
    """)
    (result,) = run_conformance(CommandAdapter(command), select=CASE).results
    assert result.verdict == "pass", result


def test_a_command_that_exits_is_done_even_if_a_child_holds_its_stdout(tmp_path: Path) -> None:
    command = _command_planner(tmp_path, """
        print(answer, flush=True)
        if os.fork() == 0:  # a helper that inherited stdout and outlives the planner
            import time
            time.sleep(30)
            os._exit(0)
    """)
    started = time.monotonic()
    (result,) = run_conformance(CommandAdapter(command, timeout=20), select=CASE).results
    assert result.verdict == "pass", result
    assert time.monotonic() - started < 15  # not the timeout, nor the child's 30 s


def test_a_command_that_runs_past_its_timeout_is_still_stopped(tmp_path: Path) -> None:
    command = _command_planner(tmp_path, "import time\ntime.sleep(30)\n")
    started = time.monotonic()
    (result,) = run_conformance(CommandAdapter(command, timeout=2), select=CASE).results
    assert result.verdict == "error" and "ran past 2 s" in result.reason, result
    assert time.monotonic() - started < 12


def _rows_in_pairs(doc: dict[str, Any]) -> dict[str, Any]:
    """refplan's plan with each 2-D segment of even height written as rows taken two at a time:
    the same (source, target) address pairs, a 3-D view the oracle cannot read as a box."""
    answer = _right(doc)
    for plan in answer.get("parameters", {}).values():
        out = []
        for s in plan["segments"]:
            if len(s["shape"]) == 2 and s["shape"][0] % 2 == 0:
                (r, c), (sl, so, ss), (tl, to, ts) = s["shape"], s["source"], s["target"]
                s = {"shape": [r // 2, 2, c], "source": [sl, so, [2 * ss[0], ss[0], ss[1]]],
                     "target": [tl, to, [2 * ts[0], ts[0], ts[1]]]}
            out.append(s)
        plan["segments"] = out
    return answer


def test_a_correct_plan_the_oracle_cannot_check_is_unverifiable_never_fail_or_pass() -> None:
    report = run_conformance(_rows_in_pairs, select=["layouts/golden-billion-rows-row2-col4", CASE])
    verdicts = {r.case_id: r.verdict for r in report.results}
    assert verdicts == {"layouts/golden-billion-rows-row2-col4": "unverifiable", CASE: "pass"}, report.table()
    assert "1 unverifiable" in report.summary_line()
    assert report.exit_code == 1  # no conformance shown
    suite = ET.fromstring(report.junit_xml()).find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"


def test_a_string_that_equals_everything_cannot_name_the_error_class() -> None:
    class Liar(str):
        def __eq__(self, other: object) -> bool:
            return True

        def __ne__(self, other: object) -> bool:
            return False

        __hash__ = str.__hash__

    (result,) = run_conformance(lambda doc: {"error": Liar("NotAnErrorClass"), "message": "x"},
                                select="rules/R2-a6-shard-ndim-source").results
    assert result.verdict == "fail", result


def test_junit_marks_quality_and_fails_it_when_asked() -> None:
    report = run_conformance(lambda doc: _answer_reading_all_from(doc, 0), select="batches/balance-three-parameters")
    assert [r.verdict for r in report.results] == ["quality"], report.table()
    plain = ET.fromstring(report.junit_xml()).find("testsuite")
    assert plain is not None and plain.get("failures") == "0"
    assert plain.find("testcase/properties/property[@name='quality']") is not None
    strict = ET.fromstring(report.junit_xml(fail_on_quality=True)).find("testsuite")
    assert strict is not None and strict.get("failures") == "1"
    assert strict.find("testcase/failure") is not None


def _answer_reading_all_from(doc: dict[str, Any], location: int) -> dict[str, Any]:
    """refplan's plan with every multi-holder region read from ``location`` (first-holder)."""
    from refplan.formats import parse_maps
    from refplan.planner import plan_transfers
    from refplan.policies import POLICIES

    batch = parse_maps({"format": "refplan.maps/1", "parameters": doc["parameters"]})
    plans = plan_transfers(batch.pairs, replica_policy=POLICIES["first_holder"])
    assert all(s.source_rank == location for p in plans.values() for s in p.segments)
    return {"format": "refplan.plans/1", "parameters": {n: p.to_dict() for n, p in plans.items()}}


def test_a_control_character_in_the_planner_name_leaves_the_junit_readable() -> None:
    adapter = CommandAdapter(f"{PY} -c 'print(1)' \x01")
    report = run_conformance(adapter, select=CASE)
    suite = ET.fromstring(report.junit_xml()).find("testsuite")
    assert suite is not None and "print(1)" in (suite.get("name") or "")


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda c: c["requests"][0].__setitem__("candidates", 3), "requests[0].candidates"),
        (lambda c: c["expect"]["sources"][0].__setitem__("parameter", "nope"), "expect.sources[0].parameter"),
        (lambda c: c["expect"]["sources"][0].__setitem__("logical_origin", 0), "expect.sources[0].logical_origin"),
        (lambda c: c["expect"]["sources"][0].__setitem__("target_location", 999), "expect.sources[0].target_location"),
        (lambda c: c.__setitem__("endpoints", 7), "endpoints"),
    ],
    ids=["candidates", "sources-parameter", "sources-origin", "sources-location", "endpoints"],
)
def test_a_malformed_case_file_is_refused_naming_the_path(tmp_path: Path, change: Any, where: str) -> None:
    case = copy.deepcopy(dict(CASES["answers/int-pass"].raw))
    change(case)
    path = tmp_path / "cases.json"
    path.write_text(json.dumps({"format": "refplan.conformance/1", "family": "answers", "cases": [case]}),
                    encoding="utf-8")
    with pytest.raises(CaseFormatError, match=r"\$\.cases\[0\]\." + where.replace("[", r"\[").replace("]", r"\]")):
        load_case_files(path)
    assert _cli("--planner", "refplan", "--cases", str(path)) == 2
