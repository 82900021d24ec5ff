"""Maps passed the wrong way round, and batches passed to the one-parameter oracle, are named.

``verify_plan(source, target, plan)`` on a correct plan used to answer only "reads addresses
0..12 of source location 0, outside its 8 elements", and the user went to debug a planner that
was right. The oracle now judges a failing plan once more with the maps swapped and, when that
passes, says so in the reason (status and counterexample unchanged: the plan *is* wrong for the
maps as given). A passing plan is judged once. A ``{name: (target, source)}`` batch or a ``{name:
plan}`` batch given to ``verify_plan`` is a verdict (or, with no plan at all, a ``TypeError``)
naming ``verify_plans``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import refplan.oracle.judge as judge
from refplan import cli
from refplan.files import MapsBatch, dump_maps, dump_plans
from refplan.maps import AffinePiece, ParamAffineMap, contiguous_split_map, replicate, replicated_map
from refplan.planner import plan_transfer
from refplan.verify import verify_plan, verify_plans

SOURCE = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)  # TP=2 rows, DP=2: locations 0..3
TARGET = contiguous_split_map((8, 4), [1, 1, 1, 1], 1)  # TP=4 columns
NOTE = "this plan is exact for the maps the other way round (target and source swapped)"


def test_swapped_maps_are_named_and_the_verdict_stays_invalid() -> None:
    plan = plan_transfer(TARGET, SOURCE)
    right = verify_plan(TARGET, SOURCE, plan)
    assert right.ok and NOTE not in right.reason
    wrong = verify_plan(SOURCE, TARGET, plan, parameter="w")
    assert wrong.status == "invalid"  # never "ok" for the maps as given
    assert "outside its" in wrong.reason and NOTE in wrong.reason
    assert "verify_plan takes (target, source, plan)" in str(wrong)
    assert wrong.target_location is not None and wrong.segments  # the counterexample is kept
    # Dict forms (DeepSpeed's) are swapped the same way.
    assert NOTE in verify_plan(SOURCE.to_dict(), TARGET.to_dict(), plan.to_dict()).reason


def test_a_plan_wrong_both_ways_gets_no_note() -> None:
    plan = plan_transfer(TARGET, SOURCE)
    broken = plan.to_dict()
    broken["segments"] = broken["segments"][1:]  # a target element is never written, either way round
    for verdict in (verify_plan(TARGET, SOURCE, broken), verify_plan(SOURCE, TARGET, broken)):
        assert verdict.status == "invalid" and NOTE not in verdict.reason


def test_a_target_map_that_is_no_source_map_names_the_swap_in_map_error() -> None:
    """A target whose pieces overlap without being equal is a valid target and an invalid source:
    swapped, the verdict is ``invalid_map``, and the map error itself says the maps are swapped."""
    whole = AffinePiece((8,), 0, (1,), 0, (1,), [0, 1])
    halves = [AffinePiece((4,), 0, (1,), 0, (1,), [0, 1]), AffinePiece((4,), 4, (1,), 4, (1,), [0, 1])]
    target = ParamAffineMap((8,), {0: (8,), 1: (8,)}, {0: [whole], 1: halves})
    source = replicated_map((8,), 2)
    plan = plan_transfer(target, source)
    assert verify_plan(target, source, plan).ok
    verdict = verify_plan(source, target, plan)
    assert verdict.status == "invalid_map"
    assert verdict.map_error is not None and "overlap without being equal" in verdict.map_error
    assert NOTE in verdict.map_error and NOTE in str(verdict)


def test_only_failing_plans_are_judged_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = judge._judge

    def counting(*args: Any, **kwargs: Any) -> Any:
        verdict = real(*args, **kwargs)
        calls.append(verdict.ok)
        return verdict

    monkeypatch.setattr(judge, "_judge", counting)
    plan = plan_transfer(TARGET, SOURCE)
    assert verify_plan(TARGET, SOURCE, plan).ok
    assert calls == [True]
    calls.clear()
    assert not verify_plan(SOURCE, TARGET, plan).ok
    assert calls == [False, True]
    calls.clear()
    result = verify_plans({"a": (TARGET, SOURCE), "b": (SOURCE, TARGET)}, {"a": plan, "b": plan})
    # In a batch "a" passes the quick judgement (``judge._quick``: no ``_judge`` at all); "b" fails
    # it, so it is judged as given, then swapped.
    assert calls == [False, True]
    assert result.verdicts["a"].ok and NOTE in result.verdicts["b"].reason


def test_the_cli_names_swapped_maps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A maps file with "target" and "source" the wrong way round: exit 1, and the report says why."""
    plan = plan_transfer(TARGET, SOURCE)
    maps = tmp_path / "maps.json"
    plans = tmp_path / "plans.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch({"w": (SOURCE, TARGET)}))))
    plans.write_text(json.dumps(dump_plans({"w": plan})))
    assert cli.main(["verify", str(maps), str(plans)]) == 1
    assert NOTE in capsys.readouterr().out


def test_a_batch_given_to_verify_plan_names_verify_plans() -> None:
    plan = plan_transfer(TARGET, SOURCE)
    pairs = {"w": (TARGET, SOURCE)}
    as_map = verify_plan(pairs, SOURCE, plan)
    assert as_map.status == "invalid_map"
    assert as_map.map_error is not None and "use verify_plans(pairs, plans)" in as_map.map_error
    as_source = verify_plan(TARGET, {"w": (TARGET.to_dict(), SOURCE.to_dict())}, plan)
    assert as_source.status == "invalid_map" and "the source map is a batch" in str(as_source)
    as_plan = verify_plan(TARGET, SOURCE, {"w": plan})
    assert as_plan.status == "invalid" and "use verify_plans(pairs, plans)" in as_plan.reason
    with pytest.raises(TypeError, match=r"use verify_plans\(pairs, plans\)"):
        verify_plan(pairs, {"w": plan})
    with pytest.raises(TypeError, match="got no plan") as caught:
        verify_plan(TARGET, SOURCE)
    assert "verify_plans" not in str(caught.value)  # one map pair without a plan is not a batch
