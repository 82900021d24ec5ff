"""The conformance suite: corpus, runner, adapters, reports, the committed docs.

- refplan passes every case of the corpus (except the refplan discrepancies listed below, which
  must keep failing exactly as recorded until refplan is fixed: then delete them here);
- DeepSpeed's summary matches the committed ``docs/conformance.md`` (skipped, visibly, without it);
- the subprocess adapter passes a planner that wraps refplan and fails one that answers wrongly;
- the corpus regenerates byte for byte and validates against the JSON schema.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from refplan.cli.generate_corpus import build_corpus
from refplan.conformance import load_cases, run_conformance
from refplan.conformance.adapters import Adapter, Outcome, RefplanAdapter, make_adapter
from refplan.conformance.corpus import CASES_DIR, INPUT_FORMAT, Case, CaseFormatError, parse_case, select_cases
from refplan.conformance.runner import add_conformance_arguments, judge, run_conformance_cli

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
DOCS = ROOT / "docs" / "conformance.md"
SCHEMA = ROOT / "spec" / "schemas" / "conformance-case.schema.json"
PY = sys.executable

KNOWN_REFPLAN_DISCREPANCIES: dict[str, str] = {}
"""Cases refplan fails today, with the reason; must stay empty for the reference to be the reference."""


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases()


@pytest.fixture(scope="module")
def refplan_report(cases: list[Case]) -> Any:
    return run_conformance("refplan", cases)


@pytest.fixture(scope="module")
def deepspeed() -> Adapter:
    """DeepSpeed's adapter, or the test skipped (visibly) without DeepSpeed."""
    try:
        return make_adapter("deepspeed")
    except ValueError as exc:
        pytest.skip(f"DeepSpeed is not importable: {exc}")


# ---------------------------------------------------------------------------------------------
# The corpus.


def test_corpus_size_and_coverage(cases: list[Case]) -> None:
    assert len(cases) >= 150
    families = Counter(c.family for c in cases)
    assert set(families) == {"rules", "layouts", "replicas", "answers", "batches", "peers"}
    tags = {t for c in cases for t in c.tags}
    missing_rules = [f"R{i}" for i in range(0, 33) if f"R{i}" not in tags]
    assert missing_rules == [], missing_rules
    missing_a = [f"A{i}" for i in range(1, 23) if f"A{i}" not in tags]
    assert missing_a == [], missing_a
    assert all(c.why.strip() and "\n" not in c.why for c in cases)
    assert len({c.id for c in cases}) == len(cases)
    # Every answer check with a passing and a failing answer; layouts over degrees; edge cases.
    for tag in ("answer:split", "min-split", "answer:int", "1e9", "size-1", "non-contiguous", "target-replicas",
                "holders-offsets", "empty-pieces", "balance", "local-first"):
        assert tag in tags, tag
    outcomes = Counter((t, c.expect.outcome) for c in cases for t in c.tags if t.startswith("answer:"))
    assert outcomes[("answer:split", "accept")] and outcomes[("answer:gap", "refuse")]
    assert outcomes[("answer:int", "accept")] and outcomes[("answer:location", "refuse")]


def test_corpus_regenerates_byte_identically() -> None:
    built = build_corpus()
    committed = {p.name: p.read_text(encoding="utf-8") for p in CASES_DIR.glob("*.json")}
    assert sorted(built) == sorted(committed)
    for name, text in built.items():
        assert text == committed[name], f"{name} differs from a fresh `python -m refplan.cli.generate_corpus`"


def test_no_case_repeats_another_unless_it_says_so() -> None:
    """The same input counted twice inflates every planner's totals and each finding's case count.
    The one deliberate repeat (R1's target side: both sides of R1 are the source's check) is declared."""
    first: dict[str, str] = {}
    repeats = []
    for path in sorted(CASES_DIR.glob("*.json")):
        for case in json.loads(path.read_text(encoding="utf-8"))["cases"]:
            key = json.dumps({k: v for k, v in case.items() if k not in ("id", "why", "tags")}, sort_keys=True)
            if key in first:
                repeats.append((first[key], case["id"]))
            first.setdefault(key, case["id"])
    assert repeats == [("rules/R1-max-ndim-source", "rules/R1-max-ndim-target")]


