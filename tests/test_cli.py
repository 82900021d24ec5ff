"""The ``refplan`` command: plan files in and out, exit codes, one-line errors, the demo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from refplan import TransferEndpoints, contiguous_split_map, replicate
from refplan.cli import main
from refplan.files import MapsBatch, dump_maps, parse_plans


def _maps_file(tmp_path: Path, *, endpoints: bool = False) -> Path:
    source = replicate(contiguous_split_map((8, 8), [4, 4], 0), 2)
    target = contiguous_split_map((8, 8), [2, 2, 2, 2], 1)
    ep = TransferEndpoints({i: i for i in range(4)}, {i: 4 + i for i in range(4)}) if endpoints else None
    batch = MapsBatch({"w": (target, source), "v": (target, source)}, ep, None, {"w": 2, "v": 4})
    path = tmp_path / "maps.json"
    path.write_text(json.dumps(dump_maps(batch)))
    return path


def test_plan_writes_a_plans_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps = _maps_file(tmp_path, endpoints=True)
    out = tmp_path / "plans.json"
    assert main(["plan", str(maps), "-o", str(out), "--policy", "first_holder"]) == 0
    plans = parse_plans(json.loads(out.read_text()))
    assert sorted(plans) == ["v", "w"]
    assert all(len(p.segments) == 8 for p in plans.values())
    assert {s.source_rank for s in plans["w"].segments} == {0, 1}
    assert "2 parameter(s), 16 segments" in capsys.readouterr().err
    assert main(["plan", str(maps), "-o", str(out)]) == 0  # balanced uses the replicas too
    plans = parse_plans(json.loads(out.read_text()))
    assert {s.source_rank for p in plans.values() for s in p.segments} == {0, 1, 2, 3}


def test_plan_to_stdout_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps = _maps_file(tmp_path)
    main(["plan", str(maps)])
    first = capsys.readouterr().out
    main(["plan", str(maps)])
    assert capsys.readouterr().out == first
    assert json.loads(first)["format"] == "refplan.plans/1"


def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "InvalidMapError" in err and "Traceback" not in err
    assert main(["plan", str(tmp_path / "missing.json")]) == 2
    doc = json.loads(_maps_file(tmp_path).read_text())
    doc["parameters"]["w"]["source"]["ranks"]["0"]["pieces"][0]["source"][1] = [1, 8]
    bad.write_text(json.dumps(doc))
    assert main(["plan", str(bad)]) == 2
    assert "UnsupportedLayoutError" in capsys.readouterr().err


def test_console_script_demo_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "refplan.cli", "demo"], capture_output=True, text=True, check=True)
    assert "policy first_holder" in proc.stdout and "policy balanced" in proc.stdout
    assert "busiest sender / even share = 1.00x" in proc.stdout


def test_input_errors_name_the_file_and_the_json_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(_maps_file(tmp_path).read_text())
    doc["parameters"]["w"]["source"]["ranks"]["0"]["pieces"][0]["shape"] = [4, "8"]
    bad = tmp_path / "broken.json"
    bad.write_text(json.dumps(doc))
    good = _maps_file(tmp_path)
    plans = tmp_path / "plans.json"
    assert main(["plan", str(good), "-o", str(plans)]) == 0
    capsys.readouterr()
    for argv in (["plan", str(bad)], ["verify", str(bad), str(plans)], ["verify", str(good), str(bad)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(bad) in err, err
    main(["plan", str(bad)])
    assert '$.parameters.w.source.ranks["0"].pieces[0].shape: ' in capsys.readouterr().err


def test_plan_min_split_bytes_reaches_the_split_policy(tmp_path: Path) -> None:
    """``--min-split-bytes`` was given to the planner's check but not to ``split_balanced``, built
    with its default 8 MiB floor: a larger floor refused the policy's own splits (exit 2, "below
    min_split_bytes") and a smaller one changed nothing. One 4096x4096 bf16 parameter (32 MiB), two
    holders, three receivers: the default splits it in parts of about 16 MiB."""
    n = 4096
    source = replicate(contiguous_split_map((n, n), [n], 0), 2)
    target = replicate(contiguous_split_map((n, n), [n], 0), 3)
    endpoints = TransferEndpoints(source={0: 0, 1: 1}, target={0: 2, 1: 3, 2: 4})
    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch({"w": (target, source)}, endpoints, None, {"w": 2}))))

    def parts(floor: int) -> list[int]:
        out = tmp_path / f"plans-{floor}.json"
        assert main(["plan", str(maps), "--policy", "split_balanced", "--min-split-bytes", str(floor),
                     "-o", str(out), "-q"]) == 0
        plan = parse_plans(json.loads(out.read_text()))["w"]
        assert main(["verify", str(maps), str(out), "-q"]) == 0
        return sorted(2 * s.numel for s in plan.segments)

    assert min(parts(16 << 20)) >= 16 << 20  # refused before: "part 0 of a split is 16400384 bytes, below ..."
    assert all(p >= 32 << 20 for p in parts(17 << 20))  # above half the parameter: no split at all


@pytest.mark.parametrize(("drop", "verdict", "code"), [(0, "ok", 0), (1, "invalid", 1)])
def test_verify_keeps_its_verdict_s_code_when_the_reader_goes_away(tmp_path: Path, drop: int, verdict: str,
                                                                   code: int) -> None:
    """``refplan verify ... | head``: the reader closes the pipe before the report is written. The
    exit code is still the verdict's (it was 0 whatever the verdict, so ``set -o pipefail`` passed
    a wrong plan: an outside probe, 2026-12-07), and no traceback is printed."""
    import os

    maps, plans = _maps_file(tmp_path), tmp_path / "plans.json"
    assert main(["plan", str(maps), "-o", str(plans)]) == 0
    doc = json.loads(plans.read_text())
    doc["parameters"]["w"]["segments"] = doc["parameters"]["w"]["segments"][drop:]
    plans.write_text(json.dumps(doc))
    command = [sys.executable, "-P", "-m", "refplan", "verify", str(maps), str(plans), "--json"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    full = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert (full.returncode, json.loads(full.stdout)["status"]) == (code, verdict), full.stderr
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte is written
    try:
        gone = subprocess.run(command, stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write)
    assert gone.returncode == code, gone.stderr
    assert "Traceback" not in gone.stderr and "BrokenPipeError" not in gone.stderr, gone.stderr
