"""The ``enhancement`` verdict: a peer's load result that its own documented design makes.

Until 2026-12-06 the Awex result and Megatron-Core 0.19.2's per-rank choice, both labelled "by
design: an enhancement" in their findings, were counted as ``quality`` beside the defects, so a
peer's count of findings overstated what its maintainer would take as bugs. These tests drive the
runner with a stand-in peer (refplan's own planner with its first-holder policy, which loads one
sender) and failed before the verdict existed.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from refplan.conformance.adapters import RefplanAdapter
from refplan.conformance.base import Adapter, Outcome
from refplan.conformance.corpus import Case, load_cases
from refplan.conformance.peers import findings
from refplan.conformance.runner import Report, run_conformance, write_markdown

CASE = "peers/finding-megatron-pure-dp-reads-one-rank"  # 512 from one sender where the bound is 128


class _FirstHolder(Adapter):
    """A stand-in peer: every region from its first holder. ``by_design`` and ``cause`` as a
    built-in peer adapter answers them, from a findings list of its own."""

    name = "stand-in 1.0"
    features = RefplanAdapter.features  # endpoints too

    def __init__(self, designed: bool) -> None:
        self.designed = designed

    def plan(self, case: Case) -> Outcome:
        from refplan.formats import parse_maps
        from refplan.planner import plan_transfers
        from refplan.policies import first_holder

        batch = parse_maps(case.maps_doc())
        plans = plan_transfers(batch.pairs, endpoints=batch.endpoints, element_size=batch.element_size,
                               replica_policy=first_holder, process_node=batch.process_node)
        return Outcome("accept", plans={n: p.to_dict() for n, p in plans.items()})

    def by_design(self, case_id: str) -> bool:
        return self.designed and case_id == CASE

    def cause(self, case_id: str, verdict: str) -> str:
        return f"first holder always (stand-in/policy.py:1; reached by any replica), asked as {verdict}"


@pytest.fixture(scope="module")
def case() -> Case:
    return next(c for c in load_cases() if c.id == CASE)


def _report(case: Case, designed: bool) -> Report:
    return run_conformance(_FirstHolder(designed), [case])


def test_a_documented_design_is_an_enhancement_counted_apart(case: Case) -> None:
    report = _report(case, designed=True)
    (result,) = report.results
    assert result.verdict == "enhancement", result
    assert "asked as enhancement" in result.reason and "moves 512 > 128" in result.reason, result.reason
    assert result.load_ratio is not None and result.load_ratio > 1  # judged for load like any correct plan
    counts = report.counts()
    assert counts["enhancement"] == 1 and counts["quality"] == 0, counts
    assert "1 enhancement" in report.summary_line() and "quality" not in report.summary_line()
    assert "1 over the case's bound (1 by the peer's documented design)" in report.quality_line()
    assert report.exit_code == 0


def test_without_the_design_it_stays_quality(case: Case) -> None:
    report = _report(case, designed=False)
    assert [r.verdict for r in report.results] == ["quality"]
    assert "enhancement" not in report.counts()  # listed only when a case has it
    assert "1 over the case's bound" in report.quality_line() and "design" not in report.quality_line()


def test_a_wrong_plan_is_never_excused_as_design(case: Case) -> None:
    class _Broken(_FirstHolder):
        def plan(self, case: Case) -> Outcome:
            outcome = super().plan(case)
            plans: Any = outcome.plans
            plans["param"]["segments"][0]["shape"][0] -= 1  # one row of one target never written
            return outcome

    (result,) = run_conformance(_Broken(True), [case]).results
    assert result.verdict == "fail", result


def test_junit_marks_it_and_fail_on_quality_leaves_it(case: Case) -> None:
    designed, plain = _report(case, designed=True), _report(case, designed=False)
    for fail_on_quality in (False, True):
        suite = ET.fromstring(designed.junit_xml(fail_on_quality=fail_on_quality)).find("testsuite")
        assert suite is not None and suite.get("failures") == "0"
        testcase = suite.find("testcase")
        assert testcase is not None and testcase.find("failure") is None
        prop = testcase.find("properties/property")
        assert prop is not None and prop.get("name") == "enhancement" and "moves 512" in (prop.get("value") or "")
    suite = ET.fromstring(plain.junit_xml(fail_on_quality=True)).find("testsuite")
    assert suite is not None and suite.get("failures") == "1"  # a quality result still fails under the flag


def test_cli_fail_on_quality_exits_0_on_an_enhancement_only(case: Case, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from refplan.conformance import runner

    for designed, code in ((True, 0), (False, 1)):
        monkeypatch.setattr(runner, "make_adapter", lambda spec, designed=designed, **_: _FirstHolder(designed))
        monkeypatch.setattr(runner, "load_cases", lambda *a, **k: [case])
        got = runner.main(["--planner", "stand-in", "--fail-on-quality", "--json"])
        assert got == code, (designed, got)


def test_markdown_groups_it_under_its_finding(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finding = findings.Finding(
        peer="stand-in", verdict="enhancement", title="The stand-in reads every region from its first holder",
        version="stand-in 1.0", cause="stand-in/policy.py:1", configuration="any replica", why="By design.",
        witnesses=(CASE,), script="")
    monkeypatch.setattr(findings, "FINDINGS", (finding,))
    reference = run_conformance(_FirstHolder(False), [case])
    text = write_markdown(tmp_path / "c.md", reference, None, corpus_size=1, others=[_report(case, designed=True)])
    assert "#### The stand-in reads every region from its first holder (enhancement, 1 cases)" in text
    assert "0 quality, 1 enhancement, 0 errors" in text


def test_the_published_enhancements_are_the_by_design_findings() -> None:
    """Every finding labelled "by design" is an ``enhancement``, and no case is witness of both a
    peer's defect and its design (the runner could not tell which to report)."""
    for f in findings.FINDINGS:
        assert ("by design" in f.title) == (f.verdict == "enhancement"), f.title
    for f in findings.FINDINGS:
        for g in findings.FINDINGS:
            if f is not g and f.peer == g.peer and {f.verdict, g.verdict} == {"quality", "enhancement"}:
                assert not set(f.witnesses) & set(g.witnesses), (f.title, g.title)