def test_the_generator_refuses_a_repeated_case_unless_declared() -> None:
    from refplan.cli.generate_corpus import Family, accept, full

    f = Family("demo", "two cases")
    assert f.add("one", "a map to itself", ["x"], (full((4,)), full((4,))), accept())
    with pytest.raises(RuntimeError, match="demo/two repeats demo/one"):
        f.add("two", "the same again", ["y"], (full((4,)), full((4,))), accept())
    assert not f.add("two", "the same, from a loop", ["y"], (full((4,)), full((4,))), accept(), unless_seen=True)
    with pytest.raises(RuntimeError, match="same_as='zero', but it repeats demo/one"):
        f.add("three", "declared wrongly", ["y"], (full((4,)), full((4,))), accept(), same_as="zero")
    with pytest.raises(RuntimeError, match="repeats no earlier case"):
        f.add("four", "declared, but new", ["y"], (full((5,)), full((5,))), accept(), same_as="one")
    assert f.add("five", "declared rightly", ["y"], (full((4,)), full((4,))), accept(), same_as="one")
    assert [c["id"] for c in f.cases] == ["demo/one", "demo/five"]


@pytest.mark.skipif(not SCHEMA.exists(), reason="spec/schemas/conformance-case.schema.json is not present")
def test_case_files_validate_against_the_schema(cases: list[Case]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    schemas = [json.loads(p.read_text(encoding="utf-8")) for p in SCHEMA.parent.glob("*.json")]
    registry = referencing.Registry().with_resources(
        [(s["$id"], referencing.Resource.from_contents(s)) for s in schemas if "$id" in s]
    )
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")), registry=registry)
    for path in sorted(CASES_DIR.glob("*.json")):
        errors = [f"{e.json_path}: {e.message[:200]}" for e in validator.iter_errors(json.loads(path.read_text()))]
        assert errors == [], f"{path.name}: {errors[:3]}"
    for case in cases[::40]:  # what a planner receives validates too
        assert list(validator.iter_errors(case.input_doc())) == []


def test_input_doc_hides_the_expectation(cases: list[Case]) -> None:
    for case in cases:
        doc = case.input_doc()
        assert doc["format"] == INPUT_FORMAT and doc["id"] == case.id
        assert not {"expect", "why", "tags"} & set(doc)
        assert ("answers" in doc) == (case.answers is not None)


def test_bad_case_file_names_file_and_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "refplan.conformance/1", "family": "x", "cases": [
        {"id": "x/one", "why": "w", "parameters": {"p": {"target": {}, "source": {}}},
         "expect": {"outcome": "refuse", "error": "KeyError"}}]}))
    with pytest.raises(CaseFormatError, match=r"bad\.json: \$\.cases\[0\]\.expect\.error"):
        load_cases(bad)


# ---------------------------------------------------------------------------------------------
# refplan against its own corpus.


def test_refplan_passes_every_case(refplan_report: Any) -> None:
    failing = {r.case_id: r for r in refplan_report.results if r.verdict != "pass"}
    unexpected = {k: f"{v.verdict}: {v.reason}" for k, v in failing.items() if k not in KNOWN_REFPLAN_DISCREPANCIES}
    assert unexpected == {}
    for case_id, reason in KNOWN_REFPLAN_DISCREPANCIES.items():
        assert case_id in failing, f"{case_id} passes now: remove it from KNOWN_REFPLAN_DISCREPANCIES"
        assert failing[case_id].verdict == "fail" and reason in failing[case_id].reason
    assert refplan_report.counts()["unsupported"] == 0


def test_docs_refplan_summary_matches(refplan_report: Any) -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert f"| refplan | `{refplan_report.summary_line()}` |" in text


def test_deepspeed_summary_matches_docs(cases: list[Case], deepspeed: Adapter) -> None:
    report = run_conformance(deepspeed, cases)
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(r"^\| (deepspeed [^|]*) \| `([^`]*)` \|$", text, re.MULTILINE)
    assert match, "docs/conformance.md has no DeepSpeed summary row"
    assert (match.group(1).strip(), match.group(2)) == (report.planner, report.summary_line()), (
        "regenerate with `python -m refplan.conformance.runner --markdown docs/conformance.md`"
    )
    # Every case the docs list as a DeepSpeed failure is one.
    for r in report.results:
        if r.verdict == "fail":
            assert f"`{r.case_id}`" in text


