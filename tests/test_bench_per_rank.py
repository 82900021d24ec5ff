"""Peers that plan on every rank at once are charged one rank's planning, not every rank's.

Megatron-Core 0.19.2 is charged the slowest rank's planning call, not the sum of every rank's; Awex
the slower of two ranks' own calls, not its global call; DCP the slowest rank's local plans and the
coordinator's steps.

Each rank of a 0.19.2 refit calls ``build_plan_from_rosters`` for itself, all ranks at once
(``build_local_reshard_plan``, planner.py:500); both of refplan's 0.19.2 workers (the bench's
end-to-end one and the conformance adapter's) used to time their loop over every destination rank as
one region, which charged 0.19.2 8-16x its plan stage and made another peer look fastest (a
peer-maintainer review, 2026-12-06). A stand-in megatron-core whose planning call burns a fixed CPU
time per call tells the two apart, whatever the machine's load (CPU time, not wall).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

CALL_CPU_S = 0.08
"""CPU seconds each stand-in planning call burns."""

PLANNER = f'''
import time


class _Plan:
    recv_ops = []


def build_plan_from_rosters(dst, src, rank):
    start = time.process_time()
    while time.process_time() - start < {CALL_CPU_S}:
        pass
    return _Plan()
'''

UTILS = '''
class ParameterMetadata:
    def __init__(self, **fields):
        self.__dict__.update(fields)
'''


@pytest.fixture()
def stand_in(tmp_path: Path) -> Path:
    """A folder holding a megatron-core of its own (version 0.0.0): the workers put it first on sys.path."""
    package = tmp_path / "megatron" / "core" / "resharding"
    package.mkdir(parents=True)
    for folder in (tmp_path / "megatron", tmp_path / "megatron" / "core", package):
        (folder / "__init__.py").write_text("", encoding="utf-8")
    (package / "planner.py").write_text(PLANNER, encoding="utf-8")
    (package / "utils.py").write_text(UTILS, encoding="utf-8")
    info = tmp_path / "megatron_core-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-core\nVersion: 0.0.0\n", encoding="utf-8")
    return tmp_path


def _meta(name: str, rank: int) -> dict[str, object]:
    return {"name": name, "resolved_name": name, "shape": [4], "dtype": "float32", "owner_rank": rank}


def test_the_adapters_worker_reports_the_slowest_rank(stand_in: Path) -> None:
    from refplan.conformance.peers import megatron_worker

    ranks = 6
    request = {"dst": {str(r): [_meta("w", r)] for r in range(ranks)}, "src": {"w": [_meta("w", 0)]}}
    done = subprocess.run([sys.executable, "-P", megatron_worker.__file__, str(stand_in)],
                          input=json.dumps(request) + "\n", capture_output=True, text=True, timeout=120, check=True)
    ready, answer = (json.loads(line) for line in done.stdout.splitlines())
    assert ready["ready"] == "0.0.0", ready
    assert CALL_CPU_S * 0.9 <= answer["seconds"] < CALL_CPU_S * 2, answer  # one call's, not six


def test_the_bench_worker_reports_the_slowest_rank(stand_in: Path) -> None:
    from refplan.cli.bench import _MegatronWorker, megatron_doc
    from refplan.cli.bench import scenarios as bench_scenarios

    scenario = next(s for s in bench_scenarios(quick=True) if s.layout is not None and s.name.startswith("llama"))
    worker = _MegatronWorker(str(stand_in))
    try:
        assert worker.version == "0.0.0"
        worker.load(megatron_doc(scenario.layout, replicated_tp=True))
        stages, _ops = worker.run(gc_off=False)
    finally:
        worker.close()
    destinations = len(set(scenario.layout.target_process.values()))
    assert destinations > 2, textwrap.shorten(str(scenario.layout.target_process), 200)
    assert CALL_CPU_S * 0.9 <= stages.plan < CALL_CPU_S * 2, (stages, destinations)


def _burn() -> None:
    """Burn ``CALL_CPU_S`` of this process's CPU time."""
    import time

    start = time.process_time()
    while time.process_time() - start < CALL_CPU_S:
        pass