def test_judge_gives_the_same_verdict_as_the_runner(case: Case) -> None:
    """``judge`` (public) and the runner agree: an enhancement is decided in the judge, not after it."""
    from refplan.conformance.runner import judge

    adapter = _FirstHolder(True)
    assert judge(case, adapter.plan(case), adapter)[0] == "enhancement"
    assert judge(case, adapter.plan(case), _FirstHolder(False))[0] == "quality"


def test_an_enhancement_is_granted_only_to_the_release_whose_design_was_read() -> None:
    """A finding cites one release's code: another release that loads the same case so is judged
    afresh (``quality``), never excused by a citation of code it may no longer have."""
    from refplan.conformance.peers.common import PeerAdapter

    class _Named(PeerAdapter):
        def __init__(self, name: str) -> None:
            self.name = name

    awex = next(f for f in findings.FINDINGS if f.peer == "awex" and f.verdict == "enhancement")
    witness = awex.witnesses[0]
    assert _Named(awex.version).by_design(witness)
    assert not _Named("awex 0.9.1").by_design(witness)
    assert not _Named(awex.version).by_design("layouts/row_even-2to4")


def test_the_quality_line_counts_a_case_whose_lower_bound_is_zero() -> None:
    """Every target local (lower bound 0): no ratio to print, but a plan that sends anyway is over
    the case's bound, and the quality line says so instead of "no accepted plan"."""
    local = next(c for c in load_cases() if c.id == "peers/finding-megatron016-collocated-reads-replica-0")
    report = run_conformance(_FirstHolder(False), [local])
    (result,) = report.results
    assert result.verdict == "quality" and result.load_ratio is None, result
    expected = "quality: no lower bound above 0; 1 over the case's bound"
    assert report.quality_line() == expected


def test_awex_design_is_checked_on_its_answer() -> None:
    """Awex's documented choice (inference replica i from training replica i mod T) is checked on
    the operations it returns: an answer that reads one parameter from another replica is no longer
    the design's, and its load stays ``quality``; another release is never checked."""
    import dataclasses

    from refplan.conformance.adapters import make_adapter

    try:
        adapter: Any = make_adapter("awex")
    except ValueError as exc:
        pytest.skip(f"awex is not installed (make peers): {exc}")
    witness = next(c for c in load_cases() if c.id == "peers/finding-awex-one-inference-replica")
    problem = adapter.translate(witness)
    ops = adapter.call_peer(problem)
    assert "transfer_plan.py:320-323" in adapter.design(problem, ops)
    moved = [dataclasses.replace(ops[0], send_rank=problem["infer_world"] + 1), *ops[1:]]  # training replica 1
    assert ops[0].send_rank != moved[0].send_rank and adapter.design(problem, moved) == ""
    outcome = adapter.plan(witness)
    assert outcome.design and run_conformance(adapter, [witness]).results[0].verdict == "enhancement"
    adapter.name = "awex 0.9.1"
    try:
        assert adapter.design(problem, ops) == ""
    finally:
        adapter.name = "awex 0.9.0"


def test_a_checked_design_makes_a_drawn_case_an_enhancement(case: Case) -> None:
    """``Outcome.design`` (the answer checked against the peer's rule) decides on any input, a drawn
    one included, with the rule as the reason; it never excuses a wrong plan."""
    from refplan.conformance.runner import judge

    plain = _FirstHolder(False)
    outcome = plain.plan(case)
    designed = Outcome("accept", plans=outcome.plans, design="the first holder always (stand-in.py:1)")
    verdict, reason, _ = judge(case, designed, plain)
    assert verdict == "enhancement" and "by design: the first holder always (stand-in.py:1)" in reason
    plans: Any = outcome.plans
    plans["param"]["segments"][0]["shape"][0] -= 1
    assert judge(case, Outcome("accept", plans=plans, design="any"), plain)[0] == "fail"
