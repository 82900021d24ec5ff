"""The conformance protocol for outside planners: declaring the input keys a planner implements
(``supports``, ``--supports``), and Ctrl-C during a run (issue 28).

A planner that ignores an input key it does not know plans another problem than the case's and
reads as ``fail``; with a declaration, such a case is ``unsupported`` and names the key. An
interrupted run still reports what ran, marked incomplete, and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from refplan.conformance import load_cases, run_conformance
from refplan.conformance.corpus import ALWAYS_INPUT_KEYS, INPUT_KEYS, Case, select_cases
from refplan.conformance.runner import Interrupted, add_conformance_arguments, run_conformance_cli

DATA = Path(__file__).parent / "data"
SPEC = Path(__file__).resolve().parents[1] / "spec" / "conformance.md"


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases()


def _reference() -> Callable[[dict[str, Any]], Any]:
    sys.path.insert(0, str(DATA))
    try:
        import refplan_planner
    finally:
        sys.path.remove(str(DATA))
    plan: Callable[[dict[str, Any]], Any] = refplan_planner.plan
    return plan


def _ignoring(keys: set[str] | None) -> Callable[[dict[str, Any]], Any]:
    """A planner that silently drops every optional input key it does not implement (the
    hand-written planner of the issue), declaring ``keys`` in ``supports`` when given."""
    reference = _reference()

    def plan(doc: dict[str, Any]) -> Any:
        kept = {k: v for k, v in doc.items() if k in ALWAYS_INPUT_KEYS or k in (keys or set())}
        return reference(kept)

    if keys is not None:
        plan.supports = keys  # type: ignore[attr-defined]
    return plan


def test_every_input_key_of_the_corpus_is_listed(cases: list[Case]) -> None:
    # The table the protocol (and spec/conformance.md) documents is every key an input carries.
    seen = {key for case in cases for key in case.input_doc()}
    assert seen <= set(INPUT_KEYS)
    assert {"answers", "budget", "endpoints", "element_size", "min_split_bytes", "process_node"} <= seen


def test_an_undeclared_key_makes_a_case_unsupported_naming_it(cases: list[Case]) -> None:
    chosen = [c for c in cases if c.input_keys() and c.input_keys() <= {"answers", "budget"}][:12]
    assert {"answers"} in [set(c.input_keys()) for c in chosen] and len(chosen) == 12
    undeclared = run_conformance(_ignoring(None), chosen)
    assert undeclared.counts()["fail"] > 0  # ignoring the keys without saying so fails cases
    declared = run_conformance(_ignoring(set()), chosen)
    assert declared.counts()["unsupported"] == len(chosen), declared.table()
    for result, case in zip(declared.results, chosen):
        assert result.reason.startswith("needs input key(s) "), result.reason
        assert all(key in result.reason for key in case.input_keys())
        assert result.seconds == 0.0  # never run


def test_a_declared_key_runs_its_cases(cases: list[Case]) -> None:
    chosen = [c for c in cases if c.input_keys() == {"answers"}][:6]
    report = run_conformance(_ignoring({"answers"}), chosen)
    assert report.counts()["unsupported"] == 0
    assert report.counts()["pass"] == len(chosen), report.table()


def test_the_supports_argument_overrides_the_attribute(cases: list[Case]) -> None:
    chosen = [c for c in cases if c.input_keys() == {"budget"}][:3]
    assert chosen
    report = run_conformance(_ignoring({"budget"}), chosen, supports=["answers"])
    assert report.counts()["unsupported"] == len(chosen)


def test_an_unknown_declared_key_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown input key.*budgets"):
        run_conformance(_ignoring({"budgets"}), [])
    with pytest.raises(ValueError, match="a set of input key names"):
        run_conformance(_reference(), [], supports="answers")


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    return run_conformance_cli(parser.parse_args(list(argv)))


def test_cli_supports_flag(cases: list[Case], capsys: pytest.CaptureFixture[str]) -> None:
    with_budget = next(c.id for c in cases if c.input_keys() == {"budget"})
    planner = f"cmd:{sys.executable} {DATA / 'refplan_planner.py'}"
    assert _cli("--planner", planner, "--case", with_budget, "--supports", "answers, endpoints", "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["unsupported"] == 1  # and the run checked nothing: --min-supported
    assert "budget" in report["results"][0]["reason"]
    assert _cli("--planner", planner, "--case", with_budget, "--supports", "budgett") == 2
    err = capsys.readouterr().err
    assert "budgett" in err and "min_split_bytes" in err and len(err.strip().splitlines()) == 1


def _interrupting(after: int) -> Callable[[dict[str, Any]], Any]:
    reference = _reference()
    calls = {"n": 0}

    def plan(doc: dict[str, Any]) -> Any:
        calls["n"] += 1
        if calls["n"] > after:
            raise KeyboardInterrupt
        return reference(doc)

    return plan


def test_ctrl_c_keeps_the_results_so_far(cases: list[Case]) -> None:
    chosen = select_cases(cases, "rules/*")[:6]
    with pytest.raises(Interrupted) as caught:
        run_conformance(_interrupting(3), chosen, once=True)  # once: the third call is the third case
    assert isinstance(caught.value, KeyboardInterrupt)
    report = caught.value.report
    assert report.incomplete and len(report.results) == 3 and caught.value.selected == 6
    assert report.to_dict()["incomplete"] is True


def test_cli_ctrl_c_writes_partial_json_and_junit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "stops_planner.py"
    module.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_conformance_protocol import _interrupting\n"
        "plan = _interrupting(2)\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    junit = tmp_path / "out.xml"
    code = _cli("--planner", "stops_planner:plan", "--case", "rules/*", "--json", "--junit", str(junit), "--once")
    assert code == 130
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["incomplete"] is True and len(report["results"]) == 2
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "interrupted after 2 of" in err[0] and "Traceback" not in captured.err
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"incomplete": "true"}


def test_a_complete_run_is_not_marked_incomplete(cases: list[Case]) -> None:
    report = run_conformance(_reference(), select_cases(cases, "rules/R2-*"))
    assert report.to_dict()["incomplete"] is False
    assert "property" not in report.junit_xml()


def test_spec_lists_every_input_key_and_the_answer_forms() -> None:
    text = SPEC.read_text(encoding="utf-8")
    for key in INPUT_KEYS:
        assert f"`{key}`" in text, key
    for form in ('"unsupported"', '"error"', "refplan.plans/1", "--supports", "130"):
        assert form in text, form


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("sh") is None, reason="the example needs sh and jq")
def test_the_spec_example_planner_works(
    cases: list[Case], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = SPEC.read_text(encoding="utf-8")
    script = text.split("```sh\n", 1)[1].split("```", 1)[0]
    assert 15 <= len(script.splitlines()) <= 25
    path = tmp_path / "my-planner.sh"
    path.write_text(script, encoding="utf-8")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    budget = next(c.id for c in cases if c.input_keys() == {"budget"})
    chosen = select_cases(cases, [budget, "batches/process-node-needs-endpoints", "rules/R2-*"])
    report = run_conformance(f"cmd:sh {path}", chosen)
    verdicts = {r.case_id: (r.verdict, r.reason) for r in report.results}
    assert verdicts.pop(budget) == ("unsupported", "planner: does not implement budget")
    assert {v for v, _ in verdicts.values()} == {"pass"}, report.table()
