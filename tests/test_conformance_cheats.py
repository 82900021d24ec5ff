"""What an outside probe (2026-12-07) found the conformance suite gave planners that did not earn it.

Each test fails on the runner before its fix: a plan over the case's budget passed; a ``cmd:``
answer naming one parameter twice (wrong plan first, right one last) passed; a refusal of the right
family, by a subclass (refplan's own ``PolicyRaisedError``), failed as "the wrong error class";
numpy arrays in an in-process answer were an adapter error; ``--markdown`` silently dropped
``--planner``; an in-process planner's ``print()`` broke ``--json``; a planner answering one input
differently on each call passed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from refplan.conformance import load_cases, run_conformance
from refplan.conformance.corpus import Case, select_cases
from refplan.conformance.runner import add_conformance_arguments, run_conformance_cli

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from refplan_planner import plan as refplan_plan  # noqa: E402

PY = sys.executable


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    return run_conformance_cli(parser.parse_args(list(argv)))


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases()


def _ones(doc: dict[str, Any]) -> dict[str, Any]:
    """refplan's answer with every segment cut into one-element segments, the budget ignored."""
    answer = refplan_plan({k: v for k, v in doc.items() if k != "budget"})
    for plan in answer["parameters"].values():
        cut = []
        for s in plan["segments"]:
            (src, s_off, s_str), (tgt, t_off, t_str) = s["source"], s["target"]
            for index in np.ndindex(*s["shape"]):
                cut.append({"shape": [1] * len(index),
                            "source": [src, s_off + sum(i * k for i, k in zip(index, s_str)), s_str],
                            "target": [tgt, t_off + sum(i * k for i, k in zip(index, t_str)), t_str]})
        plan["segments"] = cut
    return answer


def test_an_accepted_plan_over_the_case_budget_fails(cases: list[Case]) -> None:
    chosen = select_cases(cases, ["rules/R31-max-segments-8-accepted", "rules/R32-a21-envelope-exact"])
    report = run_conformance(_ones, chosen)
    reasons = {r.case_id: (r.verdict, r.reason) for r in report.results}
    assert reasons["rules/R31-max-segments-8-accepted"][0] == "fail"
    assert "has 64 segments, above max_segments=8" in reasons["rules/R31-max-segments-8-accepted"][1]
    assert reasons["rules/R32-a21-envelope-exact"][0] == "fail"
    assert "bytes, above max_plan_bytes=" in reasons["rules/R32-a21-envelope-exact"][1]
    assert report.exit_code == 1
    assert run_conformance(refplan_plan, chosen).counts()["pass"] == 2  # within the budget: passes


def test_a_cmd_answer_naming_a_key_twice_or_nan_is_an_error(cases: list[Case], tmp_path: Path) -> None:
    (case,) = select_cases(cases, ["layouts/row_even-2to2"])
    right = json.dumps(refplan_plan(case.input_doc())["parameters"]["param"])
    wrong = right.replace('"segments":[', '"segments":[{"shape":[1,1],"source":[0,0,[1,1]],"target":[0,1,[1,1]]},', 1)
    head = '{"format":"refplan.plans/1","parameters":{"param":'
    answers = {"twice": f'{head}{wrong},"param":{right}}}}}', "nan": f'{head}{right}}},"x":NaN}}',
               "right": f"{head}{right}}}}}"}
    verdicts = {}
    for name, text in answers.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text, encoding="utf-8")
        (result,) = run_conformance(f"cmd:cat {path}", [case]).results
        verdicts[name] = (result.verdict, result.reason)
    assert verdicts["twice"] == ("error", "the answer is not strict JSON: key 'param' appears twice in one object; "
                                          "exit 0")
    assert verdicts["nan"] == ("error", "the answer is not strict JSON: NaN is no JSON number; exit 0")
    assert verdicts["right"] == ("pass", "")


def test_a_refusal_by_a_subclass_of_the_right_error_is_that_error(cases: list[Case]) -> None:
    from refplan.errors import InvalidReplicaPolicyError, PolicyRaisedError

    assert issubclass(PolicyRaisedError, InvalidReplicaPolicyError)

    def refuses(doc: dict[str, Any]) -> Any:
        raise PolicyRaisedError("the policy raised")

    chosen = select_cases(cases, ["answers/R29-a11-string", "rules/R0-a7-reshape"])
    assert [c.expect.error for c in chosen] == ["InvalidReplicaPolicyError", "InvalidMapError"]
    # the right family where the case names it, and still the wrong class where it does not
    assert [r.verdict for r in run_conformance(refuses, chosen).results] == ["pass", "fail"]