# ---------------------------------------------------------------------------------------------
# External planners: the subprocess protocol and in-process callables.

SAMPLE = [
    "rules/R0-a7-reshape", "rules/R24-a20-source-replicas-cut-differently", "rules/R32-a21-envelope-exact",
    "layouts/bigcode-2x2dp-to4", "replicas/holders-at-different-offsets-split", "answers/R29-a11-true",
    "answers/split-gap", "batches/local-first",
]


def test_cmd_planner_wrapping_refplan_passes(cases: list[Case]) -> None:
    # One process per case (~0.5 s of interpreter and numpy start-up each), so a sample of kinds.
    chosen = select_cases(cases, SAMPLE)
    assert len(chosen) == len(SAMPLE)
    report = run_conformance(f'cmd:"{PY} {DATA / "refplan_planner.py"}"', chosen)
    expected = {"pass": len(SAMPLE), "fail": 0, "unsupported": 0, "error": 0, "quality": 0}
    assert report.counts() == expected, report.table()


def test_module_planner_wrapping_refplan_passes(cases: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DATA))
    report = run_conformance("refplan_planner:plan", select_cases(cases, ["rules/*", "answers/*"]))
    failing = {r.case_id for r in report.results if r.verdict != "pass"}
    assert failing == {k for k in KNOWN_REFPLAN_DISCREPANCIES if k.startswith(("rules/", "answers/"))}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("accept-all", {"rules/R0-a7-reshape": "accepted something that must be refused",
                        "layouts/row_even-2to4": "plan fails the oracle"}),
        ("wrong-class", {"rules/R24-a20-source-replicas-cut-differently": "wrong error class",
                         "answers/split-gap": "wrong error class"}),
        ("corrupt", {"layouts/bigcode-2to4": "plan fails the oracle"}),
        ("other-holder", {"replicas/holders-at-different-offsets-mixed": "wrong sources",
                          "layouts/row_even-2to4": ""}),
    ],
)
def test_cmd_planner_answering_wrongly_fails(cases: list[Case], mode: str, expected: dict[str, str]) -> None:
    report = run_conformance(f"cmd:{PY} {DATA / 'wrong_planner.py'} {mode}", select_cases(cases, list(expected)))
    got = {r.case_id: r.reason for r in report.results}
    assert sorted(got) == sorted(expected)
    for case_id, reason in expected.items():
        if reason:
            assert got[case_id].startswith(reason), (case_id, got[case_id])
        else:
            assert got[case_id] == ""  # answered rightly where it has no scripted answer to get wrong
    assert report.exit_code == 1


def test_cmd_planner_crashing_is_an_error(cases: list[Case]) -> None:
    report = run_conformance(f"cmd:{PY} {DATA / 'wrong_planner.py'} crash", select_cases(cases, "rules/R0-*"))
    assert [r.verdict for r in report.results] == ["error"]
    assert "exit 3" in report.results[0].reason and report.exit_code == 1
    assert report.summary_line().endswith("1 errors")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped by whoever adopted it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
