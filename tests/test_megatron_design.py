"""Megatron-Core's answers checked against each release's documented choice of source replica.

``MegatronAdapter.design`` re-derives, from the docstrings alone, which source replica a destination
rank reads a parameter from (0.16.1: the first entry of DP bucket ``dst_rank % buckets``; 0.19.2: a
local copy first, else DP group ``dst_rank % groups`` and entry ``(dst_rank // groups) % entries``,
cycling even with one DP group). A load over the case's bound whose every read follows that rule is
an ``enhancement`` on any input, ``--explore``'s drawn cases included; 0.19.2's one-DP-group fast
path, which reads the first entry against its docstring, stays ``quality`` and is named
(``MegatronAdapter.defect``) where no finding lists the case. Each test fails if the check calls
every answer designed (a doctored answer must not be), or none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from refplan.conformance import load_cases
from refplan.conformance.adapters import Adapter, make_adapter
from refplan.conformance.corpus import Case
from refplan.conformance.peers.findings import FINDINGS
from refplan.conformance.runner import _run_case

PURE_DP = "peers/finding-megatron-pure-dp-reads-one-rank"
DESIGNED_019 = "batches/balance-by-bytes"
DESIGNED_016 = "peers/finding-megatron016-collocated-reads-replica-0"


def _adapter(spec: str) -> Any:
    try:
        return make_adapter(spec)
    except ValueError as exc:
        pytest.skip(f"peer {spec} is not installed (make peers): {exc}")


def _case(case_id: str) -> Case:
    (case,) = [c for c in load_cases() if c.id == case_id]
    return case


def _answer(adapter: Any, case_id: str) -> tuple[dict[str, Any], list[Any]]:
    problem = adapter.translate(_case(case_id))
    return problem, adapter.call_peer(problem)


def _moved(problem: dict[str, Any], output: list[Any]) -> list[Any]:
    """``output`` with its first remote read moved to another replica's holder of the same
    parameter: a choice no documented rule makes for that one destination rank alone."""
    name, dst_rank, dst, ops = output[0]
    src_rank, src_slice, dst_slice = ops[0]
    others = [m.owner_rank for m in problem["src_lists"][name]
              if m.owner_rank not in (src_rank, dst_rank)
              and src_rank not in (m.tensor_parallel_group_ranks or ())]
    assert others, "the case has no other replica to move a read to"
    moved = [(others[0], src_slice, dst_slice), *ops[1:]]
    return [(name, dst_rank, dst, moved), *output[1:]]


@pytest.mark.parametrize(("spec", "case_id", "where"), [
    ("megatron", DESIGNED_019, "utils.py:498-507"),
    ("megatron-0.16", DESIGNED_016, "utils.py:322-333"),
])
def test_an_answer_that_follows_the_documented_rule_is_its_design(spec: str, case_id: str, where: str) -> None:
    adapter = _adapter(spec)
    problem, output = _answer(adapter, case_id)
    assert where in adapter.design(problem, output)
    assert adapter.design(problem, _moved(problem, output)) == ""
    result = _run_case(dataclasses.replace(_case(case_id), id="explore/drawn"), adapter)
    assert result.verdict == "enhancement" and "by design: " in result.reason and where in result.reason


def test_the_fast_path_against_the_docstring_stays_quality_and_is_named_on_a_drawn_case() -> None:
    adapter = _adapter("megatron")
    problem, output = _answer(adapter, PURE_DP)
    assert adapter.design(problem, output) == ""
    (finding,) = [f for f in FINDINGS if f.version == "megatron-core 0.19.2" and f.verdict == "quality"]
    assert adapter.defect(problem, output) == finding.note()
    # a drawn case is no finding's witness: its cause comes from the answer, not from a case id
    drawn = _run_case(dataclasses.replace(_case(PURE_DP), id="explore/drawn"), adapter)
    assert drawn.verdict == "quality" and "utils.py:514-516" in drawn.reason
    assert "not yet explained" not in drawn.reason


def test_an_answer_neither_rule_explains_stays_unexplained() -> None:
    adapter: Adapter = _adapter("megatron")
    problem, output = _answer(adapter, PURE_DP)
    assert adapter.defect(problem, _moved(problem, output)) == ""  # type: ignore[attr-defined]


def test_another_release_is_not_judged_by_a_rule_read_in_this_one() -> None:
    adapter = _adapter("megatron")
    problem, output = _answer(adapter, DESIGNED_019)
    adapter.name = "megatron-core 0.19.3"
    assert adapter.design(problem, output) == "" and adapter.defect(problem, output) == ""


def test_the_019_enhancement_cites_the_path_each_witness_runs() -> None:
    """0.19.2's ``_round_robin_dp`` has two paths: several DP groups (utils.py:521-529) and one, the
    fast path (514-516). The enhancement's cause once cited 521-529 for all five witnesses, though
    four have one DP group and run the fast path (a maintainer-style review, 2026-12-07). Each
    witness's DP groups, as the adapter hands them to the peer, decide which lines the cause must cite:
    a witness of several groups by its id, the one-group ones through 514-516 (with the cycle's
    agreement on their destination rank, which is what makes them designed, not the defect)."""
    adapter = _adapter("megatron")
    (finding,) = [f for f in FINDINGS if f.peer == "megatron-core 0.19" and f.verdict == "enhancement"]
    one_group = []
    for case_id in finding.witnesses:
        problem = adapter.translate(_case(case_id))
        groups = {tuple(m.data_parallel_group_ranks) for name in problem["names"]
                  for m in problem["meta"]["source"][name].values()}
        if len(groups) == 1:
            (entries,) = groups
            one_group.append(case_id)
            for dst_rank, _ in problem["dst_by_rank"]:
                assert entries[(dst_rank // 1) % len(entries)] == entries[0], (case_id, dst_rank, entries)
        else:
            assert case_id in finding.cause and "521-529" in finding.cause, case_id
    assert one_group and "514-516" in finding.cause