def test_numpy_arrays_in_an_in_process_answer_are_lists(cases: list[Case]) -> None:
    def arrays(doc: dict[str, Any]) -> dict[str, Any]:
        answer = refplan_plan(doc)
        for plan in answer["parameters"].values():
            plan["logical_shape"] = np.array(plan["logical_shape"])
            for s in plan["segments"]:
                s["shape"] = np.array(s["shape"], dtype=np.int64)
                s["source"] = [np.int64(s["source"][0]), s["source"][1], np.array(s["source"][2])]
        return answer

    report = run_conformance(arrays, select_cases(cases, ["layouts/row_even-2to4", "layouts/bigcode-2to4"]))
    assert report.counts()["pass"] == 2, report.table()


def test_markdown_and_dump_refuse_options_they_would_drop(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _cli("--planner", "no_such_module:plan", "--markdown", str(tmp_path / "r.md")) == 2
    assert "--planner does nothing with --markdown" in capsys.readouterr().err
    assert _cli("--dump", "rules/R0-a7-reshape", "--timeout", "5") == 2
    assert "--timeout does nothing with --dump" in capsys.readouterr().err
    assert not (tmp_path / "r.md").exists()


def test_an_in_process_planners_prints_leave_the_json_report_alone(
    cases: list[Case], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "chatty_planner.py").write_text(
        "from refplan_planner import plan as inner\n\n"
        "def plan(doc):\n    print('planning', doc['id'])\n    return inner(doc)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _cli("--planner", "chatty_planner:plan", "--case", "layouts/row_even-2to*", "--json")
    assert code == 0
    report = json.loads(out.getvalue())
    assert report["counts"]["pass"] >= 1 and "planning layouts/row_even-2to2" in err.getvalue()


def test_a_planner_answering_one_input_two_ways_fails(cases: list[Case]) -> None:
    chosen = select_cases(cases, ["replicas/holders-at-different-offsets-split", "layouts/bigcode-2x2dp-to4"])
    draw = random.Random(7)

    def shuffled(doc: dict[str, Any]) -> dict[str, Any]:
        answer = refplan_plan(doc)
        for plan in answer.get("parameters", {}).values():
            draw.shuffle(plan["segments"])  # the same copies, in another order each call
        return answer

    report = run_conformance(shuffled, chosen)
    assert {r.verdict for r in report.results} == {"fail"}, report.table()
    assert all(r.reason == "not deterministic: planned twice, the same input gave a different plan"
               for r in report.results)
    assert report.exit_code == 1
    assert run_conformance(shuffled, chosen, once=True).counts()["pass"] == 2  # once: not checked
    assert run_conformance(refplan_plan, chosen).counts()["pass"] == 2  # a deterministic planner passes


def test_any_planner_is_explored_on_cases_it_cannot_look_up(tmp_path: Path) -> None:
    """The corpus is public, so a planner can recognise its cases; ``--explore`` drew unseen ones
    for the built-in peers only and refused every other planner. Now any planner is explored in
    the general domain (planned twice, as in a corpus run), and one that answers ``unsupported`` to
    every draw exits 1 as in a corpus run (``--min-supported``)."""
    from refplan.conformance.adapters import FunctionAdapter
    from refplan.conformance.explore import GENERAL, domain_of, explore

    assert domain_of("cmd:./mine") is GENERAL and domain_of("dcp").dtensor
    honest = explore("mine:plan", FunctionAdapter(refplan_plan), 8, seed=5, shrink=False)
    assert honest.explored == 8 and honest.counts["pass"] == 8, honest.counts
    draw = random.Random(3)

    def shuffled(doc: dict[str, Any]) -> dict[str, Any]:
        answer = refplan_plan(doc)
        for plan in answer.get("parameters", {}).values():
            draw.shuffle(plan["segments"])
        return answer

    cheat = explore("mine:plan", FunctionAdapter(shuffled), 8, seed=5, shrink=False)
    assert cheat.counts["fail"] >= 1 and not cheat.ok, cheat.counts
    dodge = tmp_path / "dodge.py"
    dodge.write_text("import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'unsupported': 'no'}))\n",
                     encoding="utf-8")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = _cli("--planner", f"cmd:{PY} {dodge}", "--explore", "3")
    assert code == 1 and "only 0 of 3 drawn configurations ran (--min-supported 1)" in err.getvalue()