def test_a_cmd_planner_that_runs_past_its_timeout_leaves_nothing_running(
    cases: list[Case], tmp_path: Path
) -> None:
    """The timed-out case's command is killed with everything it started. Before, only the shell
    was killed (dash forks the command): every timed-out case left its planner running, through
    the corpus and after the run."""
    import time

    pidfile = tmp_path / "pid"
    report = run_conformance(f"cmd:sleep 60 & echo $! > {pidfile}; wait", select_cases(cases, "rules/R0-*"),
                             timeout=1.0)
    assert [r.verdict for r in report.results] == ["error"]
    assert "ran past 1 s" in report.results[0].reason
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), f"the timed-out planner's child {pid} is still running"


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 1e12, 0.0, -1.0])
def test_a_cmd_planner_timeout_out_of_range_is_bad_input(
    timeout: float, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: nan, inf and 1e12 made every case an error of the planner ("adapter raised
    OverflowError"), 0 and -1 every case "ran past 0 s"; a verdict against the planner for our input."""
    with pytest.raises(ValueError, match=r"--timeout must be above 0 and at most .* \(365 days\)"):
        make_adapter("cmd:true", timeout=timeout)
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    code = run_conformance_cli(parser.parse_args(["--planner", "cmd:true", "--case", "rules/R0-*",
                                                  "--timeout", str(timeout)]))
    err = capsys.readouterr().err
    assert code == 2 and "--timeout must be above 0" in err and len(err.strip().splitlines()) == 1, err


def test_an_empty_case_directory_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "no case matches None"."""
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    code = run_conformance_cli(parser.parse_args(["--cases", str(tmp_path)]))
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"refplan conformance: {tmp_path}: holds no case (no *.json file)", err


class _Bare(Adapter):
    """A planner with no optional features that accepts everything as refplan plans it."""

    name = "bare"
    features = frozenset()

    def plan(self, case: Case) -> Outcome:
        return RefplanAdapter().plan(case)


def test_unsupported_cases_never_run_or_pass(cases: list[Case]) -> None:
    report = run_conformance(_Bare(), cases)
    by_id = {c.id: c for c in cases}
    for r in report.results:
        needs = by_id[r.case_id].features()
        if needs:
            assert r.verdict == "unsupported" and r.got == "unsupported", r
        else:
            assert r.verdict in ("pass", "fail")
    assert report.counts()["unsupported"] > 50


# ---------------------------------------------------------------------------------------------
# Judging, reports and the CLI.


def test_judge_names_each_kind_of_failure(cases: list[Case]) -> None:
    by_id = {c.id: c for c in cases}
    adapter = RefplanAdapter()
    refuse_case = by_id["rules/R17-a5-same-shard-addresses-source"]
    verdict, reason, _ = judge(refuse_case, Outcome("accept", plans={}), adapter)
    assert (verdict, reason.split(" (")[0]) == ("fail", "accepted something that must be refused")
    verdict, reason, _ = judge(refuse_case, Outcome("refuse", error="UnsupportedLayoutError"), adapter)
    assert verdict == "fail" and reason.startswith("wrong error class")
    verdict, reason, _ = judge(refuse_case, Outcome("refuse", error="InvalidMapError", message="nope"), adapter)
    assert verdict == "fail" and "message does not match" in reason  # refplan promises its wording
    accept_case = by_id["layouts/row_even-2to4"]
    verdict, reason, _ = judge(accept_case, Outcome("refuse", error="InvalidMapError", message="x"), adapter)
    assert verdict == "fail" and reason.startswith("refused something valid")
    good = adapter.plan(by_id["batches/balance-spans-two-parameters"])
    assert judge(by_id["batches/balance-spans-two-parameters"], good, adapter)[0] == "pass"
    lopsided = json.loads(json.dumps(good.plans))
    for plan in lopsided.values():
        for seg in plan["segments"]:
            seg["source"][0] = 0  # both replicas are identical, so this is still a correct plan
    balance = by_id["batches/balance-spans-two-parameters"]
    verdict, reason, _ = judge(balance, Outcome("accept", plans=lopsided), adapter)
    assert verdict == "quality" and "busiest sender" in reason  # correct but over the bound: quality, not fail


class _ContractAdapter(Adapter):
    """Accepts everything with one empty-ish plan per parameter, each outcome carrying the given
    contract pairs (as a peer adapter sets them)."""

    name = "contract-test"
    features = RefplanAdapter.features

    def __init__(self, contract: tuple[tuple[str, str], ...], plans: Any = None) -> None:
        self.contract = contract
        self.plans = plans

    def plan(self, case: Case) -> Outcome:
        plans = self.plans if self.plans is not None else {n: {"logical_shape": [1], "segments": []}
                                                           for n in case.parameters}
        return Outcome("accept", plans=plans, contract=self.contract)


def test_contract_verdict_counts_apart_and_exits_0(cases: list[Case], tmp_path: Path) -> None:
    """``contract``: what the peer's own contract allows and refplan's rules forbid. Its own count,
    "contract" in JSON, a passed JUnit case with a ``contract`` property, exit 0; it excuses only
    the kind it names, and never a wrong plan for a valid case."""
    by_id = {c.id: c for c in cases}
    refuse_case = by_id["rules/R26-a17-target-half"]
    excused = _ContractAdapter((("accept", "partial loads are the peer's contract (x.py:1)"),))
    report = run_conformance(excused, [refuse_case])
    result = report.results[0]
    assert result.verdict == "contract" and result.reason.startswith("partial loads are the peer's contract")
    assert "(refplan: accepted something that must be refused" in result.reason
    assert report.counts()["contract"] == 1 and report.exit_code == 0 and report.ok
    assert report.summary_line() == "0 passed, 0 failed, 0 unsupported, 1 contract"
    assert json.loads(json.dumps(report.to_dict()))["results"][0]["verdict"] == "contract"
    suite = ET.fromstring(report.junit_xml().split("?>", 1)[1]).find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and suite.get("skipped") == "0"
    case_el = suite.find("testcase")
    assert case_el is not None and case_el.find("failure") is None and case_el.find("skipped") is None
    prop = case_el.find("properties/property")
    assert prop is not None and prop.get("name") == "contract"
    # the wrong kind is not excused: a refusal contract does not cover an accepted invalid case
    other = run_conformance(_ContractAdapter((("refuse", "deliberate"),)), [refuse_case])
    assert other.results[0].verdict == "fail" and other.exit_code == 1
    # a wrong plan for a valid case is never excused, whatever the adapter says
    valid = by_id["layouts/row_even-2to4"]
    wrong = run_conformance(_ContractAdapter((("accept", "x"), ("refuse", "y"), ("quality", "z"))), [valid])
    assert wrong.results[0].verdict == "fail" and "oracle" in wrong.results[0].reason


def _flipped(case: Case) -> Case:
    """The same case with the opposite expectation, so a correct planner must fail it."""
    raw = json.loads(json.dumps(case.raw))
    raw["id"] = case.id + "-flipped"
    raw["expect"] = {"outcome": "accept"} if case.expect.outcome == "refuse" else {
        "outcome": "refuse", "error": "InvalidMapError"}
    return parse_case(raw, case.family, "flipped")


def test_report_table_json_junit(cases: list[Case], tmp_path: Path) -> None:
    flipped = _flipped(select_cases(cases, ["answers/splits-exceed-max-plan-bytes"])[0])
    report = run_conformance("refplan", [*select_cases(cases, ["rules/R1*"]), flipped])
    table = report.table()
    assert table.splitlines()[0].split()[:4] == ["case", "expected", "got", "verdict"]
    assert re.search(r"refplan: \d+ passed, 1 failed, 0 unsupported", table)
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["summary"] == report.summary_line() and len(doc["results"]) == len(report.results)
    root = ET.fromstring(report.junit_xml().split("?>", 1)[1])
    suite = root.find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    assert len(suite.findall("testcase")) == len(report.results)


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    return run_conformance_cli(parser.parse_args(list(argv)))


def test_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    junit = tmp_path / "out.xml"
    assert _cli("--case", "rules/R2-*", "--junit", str(junit)) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("refplan: 2 passed, 0 failed, 0 unsupported")
    assert ET.parse(junit).getroot().tag == "testsuites"
    assert _cli("--case", "answers/splits-exceed-max-plan-bytes", "--json") == 0
    assert json.loads(capsys.readouterr().out)["counts"]["pass"] == 1
    assert _cli("--planner", f"cmd:{PY} {DATA / 'wrong_planner.py'} accept-all", "--case", "rules/R2-*", "--json") == 1
    assert json.loads(capsys.readouterr().out)["counts"]["fail"] >= 1
    assert _cli("--case", "no-such-case") == 2
    assert "no case matches" in capsys.readouterr().err
    assert _cli("--planner", "nonsense") == 2
    err = capsys.readouterr().err
    assert "nonsense" in err and len(err.strip().splitlines()) == 1
    assert _cli("--cases", str(tmp_path / "missing.json")) == 2


def test_deepspeed_zero_scale_is_judged_by_its_own_contract(cases: list[Case], deepspeed: Adapter) -> None:
    """DeepSpeed's map constructor refuses a zero scale with a plain ``ValueError`` as the map is
    built; its error classes are ``plan_transfer``'s, which never sees such a map. That refusal was
    published as a failure ("wrong error class"); a maintainer would close it as intended, so it is
    a ``contract`` result, citing the constructor's file:line."""
    adapter = deepspeed
    case = next(c for c in cases if c.id == "rules/scale-zero-not-invertible")
    outcome = adapter.plan(case)
    assert (outcome.kind, outcome.error) == ("refuse", "ValueError")
    verdict, reason, _notes = judge(case, outcome, adapter)
    assert verdict == "contract" and "affine.py:77-78" in reason and "(refplan: wrong error class" in reason


def test_deepspeed_first_holder_is_judged_by_its_own_contract(cases: list[Case], deepspeed: Adapter) -> None:
    """Without a ``replica_selector`` DeepSpeed reads every region with several holders from the
    first (its documented default, which the batch RFC replaces). Seven such plans were published
    as ``quality`` results naming no cause; a maintainer would close them as intended. They are
    ``contract`` results citing the installed ``plan_transfer``'s own line, which must be the line
    that takes the first holder. Scripted answers (a selector is passed) get no such excuse."""
    adapter = deepspeed
    case = next(c for c in cases if c.id == "batches/balance-three-parameters")
    outcome = adapter.plan(case)
    assert outcome.kind == "accept"
    verdict, reason, _notes = judge(case, outcome, adapter)
    assert verdict == "contract", reason
    cited = re.search(r"(deepspeed/checkpoint/affine_transfer\.py):(\d+)", reason)
    assert cited and "(refplan: the busiest sender (0) moves 16 > 8" in reason
    import deepspeed.checkpoint.affine_transfer as transfer

    line = Path(transfer.__file__).read_text(encoding="utf-8").splitlines()[int(cited.group(2)) - 1]
    assert line.strip() == "source = holders[0]"
    scripted = next(c for c in cases if c.answers is not None and c.expect.outcome == "accept"
                    and "answers" in c.id and "split" not in c.id and not c.raw.get("endpoints"))
    assert adapter.plan(scripted).contract == ()


def test_the_first_holder_contract_needs_the_line_it_cites() -> None:
    """A DeepSpeed whose ``plan_transfer`` no longer takes ``holders[0]`` is judged again, not
    excused by a stale citation."""
    from types import SimpleNamespace

    from refplan.conformance.adapters import _first_holder_contract

    def plan_transfer(holders: list[int]) -> int:
        source = holders[-1]
        return source

    assert _first_holder_contract(SimpleNamespace(plan_transfer=plan_transfer)) is None
    assert _first_holder_contract(SimpleNamespace(plan_transfer=len)) is None  # no Python source


def test_every_peer_quality_or_fail_in_the_docs_names_a_cause() -> None:
    """docs/conformance.md says every peer ``fail``, ``quality`` and ``enhancement`` names its root
    cause: no peer section may list them case by case under a bare heading or as not yet explained."""
    text = DOCS.read_text(encoding="utf-8")
    assert "Every peer `fail`, `quality` and `enhancement` names its root cause" in " ".join(text.split())
    assert "not yet explained" not in text.lower()


def test_an_error_class_contract_never_excuses_refusing_a_valid_case(cases: list[Case]) -> None:
    """``class`` excuses only a refusal the case demands, under another class: refusing a valid
    case stays a failure whatever the adapter says."""
    adapter = RefplanAdapter()
    valid = next(c for c in cases if c.expect.outcome == "accept")
    refused = Outcome("refuse", error="ValueError", message="no", contract=(("class", "a contract"),))
    assert judge(valid, refused, adapter)[0] == "fail"
    must_refuse = next(c for c in cases if c.expect.outcome == "refuse" and c.expect.error == "InvalidMapError")
    assert judge(must_refuse, refused, adapter)[0] == "contract"
    assert judge(must_refuse, dataclasses.replace(refused, contract=()), adapter)[0] == "fail"
