"""Exact expectations for the oracle's batch-misuse messages, the swapped-maps note and the
per-segment judgement (issue 28 code), written to kill the mutants ``make mutation`` found alive in
``refplan/oracle/judge.py``: each assertion pins a text or a value a user or a caller reads."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from refplan import contiguous_split_map, replicate
from refplan.oracle.judge import segment_errors
from refplan.planner import plan_transfer
from refplan.verify import verify_plan

TARGET = contiguous_split_map((8, 4), [2] * 4, 0)
SOURCE = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
PLAN = plan_transfer(TARGET, SOURCE)
HINT = "; for a batch {name: (target, source)} and {name: plan} use verify_plans(pairs, plans)"
NO_PLAN = "verify_plan(target_map, source_map, plan) judges one parameter and got no plan"


def _no_plan(*args: Any) -> str:
    with pytest.raises(TypeError) as info:
        verify_plan(*args)
    return str(info.value)


def test_the_missing_plan_message_names_verify_plans_only_for_a_batch() -> None:
    pairs = {"w": (TARGET, SOURCE)}
    assert _no_plan(pairs, {"w": PLAN}) == NO_PLAN + HINT
    assert _no_plan(pairs, {}) == NO_PLAN + HINT           # the pairs alone say it is a batch
    assert _no_plan(TARGET, {"w": PLAN}) == NO_PLAN + HINT  # the plans alone say it too
    assert _no_plan(TARGET, SOURCE) == NO_PLAN              # no batch anywhere: no hint, nothing else


def test_batch_verdicts_say_exactly_what_was_passed() -> None:
    pairs = {"w": (TARGET, SOURCE)}
    as_target = verify_plan(pairs, SOURCE, PLAN, parameter="w")  # type: ignore[arg-type]
    assert as_target.status == "invalid_map" and as_target.map_error == (
        "InvalidMapError: the target map is a batch {name: (target, source)} of 1 parameter(s), not one map; "
        "use verify_plans(pairs, plans) for a batch"
    )
    as_plan = verify_plan(TARGET, SOURCE, {"w": PLAN}, parameter="w")  # type: ignore[arg-type]
    assert as_plan.status == "invalid" and as_plan.parameter == "w"
    assert as_plan.reason == (
        "malformed plan: the plan is a batch {name: plan} of 1 plan(s), not one plan; use verify_plans(pairs, plans)"
    )
    dict_plan = verify_plan(TARGET, SOURCE, {"w": PLAN.to_dict()})  # type: ignore[arg-type]
    assert dict_plan.reason == as_plan.reason


@pytest.mark.parametrize("odd", [
    {"w": [TARGET, SOURCE, SOURCE]},   # three maps are not a (target, source) pair
    {"w": ("ab", "cd")},                # a pair of strings is not a pair of maps
], ids=["three-maps", "two-strings"])
def test_what_is_not_a_batch_of_pairs_gets_no_batch_hint(odd: Any) -> None:
    verdict = verify_plan(odd, SOURCE, PLAN)
    assert verdict.status == "invalid_map" and "verify_plans" not in str(verdict)


def test_a_dict_of_non_plans_gets_no_batch_hint() -> None:
    verdict = verify_plan(TARGET, SOURCE, {"w": {"x": 1}})  # type: ignore[arg-type]
    assert verdict.status == "invalid" and "verify_plans" not in verdict.reason


def test_the_swapped_note_leaves_the_map_error_empty_for_a_wrong_plan() -> None:
    swapped = verify_plan(SOURCE, TARGET, PLAN)
    assert swapped.status == "invalid" and "other way round" in swapped.reason
    assert swapped.map_error is None


def test_segment_errors_counts_what_it_judged() -> None:
    broken = dataclasses.replace(PLAN.segments[1], source_offset=PLAN.segments[1].source_offset + 1)
    plan = dataclasses.replace(PLAN, segments=(PLAN.segments[0], broken, *PLAN.segments[2:]))
    found, judged = segment_errors(TARGET, SOURCE, plan, limit=5, scan=100)
    assert judged == len(plan.segments) and [k for k, _ in found] == [1]
    assert segment_errors(TARGET, SOURCE, plan, limit=5, scan=0) == ([], 0)
    assert segment_errors(TARGET, SOURCE, plan, limit=1, scan=100)[1] == 2  # stops at the limit
    assert segment_errors({"logical_shape": "x"}, SOURCE, plan, limit=5, scan=100) == ([], 0)
