"""``refplan.testing``: assertions that carry the verdict, and repros that ``refplan verify`` replays.

Every repro test runs the replay for real: the files the helper wrote go through
``refplan.cli.main(["verify", maps, plans])``, which must exit 1 and print the same counterexample
the assertion carried.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from refplan import cli
from refplan import strategies as rst
from refplan.maps import ParamAffineMap, contiguous_split_map, replicate
from refplan.planner import plan_transfer
from refplan.testing import REPRO_ENV, assert_plan_valid, assert_plans_valid
from refplan.verify import verify_plan, verify_plans

SOURCE = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
TARGET = contiguous_split_map((8, 4), [1, 1, 1, 1], 1)


@pytest.fixture(autouse=True)
def no_env_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI variable of whoever runs these tests must not leak into them."""
    monkeypatch.delenv(REPRO_ENV, raising=False)


def broken_plan() -> dict[str, Any]:
    """A DeepSpeed plan dict whose first segment reads the wrong rows (from the other TP shard)."""
    plan = plan_transfer(TARGET, SOURCE).to_dict()
    first = plan["segments"][0]
    first["source"] = [1 if first["source"][0] == 0 else 0, *first["source"][1:]]
    return plan


def repro_files(message: str) -> tuple[str, str]:
    """The maps and plans paths the failure message's replay command names."""
    found = re.search(r"^replay: refplan verify (\S+) (\S+)$", message, re.MULTILINE)
    assert found is not None, message
    return found.group(1), found.group(2)


def replay(maps: str, plans: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["verify", maps, plans])
    return code, capsys.readouterr().out


def test_a_valid_plan_passes_and_writes_nothing(tmp_path: Path) -> None:
    assert_plan_valid(TARGET, SOURCE, plan_transfer(TARGET, SOURCE), repro_dir=tmp_path)
    assert_plans_valid({"w": (TARGET, SOURCE)}, {"w": plan_transfer(TARGET, SOURCE)}, repro_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_message_is_the_full_verdict_and_nothing_is_written_without_a_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    verdict = verify_plan(TARGET, SOURCE, broken_plan(), parameter="param")
    assert verdict.status == "invalid"
    with pytest.raises(AssertionError) as caught:
        assert_plan_valid(TARGET, SOURCE, broken_plan())
    assert str(verdict) in str(caught.value)
    assert "replay" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_the_repro_replays_the_same_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verdict = verify_plan(TARGET, SOURCE, broken_plan(), parameter="w")
    with pytest.raises(AssertionError) as caught:
        assert_plan_valid(TARGET.to_dict(), SOURCE, broken_plan(), parameter="w", repro_dir=tmp_path / "ci")
    message = str(caught.value)
    maps, plans = repro_files(message)
    assert Path(maps).name == "maps.json" and Path(plans).name == "plans.json"
    assert Path(maps).parent.parent == tmp_path / "ci" and f"repro: {maps} and {plans}" in message
    assert json.loads(Path(maps).read_text())["format"] == "refplan.maps/1"
    assert json.loads(Path(plans).read_text())["format"] == "refplan.plans/1"
    assert "differs" not in message and "not in the replay" not in message
    code, out = replay(maps, plans, capsys)
    assert code == 1
    assert str(verdict) in out  # the same counterexample: location, offset, logical coordinate, segment


def test_the_environment_variable_names_the_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(REPRO_ENV, str(tmp_path))
    with pytest.raises(AssertionError) as caught:
        assert_plan_valid(TARGET, SOURCE, broken_plan())
    maps, plans = repro_files(str(caught.value))
    assert Path(maps).parent.parent == tmp_path
    assert replay(maps, plans, capsys)[0] == 1


def test_each_failure_gets_its_own_folder_and_a_rerun_the_same(tmp_path: Path) -> None:
    def folder(plan: Any) -> Path:
        with pytest.raises(AssertionError) as caught:
            assert_plan_valid(TARGET, SOURCE, plan, repro_dir=tmp_path)
        return Path(repro_files(str(caught.value))[0]).parent

    first = folder(broken_plan())
    other = broken_plan()
    other["segments"] = other["segments"][1:]
    assert folder(other) != first
    assert folder(broken_plan()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, folder(other).name])