def test_dcp_build_is_the_slowest_source_ranks_save_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's DCP build is one source rank's local save plan (the slowest), not all four in
    series: a save plan that burns a fixed CPU time per call is charged once."""
    from torch.distributed.checkpoint import default_planner

    from refplan.cli.bench import _dcp_contender
    from refplan.cli.bench import scenarios as bench_scenarios

    real = default_planner.DefaultSavePlanner.create_local_plan

    def slow(self: object) -> object:
        _burn()
        return real(self)  # type: ignore[arg-type]

    scenario = next(s for s in bench_scenarios(quick=True) if s.layout is not None and s.name.startswith("llama"))
    contender = _dcp_contender(scenario.layout)
    if isinstance(contender, str):
        pytest.skip(contender)
    monkeypatch.setattr(default_planner.DefaultSavePlanner, "create_local_plan", slow)
    stages, output = contender.run(False)
    sources = len(set(scenario.layout.source_process.values()))
    assert sources > 2 and output.build_seconds is not None
    assert CALL_CPU_S * 0.9 <= stages.build < CALL_CPU_S * 2, (stages, sources)


def _planned(spec: str) -> tuple[Any, Any]:
    """(output, conversion) of ``spec``'s bench call on TP2xDP2 -> TP4 (four targets, four sources)."""
    from refplan.conformance.peers import WorkerTimed, bench_contender
    from refplan.maps import contiguous_split_map, replicate

    tp2 = contiguous_split_map((8, 4), [4, 4], 0)
    got = bench_contender(spec, {"w": (contiguous_split_map((8, 4), [2, 2, 2, 2], 0), replicate(tp2, 2))})
    assert not isinstance(got, str), got
    _name, run, convert = got
    output = run()
    assert isinstance(output, WorkerTimed), output
    return output, convert


def test_awex_is_charged_one_ranks_own_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Awex's plan stage is what one rank pays (its metadata check, then ``build_local_transfer_plan``
    for itself), the slower of the first inference and the first training rank, not the global call
    ``call_peer`` makes for the conversion."""
    try:
        from refplan.conformance.peers import AwexAdapter

        AwexAdapter()
    except Exception as exc:  # any import failure of the peer
        pytest.skip(f"awex is not installed (make peers): {exc}")
    import awex.transfer.transfer_plan as awex_plan

    called: list[int] = []
    real = awex_plan.TransferPlanBuilder.build_local_transfer_plan

    def spy(self: object, infer: object, train: object, rank: int) -> object:
        called.append(rank)
        _burn()
        return real(self, infer, train, rank)  # type: ignore[arg-type]

    monkeypatch.setattr(awex_plan.TransferPlanBuilder, "build_local_transfer_plan", spy)
    output, convert = _planned("awex")
    assert CALL_CPU_S * 0.9 <= output.planning_seconds[0] < CALL_CPU_S * 1.8, output  # the slower rank, not both
    assert called == [0, 4], called  # four inference ranks: the first training rank is global rank 4
    assert convert(output)["w"]["segments"]  # the conversion still reads the global call's operations


def test_dcp_is_charged_the_coordinator_and_its_slowest_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP's plan stage is what a sync waits for: the coordinator's global plans and the slowest
    target rank's own load plan, not every rank's load plan in series. A load plan that burns a
    fixed CPU time per call makes the two apart: four target ranks, one call's time charged."""
    from torch.distributed.checkpoint import default_planner

    real = default_planner.DefaultLoadPlanner.create_local_plan

    def slow(self: object) -> object:
        _burn()
        return real(self)  # type: ignore[arg-type]

    monkeypatch.setattr(default_planner.DefaultLoadPlanner, "create_local_plan", slow)
    output, convert = _planned("dcp")
    assert CALL_CPU_S * 0.9 <= output.planning_seconds[0] < CALL_CPU_S * 2, output.planning_seconds  # not 4x
    assert convert(output)["w"]["segments"]