@pytest.mark.parametrize("form", ["segment dicts", "plan dict without logical_shape", "TransferPlan"])
def test_every_plan_form_is_written(form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan: Any = broken_plan()
    if form == "segment dicts":
        plan = plan["segments"]
    elif form == "plan dict without logical_shape":
        del plan["logical_shape"]
    else:
        from refplan.plan import TransferPlan

        plan = TransferPlan.from_dict(plan)
    verdict = verify_plan(TARGET, SOURCE, plan, parameter="param")
    with pytest.raises(AssertionError) as caught:
        assert_plan_valid(TARGET, SOURCE, plan, repro_dir=tmp_path)
    code, out = replay(*repro_files(str(caught.value)), capsys)
    assert code == 1 and str(verdict) in out


def test_a_malformed_plan_is_kept_raw_and_the_message_says_so(tmp_path: Path) -> None:
    plan = broken_plan()
    plan["segments"][0]["shape"] = "4x1"
    with pytest.raises(AssertionError) as caught:
        assert_plan_valid(TARGET, SOURCE, plan, repro_dir=tmp_path)
    message = str(caught.value)
    assert "malformed plan" in message
    assert "the plan of 'param' is not a refplan.plans/1 entry" in message
    _, plans = repro_files(message)
    raw = Path(plans).parent / "plans.raw.json"
    assert str(raw) in message
    assert json.loads(raw.read_text())["param"]["segments"][0]["shape"] == "4x1"
    assert json.loads(Path(plans).read_text())["parameters"] == {}
    # The replay of what could be written is not this verdict, and the message does not hide it.
    assert "note: the replay's verdict differs" in message and "no plan does" in message


def test_a_malformed_map_is_kept_raw(tmp_path: Path) -> None:
    bad = TARGET.to_dict()
    bad["logical_shape"] = [8, "4"]
    with pytest.raises(AssertionError) as caught:
        assert_plan_valid(bad, SOURCE, broken_plan(), repro_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith("refplan: the plan is not valid\ninvalid_map")
    assert "the maps of 'param' are not a refplan.maps/1 entry" in message
    raw = Path(repro_files(message)[0]).parent / "maps.raw.json"
    assert json.loads(raw.read_text())["param"]["target"]["logical_shape"] == [8, "4"]


def test_an_unwritable_dir_still_raises_the_verdict(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(AssertionError) as caught:
        assert_plan_valid(TARGET, SOURCE, broken_plan(), repro_dir=blocker)
    assert "repro: could not be written under" in str(caught.value)
    assert str(verify_plan(TARGET, SOURCE, broken_plan(), parameter="param")) in str(caught.value)


def test_a_batch_repro_replays_the_batch_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = contiguous_split_map((6,), [3, 3], 0)
    pairs: dict[str, tuple[Any, Any]] = {"w": (TARGET, SOURCE), "b": (other, other), "missing": (other, other)}
    plans: dict[str, Any] = {"w": broken_plan(), "b": plan_transfer(other, other).segments,
                             "extra": {"logical_shape": [6], "segments": []}}
    result = verify_plans(pairs, plans)
    assert result.counts() == {"ok": 1, "unverifiable": 0, "invalid": 3, "invalid_map": 0}
    with pytest.raises(AssertionError) as caught:
        assert_plans_valid(pairs, plans, repro_dir=tmp_path)
    message = str(caught.value)
    assert str(result) in message and "differs" not in message
    code, out = replay(*repro_files(message), capsys)
    assert code == 1
    for verdict in result.verdicts.values():  # the command reports every parameter that is not ok
        assert verdict.ok or str(verdict) in out, verdict


def test_with_hypothesis_the_reported_failure_names_its_repro(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's pattern: a planner that drops a segment, caught under ``@given``; the message
    hypothesis re-raises names a repro that replays to exit 1."""

    def my_planner(target: ParamAffineMap, source: ParamAffineMap) -> list[dict[str, Any]]:
        return [s.to_dict() for s in plan_transfer(target, source).segments][1:]

    @settings(max_examples=20, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(rst.map_pairs(max_holders=2))
    def check(pair: tuple[ParamAffineMap, ParamAffineMap]) -> None:
        target, source = pair
        assert_plan_valid(target, source, my_planner(target, source), repro_dir=tmp_path)

    with pytest.raises(AssertionError) as caught:
        check()
    maps, plans = repro_files(str(caught.value))
    code, out = replay(maps, plans, capsys)
    assert code == 1 and "is never written" in out


def test_the_helper_needs_neither_torch_nor_hypothesis() -> None:
    """``refplan.testing`` is for any project's suite: importing it loads only refplan's core."""
    import subprocess
    import sys

    code = "import sys, refplan.testing; print(sorted({'torch', 'hypothesis'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_a_replay_refplan_verify_refuses_for_size_is_said_to_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Above 2**62 elements the oracle says ``unverifiable`` while ``refplan verify`` refuses the
    maps file (exit 2): the message promised a replay of the same verdict without a note."""
    n0, n1 = 2**31, 2**32
    big = ParamAffineMap.from_dict({"logical_shape": [n0, n1], "ranks": {"0": {"shard_shape": [n0, n1], "pieces": [
        {"shape": [n0, n1], "source": [0, [n1, 1]], "dest": [0, [n1, 1]], "locations": [0]}]}}})
    plan = {"logical_shape": [n0, n1],
            "segments": [{"shape": [n0, n1], "source": [0, 0, [n1, 1]], "target": [0, 0, [n1, 1]]}]}
    with pytest.raises(AssertionError) as failed:
        assert_plan_valid(big, big, plan, repro_dir=tmp_path)
    message = str(failed.value)
    assert "unverifiable" in message
    assert "note: the replay's verdict differs: refplan verify refuses these maps" in message, message
    replay = next(line for line in message.splitlines() if line.startswith("replay: refplan verify "))
    maps_path, plans_path = replay.split()[-2:]
    assert cli.main(["verify", maps_path, plans_path]) == 2
    capsys.readouterr()
