"""``refplan bench``, the cost-aware policies, and the speed-ups' equivalence.

Wall-clock numbers are never asserted (a shared two-core runner stretches them arbitrarily); only
plan quality, which is deterministic: bytes on the busiest sender over the lower bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
from dataclasses import astuple
from typing import Any

import pytest

import refplan.plan as plan_module
from refplan import (
    InvalidMapError,
    InvalidReplicaPolicyError,
    PlanBudget,
    TransferEndpoints,
    TransferSegment,
    contiguous_split_map,
    replicate,
    replicated_map,
)
from refplan.analysis import load_lower_bound, sender_load
from refplan.cli.bench import (
    add_bench_arguments,
    llama_scenario,
    run_bench,
    run_bench_cli,
    uneven_scenario,
    zero2_scenario,
)
from refplan.limits import fast_paths
from refplan.plan import coalesce
from refplan.planner import collect_requests, plan_transfers
from refplan.policies import POLICIES, lpt, split_balanced, split_balanced_policy
from refplan.verify import verify_plans


def bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    code = run_bench_cli(parser.parse_args(argv))
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def quick_report() -> dict[str, Any]:
    """One ``bench --quick`` run (DeepSpeed included when importable), as its JSON."""
    import contextlib
    import io

    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_bench_cli(parser.parse_args(["--quick", "--json"])) == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def rows(report: dict[str, Any], scenario: str) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in report["rows"] if r["scenario"] == scenario}


@pytest.mark.parametrize("scenario", ["llama-sync", "zero2-sync"])
def test_quick_bench_policy_quality(quick_report: dict[str, Any], scenario: str) -> None:
    got = rows(quick_report, scenario)
    assert got["split_balanced"]["lower_bound_ratio"] <= 1.05
    assert got["balanced"]["lower_bound_ratio"] <= 1.25
    assert got["lpt"]["lower_bound_ratio"] <= 1.25
    assert got["first_holder"]["lower_bound_ratio"] >= 3.9  # the lowest holder sends everything


def test_quick_bench_rows_are_sound(quick_report: dict[str, Any]) -> None:
    names = {s["name"] for s in quick_report["scenarios"]}
    assert {"llama-sync", "zero2-sync", "uneven", "moe-gather-64", "moe-gather-256"} <= names
    summaries = {s["name"]: s for s in quick_report["scenarios"]}
    assert summaries["llama-sync"]["parameters"] == 194
    for row in quick_report["rows"]:
        if row["peer"] != "refplan":
            continue  # test_quick_bench_deepspeed_rows and _other_peer_rows judge these, skipping visibly
        assert row["error"] is None, row  # refplan itself never refuses a bench scenario
        assert row["oracle"] == "ok", row
        assert row["lower_bound_ratio"] >= 1.0 - 1e-12, row  # nothing beats the bound
        assert row["sync_seconds"] >= summaries[row["scenario"]]["sync_lower_bound_seconds"] * (1 - 1e-12)
        assert row["plan_seconds"] > 0
    uneven = rows(quick_report, "uneven")
    assert uneven["split_balanced"]["split_requests"] > 0
    assert uneven["split_balanced"]["lower_bound_ratio"] < uneven["balanced"]["lower_bound_ratio"]
    assert uneven["split_balanced"]["sync_seconds"] <= uneven["balanced"]["sync_seconds"] * (1 + 1e-12)
    assert quick_report["model"]["alpha_network_s"] > 0 and quick_report["model"]["beta_network_Bps"] > 0
    assert [t["target"] for t in quick_report["targets"]]  # evaluated, whatever the machine


@pytest.mark.parametrize("peer", ["dcp", "megatron", "megatron-0.16", "awex"])
def test_quick_bench_other_peer_rows(quick_report: dict[str, Any], peer: str) -> None:
    """DCP, Megatron-Core (0.19.2 and 0.16.1) and Awex are timed on the Llama batches in the same run; their plans pass
    the oracle and are measured like refplan's (the zero2 sender imbalance of Megatron and Awex is
    theirs: every destination reads one replica)."""
    got = {r["scenario"]: r for r in quick_report["rows"] if r["peer"] == peer}
    if any(str(r["error"]).startswith("planner") for r in got.values()):
        pytest.skip(f"peer {peer} is not installed (make peers)")
    for scenario in ("llama-sync", "zero2-sync"):
        row = got[scenario]
        assert row["error"] is None and row["oracle"] == "ok" and row["plan_seconds"] > 0, row
        assert row["lower_bound_ratio"] >= 1.0 - 1e-12
    if peer in ("megatron", "megatron-0.16", "awex"):
        assert got["zero2-sync"]["lower_bound_ratio"] > 7.9  # one replica serves all eight targets
    else:
        assert got["zero2-sync"]["lower_bound_ratio"] < 1.2  # DCP's save-side dedup spreads chunks


def test_quick_bench_deepspeed_rows(quick_report: dict[str, Any]) -> None:
    """DeepSpeed's rows: its plans pass the oracle and match refplan's lowest-holder load.

    Skipped, with the reason, when DeepSpeed is not importable or refused a scenario: a row
    that could not be compared is reported as such, never counted as a pass.
    """
    if quick_report["deepspeed"] is None:
        pytest.skip("DeepSpeed (extra 'peer', deepspeed==0.19.8) is not importable: no peer rows to compare")
    peer = [r for r in quick_report["rows"] if r["peer"] == "deepspeed"]
    assert peer, "DeepSpeed is importable but the bench produced no DeepSpeed row"
    compared = 0
    for row in peer:
        if row["error"] is not None:
            continue
        assert row["oracle"] == "ok", row
        assert row["lower_bound_ratio"] >= 1.0 - 1e-12, row
        mine = rows(quick_report, row["scenario"]).get("first_holder")  # the same lowest-holder rule
        if mine is not None:
            assert row["lower_bound_ratio"] == pytest.approx(mine["lower_bound_ratio"]), (row, mine)
        compared += 1
    assert any(r["scenario"] == "llama-sync" and r["error"] is None for r in peer), peer
    refused = [f"{r['scenario']}: {r['error']}" for r in peer if r["error"] is not None]
    if refused:
        pytest.skip(f"compared {compared} DeepSpeed row(s); DeepSpeed refused {len(refused)}: " + "; ".join(refused))


def test_bench_table_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = bench(["--scenario", "uneven", "--no-peer", "--repeat", "1"], capsys)
    assert code == 0
    assert "uneven:" in out and "refplan:split_balanced" in out and "/LB" in out
    assert "model inputs" in out or "inputs, not measurements" in out
    code, _ = bench(["--scenario", "no-such"], capsys)
    assert code == 2
    code, _ = bench(["--scenario", "uneven", "--beta", "0"], capsys)
    assert code == 2


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--alpha", "nan", "--alpha must be from 0 to 3600 (seconds per message), got nan"),
    ("--alpha", "inf", "--alpha must be from 0 to 3600 (seconds per message), got inf"),
    ("--alpha", "1e308", "--alpha must be from 0 to 3600 (seconds per message), got 1e+308"),
    ("--beta", "inf", "--beta must be from 1 to 1e+18 (bytes per second), got inf"),
    ("--beta", "1e-300", "--beta must be from 1 to 1e+18 (bytes per second), got 1e-300"),
    ("--sync-runs", "0", "--sync-runs must be at least 1, got 0"),
    ("--repeat", "-2", "--repeat must be at least 1, got -2"),
    ("--min-split-bytes", "-1", "--min-split-bytes must be >= 0, got -1"),
])
def test_bench_names_each_bad_option_before_running(
    option: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``--alpha nan`` ended in a bare ``ValueError`` traceback, ``--beta inf`` and
    ``--sync-runs 0`` (read as 1) were taken; one line, exit 2, the option and its value named."""
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    code = run_bench_cli(parser.parse_args(["--scenario", "uneven", "--no-peer", option, value]))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip() == f"refplan bench: bad input: {said}", err


def test_bench_report_says_how_it_was_made(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a report printed its targets with the load but not the command that made it, so a
    pasted report could not be rerun as it was. Both front doors record the command as typed, the
    cores and the load when the run began, printed first and again over the targets; a report made
    from Python (no command line) invents none."""
    from refplan.cli.bench import BenchReport, format_report
    from refplan.cli.bench import main as bench_main
    from refplan.cli.main import main as cli_main

    for run, first in ((cli_main, ["bench"]), (bench_main, [])):
        assert run([*first, "--scenario", "uneven", "--no-peer", "--no-oracle", "--repeat", "1", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["command"] == "refplan bench --scenario uneven --no-peer --no-oracle --repeat 1 --json"
        assert doc["machine"]["cores"] == os.cpu_count()
        assert doc["machine"]["load_before"] is None or doc["machine"]["load_before"] >= 0
    model = {"alpha_network_s": 1e-5, "beta_network_Bps": 1e10, "alpha_node_s": 1e-6, "beta_node_Bps": 1e11,
             "min_split_bytes": 1}
    report = BenchReport(model=model, deepspeed=None, repeat=1)
    report.targets = [{"target": "t", "detail": "d", "met": True}]
    text = format_report(report)
    assert "command:" not in text and "\ntargets:\n" in text
    report.command = "refplan bench --sync --scenario 'a b'"
    report.machine = {"cores": 2, "load_before": 0.5}
    text = format_report(report)
    said = "command: refplan bench --sync --scenario 'a b'; 2 cores; load average 0.50 when the run began"
    assert text.splitlines()[0] == said
    assert f"\ntargets ({said}):\n  [MET] t: d" in text


def test_bench_is_deterministic_in_bytes() -> None:
    first = run_bench([uneven_scenario()], repeat=1, peer=False, oracle=False)
    second = run_bench([uneven_scenario()], repeat=1, peer=False, oracle=False)
    key = [(r.policy, r.segments, r.max_bytes, r.lower_bound_ratio) for r in first.rows]
    assert key == [(r.policy, r.segments, r.max_bytes, r.lower_bound_ratio) for r in second.rows]


# ---------------------------------------------------------------------------------------------
# Policies.


def test_scenarios_have_the_stated_shapes() -> None:
    llama = llama_scenario()
    assert len(llama.pairs) == 194
    zero2 = zero2_scenario(layers=2)
    assert len(zero2.pairs) == 14
    target, source = zero2.pairs["layers.00.attn.qkv"]
    assert len(source.ranks) == 8 and len(target.ranks) == 8


def test_split_balanced_splits_only_what_helps_and_tiles() -> None:
    scenario = uneven_scenario()
    kwargs = {"endpoints": scenario.endpoints, "element_size": scenario.element_size,
              "process_node": scenario.process_node}
    bound = load_lower_bound(collect_requests(scenario.pairs, **kwargs))
    plans = plan_transfers(scenario.pairs, replica_policy=split_balanced, **kwargs)
    again = plan_transfers(scenario.pairs, replica_policy=split_balanced, **kwargs)
    assert {n: p.encode() for n, p in plans.items()} == {n: p.encode() for n, p in again.items()}
    assert verify_plans(scenario.pairs, plans).ok
    splits = sum(p.statistics.split_requests for p in plans.values())
    assert splits > 0
    top = max(sender_load(plans, endpoints=scenario.endpoints, element_size=scenario.element_size).sent.values())
    whole = plan_transfers(scenario.pairs, replica_policy=POLICIES["balanced"], **kwargs)
    top_whole = max(sender_load(whole, endpoints=scenario.endpoints,
                                element_size=scenario.element_size).sent.values())
    assert bound.bytes <= top < top_whole
    # A floor above every request: no split is possible, so nothing is split.
    huge = split_balanced_policy(min_split_bytes=1 << 40)
    plans = plan_transfers(scenario.pairs, replica_policy=huge, **kwargs)
    assert sum(p.statistics.split_requests for p in plans.values()) == 0
    # A planner floor above the policy's refuses its splits (the policy does not see the floor).
    with pytest.raises(InvalidReplicaPolicyError, match="min_split_bytes"):
        plan_transfers(scenario.pairs, replica_policy=split_balanced_policy(min_split_bytes=1 << 20),
                       min_split_bytes=1 << 30, **kwargs)


def test_split_balanced_prefers_local_then_node() -> None:
    shape = (64, 8)
    pairs = {"w": (contiguous_split_map(shape, [32, 32], 0), replicate(contiguous_split_map(shape, [64], 0), 3))}
    # Source replicas on processes 0, 1, 2; targets on 0 and 5; process 1 shares node 1 with 5.
    endpoints = TransferEndpoints({0: 0, 1: 1, 2: 2}, {0: 0, 1: 5})
    nodes = {0: 0, 1: 1, 2: 2, 5: 1}
    plans = plan_transfers(pairs, endpoints=endpoints, element_size={"w": 2}, process_node=nodes,
                           replica_policy=split_balanced)
    by_target = {s.target_rank: s.source_rank for s in plans["w"].segments}
    assert by_target == {0: 0, 1: 1}


def test_split_balanced_factory_validates() -> None:
    with pytest.raises(ValueError, match="min_split_bytes"):
        split_balanced_policy(min_split_bytes=-1)
    with pytest.raises(ValueError, match="beta"):
        split_balanced_policy(beta=0.0)
    assert POLICIES["split_balanced"] is split_balanced
    assert split_balanced.__name__ == "split_balanced"


def test_lpt_is_megatrons_rule() -> None:
    """Fewest candidates first, then largest first, each to the least-loaded holder; no locality."""
    shape = (12, 1)
    pairs = {
        "a": (contiguous_split_map(shape, [6, 4, 2], 0), replicate(contiguous_split_map(shape, [12], 0), 2)),
    }
    endpoints = TransferEndpoints({0: 0, 1: 1}, {0: 0, 1: 7, 2: 8})
    plans = plan_transfers(pairs, endpoints=endpoints, replica_policy=lpt)
    by_target = {s.target_rank: s.source_rank for s in plans["a"].segments}
    # 6 elements to process 0 (ties to the lowest location; not because it is local), 4 to 1, 2 to 1.
    assert by_target == {0: 0, 1: 1, 2: 1}
    assert verify_plans(pairs, plans).ok


# ---------------------------------------------------------------------------------------------
# The speed-ups change nothing.


def _rm(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return tuple(strides)


@pytest.mark.parametrize("seed", range(30))
def test_coalesce_screening_matches_the_exact_loop(seed: int) -> None:
    """The numpy "nothing can merge here" screen gives the same segments and the same count."""
    rng = random.Random(seed)
    ndim = rng.choice([1, 2, 3])
    s_shard = tuple(rng.randint(1, 6) for _ in range(ndim))
    t_shard = tuple(rng.randint(1, 6) for _ in range(ndim))
    segments = []
    for _ in range(rng.randint(0, 400)):
        shape = tuple(rng.randint(1, 3) for _ in range(ndim))
        s_str = _rm(s_shard) if rng.random() < 0.8 else tuple(rng.randint(-1, 5) for _ in range(ndim))
        t_str = _rm(t_shard) if rng.random() < 0.8 else tuple(rng.randint(0, 5) for _ in range(ndim))
        segments.append(TransferSegment(rng.randint(0, 2), rng.randint(-2, 60), s_str,
                                        rng.randint(0, 2), rng.randint(-2, 60), t_str, shape))
    shards_s = dict.fromkeys(range(3), s_shard)
    shards_t = dict.fromkeys(range(3), t_shard)
    with fast_paths(False):
        exact = coalesce(segments, shards_s, shards_t, PlanBudget(), "w")
    with fast_paths(True):
        screened = coalesce(segments, shards_s, shards_t, PlanBudget(), "w")
    assert screened == exact


def _groups(segments: list[TransferSegment]) -> dict[tuple[Any, ...], list[TransferSegment]]:
    out: dict[tuple[Any, ...], list[TransferSegment]] = {}
    for s in segments:
        out.setdefault((s.source_rank, s.target_rank, s.source_strides, s.target_strides, len(s.shape)), []).append(s)
    return out


def test_coalesce_screen_sees_both_kinds_of_group() -> None:
    shard = (64, 4)
    strides = _rm(shard)
    # Group (0, 0): 64 single rows, adjacent on both sides (they merge); group (1, 0): rows that
    # never line up with each other (gaps of one row).
    merging = [TransferSegment(0, r * 4, strides, 0, r * 4, strides, (1, 4)) for r in range(64)]
    apart = [TransferSegment(1, r * 8, strides, 0, r * 8, strides, (1, 4)) for r in range(8)]
    quiet = plan_module._quiet_groups(_groups(merging + apart), {0: shard, 1: shard}, {0: shard})
    assert (1, 0, strides, strides, 2) in quiet and (0, 0, strides, strides, 2) not in quiet
    out, _checks = coalesce(merging + apart, {0: shard, 1: shard}, {0: shard}, PlanBudget(), "w")
    assert len(out) == 1 + 8


def test_layout_memo_is_invisible() -> None:
    """Repeated layouts are validated once per batch; plans and statistics are the same without."""
    scenario = llama_scenario(layers=3, hidden=64, ffn=160, vocab=300)
    kwargs: dict[str, Any] = {"endpoints": scenario.endpoints, "element_size": scenario.element_size,
                              "process_node": scenario.process_node}
    with_memo = plan_transfers(scenario.pairs, **kwargs)
    with fast_paths(False):
        without = plan_transfers(scenario.pairs, **kwargs)
    assert list(with_memo) == list(without)
    for name in with_memo:
        assert with_memo[name] == without[name]
        assert astuple(with_memo[name].statistics) == astuple(without[name].statistics)


def test_layout_memo_keeps_per_parameter_errors() -> None:
    """A repeated layout still reports endpoint problems under each parameter's own name."""
    shape = (4, 4)
    good = (contiguous_split_map(shape, [2, 2], 0), replicate(contiguous_split_map(shape, [4], 0), 2))
    pairs = {"a": good, "b": good}
    with pytest.raises(InvalidMapError, match=r"parameter 'a'.*source location 1"):
        plan_transfers(pairs, endpoints=TransferEndpoints({0: 0}, {0: 5, 1: 6}))
    sizes = {"a": 2}
    with pytest.raises(ValueError, match="parameter 'b'") as info:  # an argument error, not a map error
        plan_transfers(pairs, element_size=sizes)
    assert not isinstance(info.value, InvalidMapError)
    bad = (replicated_map(shape, 2), replicated_map((4, 5), 2))
    with pytest.raises(InvalidMapError, match="parameter 'c'"):
        plan_transfers({"a": good, "b": good, "c": bad})


def test_bench_sync_rows_or_a_clear_refusal() -> None:
    """``--sync`` runs real syncs through the executor; skipped where torch is missing."""
    pytest.importorskip("torch")
    from refplan.cli.bench import SYNC_POLICIES, run_sync_rows

    got = run_sync_rows(runs=1)
    assert {(r["policy"]) for r in got} == set(SYNC_POLICIES)
    assert all(r["median_seconds"] > 0 for r in got)
    by = {(r["layout"], r["policy"]): r for r in got}
    for (layout, _policy), row in by.items():
        base = by[(layout, "first_holder")]
        assert row["ratio_to_first_holder"] == pytest.approx(row["median_seconds"] / base["median_seconds"])
        assert row["estimate_seconds"] > 0
    # The model, deterministic: in place, balanced copies locally and first_holder does not.
    inplace = next(layout for layout, _ in by if "in place" in layout)
    assert by[(inplace, "balanced")]["estimate_ratio_to_first_holder"] < 0.5


def test_moe_scale_targets_are_judged_from_the_rows() -> None:
    """The MoE-scale issue's targets come from the rows of the run: plan against the fastest
    peer's own planning call, plan + verify against DeepSpeed's plan, and a measured peak."""
    from refplan.cli.bench import TARGET_MOE_MEMORY_BYTES, BenchReport, Row, _targets

    report = BenchReport(model={}, deepspeed="0.19.8", repeat=1)
    report.rows = [
        Row("moe-model", "refplan", "balanced", 0.30, oracle_seconds=0.20),
        Row("moe-model", "deepspeed", "lowest holder", 3.00),
        Row("moe-model", "megatron", "megatron-core", 0.10),
        Row("moe-model", "awex", "awex", 0.40),
        Row("llama-sync", "refplan", "balanced", 0.010),
        Row("llama-sync", "awex", "awex", 0.012),
        Row("llama-sync", "dcp", "dcp", None, error="refused"),
    ]
    report.peak_memory = {"moe-model-100k": TARGET_MOE_MEMORY_BYTES + 1}
    met = {t["target"]: (t["met"], t["detail"]) for t in _targets(report)}
    assert met["moe-model plan only <= fastest peer's plan only"][0] is False
    assert "megatron" in met["moe-model plan only <= fastest peer's plan only"][1]
    assert met["llama-sync plan only <= fastest peer's plan only"][0] is True
    assert met["moe-model plan+verify <= 0.25x DeepSpeed's plan"] == (
        True, "0.300 + 0.200 s vs 3.000 s = 0.17x")
    assert [m for name, (m, _) in met.items() if "peak memory" in name] == [False]
    assert "zero2-sync plan only <= fastest peer's plan only" not in met  # not run: not judged


def test_peak_memory_is_measured_in_a_fresh_process() -> None:
    """The child's own high-water mark: not this process's, even though the child is forked from
    it (Linux carries ``ru_maxrss`` across fork and exec; 512 MiB held here must not show)."""
    import numpy as np

    from refplan.cli.bench import _peak_memory

    held = np.ones(64 << 20)  # 512 MiB, written, so resident
    peak = _peak_memory("zero2-sync")
    assert 20 << 20 < peak < 256 << 20, peak
    assert held[-1] == 1.0


def test_the_plan_stages_script_times_every_stage() -> None:
    """``scripts/plan_stages.py`` (docs/performance.md's profile) still runs the planner's stages."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "plan_stages.py"
    timed = runpy.run_path(str(script))["stages"]("zero2-sync", 1)
    assert list(timed) == ["validate + requests", "policy input", "policy", "check", "emit / reuse plans"]
    assert all(us >= 0.0 for us in timed.values()) and sum(timed.values()) > 0.0


def test_the_agreement_scaling_script_times_both_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    """``scripts/agree_scaling.py`` (what ``agree._STORE_MAX_PROCESSES`` rests on) still runs: the
    store agreement (the brief's, and the outcome's uniform one) and the all-reduce, on 2 gloo
    processes, a few agreements each."""
    pytest.importorskip("torch")
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "agree_scaling.py"
    assert runpy.run_path(str(script))["main"](["2", "--ops", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["all_reduce", "store", "store-uniform"] * 2, lines
    assert all("ms per agreement" in line for line in lines), lines


def test_the_whole_call_cpu_script_touches_only_names_that_exist() -> None:
    """``scripts/whole_call_cpu.py`` patches and reads private names (its run moves 272 MiB, too
    much for the suite): each must still exist where it looks."""
    pytest.importorskip("torch")
    import refplan.execute.transport as transport
    from refplan.cli import bench

    assert callable(transport._pack) and callable(bench._raw_layouts) and callable(bench._marker_shards)
    assert bench.WHOLE_LAYOUT in bench._raw_layouts()


def test_the_whole_call_perf_script_charges_each_sample_to_the_call_it_fell_in() -> None:
    """``scripts/whole_call_perf.py`` (docs/performance.md, "What the interpreter costs under load")
    charges each ``perf script`` sample to the kind whose window, in the sample's own process, holds
    it: not to another process's call, not between calls; its names into the executor still exist."""
    pytest.importorskip("torch")
    import runpy
    from pathlib import Path

    import refplan.execute.transport as transport
    from refplan.cli import bench

    script = runpy.run_path(str(Path(__file__).resolve().parent.parent / "scripts" / "whole_call_perf.py"))
    windows = {
        100: (0, [(10.0, 11.0, "raw"), (12.0, 13.0, "exec")]),  # a sender
        200: (2, [(10.5, 12.5, "floor")]),  # a receiver
    }
    lines = [
        "100/100 10.5: 7f0 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)",
        "100/101 12.5: ffff _copy_to_iter ([kernel.kallsyms])",
        "100/100 11.5: 7f1 between_calls (/usr/lib/libc.so.6)",  # in no window of its process
        "200/200 11.5: 7f2 c10::function_ref<void (char**)> (/x/libtorch_cpu.so)",
        "300/300 10.5: 7f3 another_process (/usr/lib/libc.so.6)",
        "not a sample line",
    ]
    charged = script["charge"](lines, windows)
    assert charged == {
        ("raw", "S", "main", "libpython3.11.so.1.0", "_PyEval_EvalFrameDefault"): 1,
        ("exec", "S", "other", "[kernel.kallsyms]", "_copy_to_iter"): 1,
        ("floor", "R", "main", "libtorch_cpu.so", "c10::function_ref<void"): 1,
    }
    text = "\n".join(script["report"](charged, 1, 1000))
    assert "  exec  senders    1.0 (  0.0)  receivers    0.0 (  0.0)  all    1.0" in text, text
    assert "grown most from move to exec:" in text and "+1.00  _copy_to_iter" in text, text
    assert callable(transport._move) and callable(bench._floor) and callable(bench._raw_buffers)
    assert callable(bench._warm_whole_call) and bench.WHOLE_LAYOUT in bench._raw_layouts()


def test_the_whole_call_floor_script_replays_the_executors_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    """``scripts/whole_call_floor.py`` (the floor under item 8a in docs/performance.md) still runs
    on a small batch (the model at one layer): its replay of the executor's schedule lands every
    target element right before and after the timed runs (else it exits 1), and it prints every
    kind against raw and the executor's phases."""
    pytest.importorskip("torch")
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "whole_call_floor.py"
    assert runpy.run_path(str(script))["main"](["--layers", "1", "--runs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["raw", "messages", "copies", "move", "executor", "executor"], lines
    assert all("median per-run ratio to raw x" in line for line in lines[:5]), lines
    assert all(f"{phase} " in lines[5] for phase in ("checks", "verdict", "move", "outcome")), lines


def test_the_judged_syncs_targets_are_reset_in_place_so_a_missed_element_fails() -> None:
    """The ``--sync`` pairs write the same target tensors every run (``bench._reset_targets``
    between them): every bit is set again in the same memory, so a call that landed nothing after
    a run that landed everything is caught by the check, as on new blank targets."""
    pytest.importorskip("torch")
    import numpy as np
    import torch

    from refplan.cli import bench
    from refplan.cli.sync import bits_of, marker_bits, tensor_from_bits

    expected = {"w": {0: marker_bits((3, 4), torch.bfloat16)}, "b": {1: marker_bits((5,), torch.bfloat16)}}
    targets = bench._blank_targets(expected, torch.bfloat16)
    blank = {name: {loc: bits_of(t).copy() for loc, t in per.items()} for name, per in targets.items()}
    where = {name: {loc: t.data_ptr() for loc, t in per.items()} for name, per in targets.items()}
    for name, per in expected.items():  # a run that landed every element
        for loc, want in per.items():
            targets[name][loc].copy_(tensor_from_bits(want, torch.bfloat16))
            assert np.array_equal(bits_of(targets[name][loc]), want)
    bench._reset_targets(targets)
    for name, per in expected.items():
        for loc, want in per.items():
            assert targets[name][loc].data_ptr() == where[name][loc]  # the same memory
            assert np.array_equal(bits_of(targets[name][loc]), blank[name][loc])
            assert not np.array_equal(bits_of(targets[name][loc]), want)


def test_other_processes_cpu_is_the_machines_busy_time_less_our_own() -> None:
    """``bench._cpu_reading`` counts this process's CPU (and its reaped children's) in its own part
    and in the machine's busy part alike, so ``bench._others_cores`` leaves it out; what is left,
    per second of wall time, is what other processes used."""
    import subprocess
    import sys
    import time

    from refplan.cli import bench

    before = bench._cpu_reading()
    if before is None:
        pytest.skip("no /proc/stat here")
    start = time.process_time()
    while time.process_time() - start < 0.3:  # 0.3 s of our own CPU
        pass
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.3: pass"], check=True)  # and 0.3 s of a child's
    after = bench._cpu_reading()
    assert after is not None
    own = after[1] - before[1]
    assert own >= 0.55, own
    # The machine was busy at least while we were: /proc/stat samples ticks (10 ms) where our own
    # time is exact, so they agree to a few ticks on a steady spin.
    assert after[0] - before[0] >= own - 0.15
    # What is left over is others' use per second of wall time, never below zero.
    assert bench._others_cores((10.0, 4.0, 100.0), (13.0, 5.0, 102.0)) == pytest.approx(1.0)
    assert bench._others_cores((10.0, 4.0, 100.0), (10.5, 4.6, 101.0)) == 0.0
    assert bench._others_cores(None, after) is None and bench._others_cores(after, after) is None


def test_bench_times_the_executors_own_small_collectives() -> None:
    """``--sync`` sets the whole call against raw plus every small collective the executor makes
    per call (the verdict, which is also the hello, and the outcome); their sizes are its own."""
    pytest.importorskip("torch")
    from refplan import execute
    from refplan.cli.bench import CALL_COLLECTIVES, PHASES

    assert CALL_COLLECTIVES == (("verdict", "agreement", execute._VERDICT_WORDS), ("outcome", "agreement", 1))
    assert execute._VERDICT_WORDS == 2 and execute._HELLO_WORDS == 37
    assert PHASES == ("checks", "verdict", "move", "outcome")


def test_bench_sync_report_judges_each_executor_target() -> None:
    """The three executor targets of ``--sync``, each printed MET or NOT MET with its measure."""
    from refplan.cli.bench import (
        FIXED_LAYOUT,
        PHASES,
        RAW_LAYOUT,
        WHOLE_LAYOUT,
        BenchReport,
        _fixed_target,
        _raw_target,
        _whole_call_target,
        format_report,
        paired_ratios,
    )

    def measured(layout: str, call: float, move: float, raw: float, nbytes: int) -> dict[str, Any]:
        return {
            "layout": layout, "policy": "balanced", "runs": 3, "move_seconds": move, "call_seconds": call,
            "after_verdict_seconds": move, "raw_seconds": raw, "best_move_seconds": move,
            "best_call_seconds": call, "best_raw_seconds": raw, "ratio": move / raw, "call_ratio": call / raw,
            "ratio_of_medians": move / raw, "move": paired_ratios([move], [raw]), "call": paired_ratios([call], [raw]),
            "after_verdict": paired_ratios([move], [raw]), "phases": dict.fromkeys(PHASES, call / 4),
            "collectives_seconds": 0.003, "call_vs_raw_and_collectives": paired_ratios([call], [raw + 0.003]),
            "exchanges_seconds": raw + 0.003, "checked_elements": 10, "network_bytes": nbytes,
        }

    model = {"alpha_network_s": 1e-5, "beta_network_Bps": 1e10, "alpha_node_s": 1e-6, "beta_node_Bps": 1e11,
             "min_split_bytes": 1}
    report = BenchReport(model=model, deepspeed=None, repeat=1)
    report.sync_whole = measured(WHOLE_LAYOUT, 1.3, 1.1, 1.0, 300 << 20)
    report.sync_raw = measured(RAW_LAYOUT, 0.2, 0.12, 0.1, 28 << 20)
    report.sync_fixed = measured(FIXED_LAYOUT, 0.004, 0.001, 0.001, 8192)
    targets = [_whole_call_target(report.sync_whole), _raw_target(report.sync_raw), _fixed_target(report.sync_fixed)]
    assert [t["met"] for t in targets] == [False, True, True]
    assert "x1.30" in targets[0]["detail"] and "x1.20" in targets[1]["detail"]
    assert "checks 1.00, verdict 1.00, move 1.00, outcome 1.00 ms" in targets[2]["detail"]
    # The protocol's floor is printed beside the fixed cost, never judged in its place.
    assert "its three exchanges bare" in targets[2]["detail"] and "4.00 ms" in targets[2]["detail"]
    report.sync_fixed["exchanges_seconds"] = 0.010
    assert _fixed_target(report.sync_fixed)["met"] is True
    del report.sync_fixed["exchanges_seconds"]
    assert "bare" not in _fixed_target(report.sync_fixed)["detail"]  # older JSON: no floor, nothing invented
    # Beside a sync written by hand, where measured: printed with (a), never judged in its place.
    assert "by hand" not in targets[0]["detail"]
    report.sync_whole.update(hand_seconds=2.6, call_vs_hand=paired_ratios([1.3], [2.6]))
    targets[0] = _whole_call_target(report.sync_whole)
    assert targets[0]["met"] is False
    assert "beside a sync written by hand around the same collective" in targets[0]["detail"]
    assert "2600.0 ms) x0.50" in targets[0]["detail"]
    # Beside its own schedule replayed with nothing around it, likewise.
    assert "replayed" not in targets[0]["detail"]
    report.sync_whole.update(floor_seconds=1.04, call_vs_floor=paired_ratios([1.3], [1.04]))
    targets[0] = _whole_call_target(report.sync_whole)
    assert targets[0]["met"] is False
    assert "beside its own schedule replayed with nothing around it (1040.0 ms, its median x1.04 raw's) x1.25" \
        in targets[0]["detail"]
    # And the call with new target tensors every call, likewise (the judged pairs reuse theirs).
    assert "new target tensors" not in targets[0]["detail"]
    report.sync_whole.update(new_targets_seconds=1.4, new_targets=paired_ratios([1.4], [1.0]))
    targets[0] = _whole_call_target(report.sync_whole)
    assert targets[0]["met"] is False
    assert "with new target tensors every call (1400.0 ms) x1.40 raw" in targets[0]["detail"]
    # The load each was measured at, where recorded; a busy machine is said to be one.
    assert "load average" not in targets[0]["detail"]
    report.sync_whole.update(load_before=1.42, others_cores=0.06, cores=2)
    report.sync_fixed.update(load_before=None, others_cores=0.66, cores=2)
    targets[0], targets[2] = _whole_call_target(report.sync_whole), _fixed_target(report.sync_fixed)
    assert targets[0]["detail"].endswith(
        "; other processes used 0.06 of 2 cores during it, load average 1.42 at its start")
    assert targets[2]["detail"].endswith("; other processes used 0.66 of 2 cores during it: the machine was busy, "
                                         "the targets are stated for an idle one (load below 1)")
    assert targets[2]["met"] is True  # printed beside the verdict, never changing it
    report.targets = targets
    text = format_report(report)
    assert text.count("call/by hand     median of per-run ratios x0.50") == 1
    assert text.count("call/floor       median of per-run ratios x1.25") == 1
    assert text.count("call/raw, new targets each call  median of per-run ratios x1.40") == 1
    assert "[NOT MET] 300.0 MiB sync: the whole call <= 1.25x raw" in text
    assert "[MET] 28.0 MiB sync: the move <= 1.25x raw" in text
    assert "[MET] a warm call's fixed cost <= 5 ms" in text
    assert text.count("phases (median of the slowest process per run): checks") == 3
    assert "verdict agreement 2, outcome agreement 1" in text  # CALL_COLLECTIVES with their kinds
    # A judged figure just past its limit shows the side it is on (was "x1.25" beside NOT MET).
    report.sync_whole["call_ratio"] = 1.2513
    edge = _whole_call_target(report.sync_whole)
    assert edge["met"] is False and "ratios of the whole call: x1.251 (quartiles" in edge["detail"]
    report.sync_whole["call_ratio"] = 1.2499
    edge = _whole_call_target(report.sync_whole)
    assert edge["met"] is True and "ratios of the whole call: x1.25 (quartiles" in edge["detail"]
    report.sync_raw["ratio"] = 1.25004
    edge = _raw_target(report.sync_raw)
    assert edge["met"] is False and "ratios of the move phase: x1.25004 (quartiles" in edge["detail"]
    report.sync_fixed["call_seconds"] = 0.0050004
    edge = _fixed_target(report.sync_fixed)
    assert edge["met"] is False and edge["detail"].startswith("median whole call 5.0004 ms moving")


def test_median_interval_is_the_binomial_one_and_covers_the_median() -> None:
    """The 95 % interval printed beside each judged median: order statistics k and n+1-k with k
    the largest such that P(Binomial(n, 1/2) < k) <= 2.5 % (n = 100: k = 40, the textbook pair
    x(40), x(61)); none below 6 values; and, drawn from a skewed distribution whose median is
    known, it holds that median in at least 95 % of 2 000 samples of 41 (and not in all: it is
    no wider than it must be)."""
    from refplan.cli.bench import median_interval

    assert median_interval([]) is None and median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (1.0, 6.0)  # 2/64 <= 5 %, 14/64 not
    values = [float(v) for v in range(1, 101)]
    random.Random(5).shuffle(values)
    assert median_interval(values) == (40.0, 61.0)
    assert median_interval(values, confidence=0.5) is not None
    low, high = median_interval(values, confidence=0.5)  # type: ignore[misc]
    assert 40.0 < low < high < 61.0
    rng = random.Random(26)
    median = 2.0 ** 0.5  # of 1 + Exp(rate): its median is 1 + ln 2 / rate
    rate = math.log(2) / (median - 1.0)
    held = 0
    for _ in range(2000):
        interval = median_interval([1.0 + rng.expovariate(rate) for _ in range(41)])
        assert interval is not None
        held += interval[0] <= median <= interval[1]
    assert 0.95 * 2000 <= held < 2000


def test_bench_sync_report_prints_where_the_limit_lies_against_the_median_interval() -> None:
    """With enough pairs each judged figure prints its 95 % interval and says whether the limit
    lies inside it (this run's verdict then the noise's), above it or below it; the verdict itself
    stays the median's against the limit."""
    from refplan.cli.bench import (
        TARGET_EXECUTOR_VS_RAW,
        _fixed_target,
        _interval_text,
        _whole_call_target,
        paired_ratios,
    )

    raws = [1.0] * 41
    below = paired_ratios([1.18 + i * 0.001 for i in range(41)], raws)  # 1.180 ... 1.220
    astride = paired_ratios([1.229 + i * 0.001 for i in range(41)], raws)  # 1.229 ... 1.269
    above = paired_ratios([1.30 + i * 0.001 for i in range(41)], raws)
    assert below["ci_low"] == pytest.approx(1.193) and below["ci_high"] == pytest.approx(1.207)
    texts = [_interval_text(s["ci_low"], s["ci_high"], TARGET_EXECUTOR_VS_RAW) for s in (below, astride, above)]
    assert texts[0] == "95 % interval of the median x1.19-x1.21, all at or below x1.25; "
    assert texts[1] == "95 % interval of the median x1.24-x1.26, holding x1.25: undecided by this run's pairs; "
    assert texts[2].endswith("all above x1.25; ")
    assert _interval_text(None, 1.0, 1.25) == ""
    whole = {"runs": 41, "call_ratio": astride["median"], "call": astride, "network_bytes": 300 << 20,
             "call_seconds": 1.25, "raw_seconds": 1.0, "checked_elements": 10}
    target = _whole_call_target(whole)
    assert target["met"] is True  # the median, 1.249, is the verdict; the interval only says how sure
    assert "x1.25 (95 % interval of the median x1.24-x1.26, holding x1.25: undecided" in target["detail"]
    fixed = {"call_seconds": 0.0042, "call_interval": (0.0039, 0.0047), "network_bytes": 8192,
             "phases": {}, "collectives_seconds": 0.001, "raw_seconds": 0.003}
    detail = _fixed_target(fixed)["detail"]
    assert detail.startswith("median whole call 4.20 ms moving 8192 bytes (95 % interval of the median "
                             "3.90-4.70 ms, all at or below 5 ms; phases checks 0.00")


# ---------------------------------------------------------------------------------------------
# End to end (issue 27): every contender builds its inputs from the scenario's plain description
# inside the timed region.


def _tiny_llama() -> Any:
    from refplan.cli.bench import Scenario

    s = llama_scenario(layers=1, hidden=64, ffn=160, vocab=320)
    return Scenario(**{**s.__dict__, "rows": False})


def test_quick_bench_has_end_to_end_rows_for_every_contender(quick_report: dict[str, Any]) -> None:
    """``--quick`` times refplan (every policy) and every peer end to end on the Llama batches; a
    peer that is not installed says so in its row, never silently disappears."""
    from refplan.cli.bench import E2E_PEERS

    for scenario in ("llama-sync", "zero2-sync"):
        got = {r["contender"]: r for r in quick_report["e2e"] if r["scenario"] == scenario}
        assert {"refplan:balanced", *E2E_PEERS} == set(got), sorted(got)
        for key, row in got.items():
            if row["error"] is not None:
                assert key in E2E_PEERS and row["error"].startswith(("planner", "ImportError")), row
                continue
            assert row["oracle"] == "ok", row  # the peer planned the described problem, exactly
            assert row["e2e_seconds"] == pytest.approx(row["build_seconds"] + row["plan_seconds"])
            assert row["build_seconds"] > 0 and row["plan_seconds"] > 0 and row["gc_off_e2e_seconds"] > 0
            assert row["plan_only_seconds"] <= row["plan_seconds"]
            assert 0 < row["build_only_seconds"] <= row["build_seconds"]
        ours = got["refplan:balanced"]
        assert ours["verify_seconds"] > 0 and ours["segments"] > 0 and ours["lower_bound_ratio"] >= 1 - 1e-12
        # Every row counts the description's (parameter, location) holders: each of the 194
        # parameters is held by 16 source and 8 target locations (llama-sync: TP4xDP4 -> TP8) or by
        # 8 and 8 (zero2-sync: TP1xDP8 -> TP8).
        want = 194 * (16 + 8) if scenario == "llama-sync" else 194 * (8 + 8)
        assert {row["holders"] for row in got.values() if row["error"] is None} == {want}, scenario
    names = [t["target"] for t in quick_report["targets"]]
    assert any(n.startswith("llama-sync build+plan <=") for n in names), names
    assert any(n == "llama-sync: build per holder <= the cheapest peer's" for n in names), names
    assert any(n == "llama-sync: build <= 2 us per holder at the issue's machine speed" for n in names), names
    speed = quick_report["speed"]
    assert speed is None or speed["us"] is None or speed["us"] > 0, speed
    assert any(n == "zero2-sync verify <= plan" for n in names), names


def test_the_build_is_inside_the_timed_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refplan build that burns 30 ms of CPU shows up in the row's build and end-to-end seconds,
    once per round and GC setting: the bench times the build, not inputs made beforehand."""
    import time

    from refplan.cli import bench as bench_module

    calls = []
    real = bench_module.build_refplan

    def slow(layout: Any) -> Any:
        calls.append(1)
        start = time.process_time()
        while time.process_time() - start < 0.03:
            pass
        return real(layout)

    scenario = _tiny_llama()
    monkeypatch.setattr(bench_module, "build_refplan", slow)
    monkeypatch.setattr(bench_module, "E2E_MEASURED_SECONDS", 0.0)  # exactly --repeat rounds
    report = run_bench([scenario], repeat=2, peer=False, oracle=True)
    rows = {r.contender: r for r in report.e2e}
    assert set(rows) == {"refplan:balanced"}
    assert len(calls) == 2 * 2 + 1  # two rounds, GC as shipped and GC off; then the scenario's maps again
    for row in rows.values():
        assert row.rounds == 2 and row.oracle == "ok"
        assert row.build_seconds is not None and row.build_seconds >= 0.03
        assert row.e2e_seconds is not None and row.gc_off_e2e_seconds is not None
        assert row.e2e_seconds >= 0.03 and row.gc_off_e2e_seconds >= 0.03


def test_a_short_scenario_gets_more_end_to_end_rounds() -> None:
    """``--repeat`` rounds at least; a scenario whose shortest timed region is short gets rounds
    until that region adds up to about ``E2E_MEASURED_SECONDS``, at most ``E2E_MAX_ROUNDS``; one
    round stays one (it was also the last, whose plans were checked)."""
    from refplan.cli.bench import E2E_MAX_ROUNDS, E2E_MEASURED_SECONDS, e2e_round_count

    assert e2e_round_count(3, E2E_MEASURED_SECONDS) == 3  # a long region: --repeat
    assert e2e_round_count(3, E2E_MEASURED_SECONDS * 2) == 3
    assert e2e_round_count(3, E2E_MEASURED_SECONDS / 5) == max(3, min(E2E_MAX_ROUNDS, 5))
    assert e2e_round_count(3, E2E_MEASURED_SECONDS / 4.5) == max(3, min(E2E_MAX_ROUNDS, 5))  # rounded up
    assert e2e_round_count(3, E2E_MEASURED_SECONDS / 1000) == E2E_MAX_ROUNDS
    assert e2e_round_count(E2E_MAX_ROUNDS + 2, 1e-6) == E2E_MAX_ROUNDS + 2  # never fewer than asked
    assert e2e_round_count(1, 1e-6) == 1
    assert e2e_round_count(2, 0.0) == 2


def test_the_extra_rounds_are_run_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny scenario with ``--repeat 2`` and a round budget it cannot fill runs ``E2E_MAX_ROUNDS``
    rounds (each GC as shipped and GC off, each verified), and its row says so."""
    from refplan.cli import bench as bench_module

    scenario = _tiny_llama()  # described (and built once) before the count starts
    calls: list[int] = []
    real = bench_module.build_refplan

    def counted(layout: Any) -> Any:
        calls.append(1)
        return real(layout)

    monkeypatch.setattr(bench_module, "build_refplan", counted)
    monkeypatch.setattr(bench_module, "E2E_MEASURED_SECONDS", 1e9)
    monkeypatch.setattr(bench_module, "E2E_MAX_ROUNDS", 4)
    report = run_bench([scenario], repeat=2, peer=False, oracle=True)
    (row,) = report.e2e
    assert row.rounds == 4 and row.oracle == "ok", row
    assert len(calls) == 4 * 2 + 1  # four rounds x (GC on, GC off), then the scenario's maps again


def test_every_timed_build_is_a_first_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """No map of the description is alive when a contender builds it: the scenario's own maps
    (refplan's build of the same description) would turn every timed refplan build into memo
    lookups, which is not what a user's first build costs (moe-model with every shape distinct:
    0.3 s timed against 3 s cold). They come back, equal, after the rounds."""
    import weakref

    from refplan.cli import bench as bench_module

    scenario = bench_module.distinct_scenario(_tiny_llama())
    before = {name: (t.to_dict(), s.to_dict()) for name, (t, s) in scenario.pairs.items()}
    contents = [weakref.ref(m.content) for pair in scenario.pairs.values() for m in pair]
    alive_at_build: list[int] = []
    real = bench_module.build_refplan

    def watched(layout: Any) -> Any:
        alive_at_build.append(sum(ref() is not None for ref in contents))
        return real(layout)

    monkeypatch.setattr(bench_module, "build_refplan", watched)
    monkeypatch.setattr(bench_module, "E2E_MEASURED_SECONDS", 0.0)  # exactly --repeat rounds
    report = run_bench([scenario], repeat=2, peer=False, oracle=True)
    assert [r.oracle for r in report.e2e] == ["ok"]
    assert alive_at_build == [0] * 5, alive_at_build  # 2 rounds x (GC on, GC off), then the rebuild
    assert {name: (t.to_dict(), s.to_dict()) for name, (t, s) in scenario.pairs.items()} == before


def test_staged_splits_build_and_plan_and_restores_gc() -> None:
    import gc
    import time

    from refplan.cli.bench import _staged

    def burn(seconds: float) -> None:
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass

    seen = []

    def plan(built: str) -> str:
        seen.append(gc.isenabled())
        burn(0.02)
        return built + "!"

    def build() -> str:
        burn(0.01)
        return "x"

    stages, out = _staged(build, plan, True)
    assert out == "x!" and seen == [False] and gc.isenabled()
    assert stages.build >= 0.01 and stages.plan >= 0.02
    _staged(lambda: "y", plan, False)
    assert seen == [False, True]


def test_description_builds_the_scenarios_maps() -> None:
    """The plain description is the scenario: refplan's build of it is the scenario's maps, and a
    description that contradicts itself is refused with the project's error class."""
    from refplan.cli.bench import Side, build_refplan, moe_model_scenario

    for scenario in (llama_scenario(layers=2), zero2_scenario(layers=2), moe_model_scenario(2, 16)):
        assert scenario.layout is not None
        pairs, endpoints, sizes = build_refplan(scenario.layout)
        assert pairs.keys() == scenario.pairs.keys() and sizes == scenario.element_size
        for name, (t, s) in pairs.items():
            assert t.to_dict() == scenario.pairs[name][0].to_dict() and s.to_dict() == scenario.pairs[name][1].to_dict()
        assert dict(endpoints.target) == dict(scenario.endpoints.target)  # type: ignore[union-attr]
    with pytest.raises(InvalidMapError, match="must increase"):
        Side(0, ((4, 5), (0, 1)))
    with pytest.raises(InvalidMapError, match="one TP size"):
        Side(0, ((0, 1), (2,)))
    with pytest.raises(InvalidMapError, match="one location per replica"):
        Side(None, ((0, 1),))


def test_distinct_shapes_are_distinct_and_still_split_evenly() -> None:
    from refplan.cli.bench import distinct_scenario, moe_model_scenario

    for base in (llama_scenario(), moe_model_scenario(3, 16)):
        scenario = distinct_scenario(base)
        assert scenario.layout is not None and base.layout is not None
        shapes = [p.shape for p in scenario.layout.params]
        assert len(set(shapes)) == len(shapes) == len(base.layout.params)
        for p, q in zip(scenario.layout.params, base.layout.params):
            assert p.name == q.name and p.source is q.source and p.target is q.target
            for side in (p.source, p.target):
                if side.axis is not None:
                    assert p.shape[side.axis] % side.tp == 0, (p.name, p.shape)
        plans = plan_transfers(scenario.pairs, endpoints=scenario.endpoints, element_size=scenario.element_size)
        assert verify_plans(scenario.pairs, plans).ok


def test_scale_descriptions_have_the_stated_sizes() -> None:
    from refplan.cli.bench import dense70b_layout, moe_large_layout

    moe = moe_large_layout()
    assert len(moe.params) == 46_323
    assert len(moe.source_process) == 128 and len(moe.target_process) == 64
    expert = next(p for p in moe.params if ".experts." in p.name)
    assert len(expert.source.groups) == 4 and len(expert.target.groups) == 8  # EP32xDP4 -> EP8 x8
    dense = dense70b_layout()
    assert len(dense.source_process) == 256 and len(dense.target_process) == 64
    qkv = next(p for p in dense.params if p.name == "layers.79.attn.qkv")
    assert qkv.source.tp == 8 and len(qkv.source.groups) == 8 and min(qkv.source.locations()) == 192  # stage 3


def _case_problem(spec: str, scenario: Any) -> Any:
    """The adapter's own translation of the scenario's maps (what ``--planner`` and the old bench
    rows use), to hold the bench-local builders to."""
    from refplan.conformance.corpus import Case, Expect
    from refplan.conformance.peers import make_peer_adapter

    try:
        adapter: Any = make_peer_adapter(spec)
    except ValueError as exc:
        pytest.skip(str(exc))
    adapter.check_memory = False
    if hasattr(adapter, "one_world"):
        adapter.one_world = False
    ends = scenario.endpoints
    raw: dict[str, Any] = {
        "id": "bench", "why": "bench", "tags": [], "expect": {"outcome": "accept"},
        "parameters": {n: {"target": t.to_dict(), "source": s.to_dict()} for n, (t, s) in scenario.pairs.items()},
        "element_size": dict(scenario.element_size),
    }
    if "endpoints" in adapter.features:
        raw["endpoints"] = {"source": {str(k): v for k, v in ends.source.items()},
                            "target": {str(k): v for k, v in ends.target.items()}}
    return adapter, adapter.translate(Case("bench", "bench", "bench", (), raw, Expect("accept")))


def _small_scenarios() -> list[Any]:
    from refplan.cli.bench import moe_model_scenario

    return [llama_scenario(layers=1, hidden=64, ffn=160, vocab=320),
            zero2_scenario(layers=1, hidden=64, ffn=160, vocab=320), moe_model_scenario(1, 16)]


@pytest.mark.parametrize("spec", ["megatron-0.16", "megatron"])
def test_megatron_builder_is_the_adapters_metadata(spec: str) -> None:
    """Both Megatron versions build from the description exactly the ``ParameterMetadata`` the
    adapter builds from the maps (0.19.2: with the fields its worker is sent), so the bench charges
    each version the build of the very objects it plans from."""
    import dataclasses

    from refplan.cli.bench import megatron_doc, megatron_rosters

    for scenario in _small_scenarios():
        adapter, problem = _case_problem(spec, scenario)
        doc = megatron_doc(scenario.layout, replicated_tp=spec == "megatron")
        dst, src = megatron_rosters(doc, adapter._utils.ParameterMetadata, adapter._torch)

        def fields(metas: Any) -> list[dict[str, Any]]:
            return [dataclasses.asdict(m) for m in metas]

        assert [(r, [n for n, _ in ps]) for r, ps in problem["dst_by_rank"]] == [
            (r, list(by)) for r, by in sorted(dst.items())]
        for rank, params in problem["dst_by_rank"]:
            assert fields(m for _, m in params) == fields(dst[rank].values()), (scenario.name, rank)
        assert problem["src_lists"].keys() == src.keys()
        for name, metas in problem["src_lists"].items():
            assert fields(metas) == fields(src[name]), (scenario.name, name)


def test_awex_and_deepspeed_builders_are_the_adapters_inputs() -> None:
    """Awex's ``ParameterMeta``s and DeepSpeed's maps built from the description are the ones the
    adapter (Awex) and the existing conversion (DeepSpeed) make from refplan's maps."""
    from refplan.cli.bench import _awex_contender, _deepspeed_contender, deepspeed_planner

    for scenario in _small_scenarios():
        contender = _awex_contender(scenario.layout)
        if isinstance(contender, str):
            pytest.skip(contender)
        _adapter, problem = _case_problem("awex", scenario)
        _stages, timed = contender.run(False)
        built, _ops = timed.output  # with one rank's seconds (AwexAdapter.rank_seconds), which alone are charged
        assert (_stages.plan, _stages.plan_wall) == timed.planning_seconds
        for side in ("infer", "train"):
            assert [repr(m) for m in built[side]] == [repr(m) for m in problem[side]], (scenario.name, side)
        assert (built["infer_world"], built["train_world"]) == (problem["infer_world"], problem["train_world"])
        ds = deepspeed_planner()
        made = _deepspeed_contender(scenario.layout)
        if ds is None or isinstance(made, str):
            continue
        converted = ds[1](scenario.pairs)  # the existing conversion, through the dict form
        built_maps = made.run.args[0]()  # type: ignore[attr-defined]  # the contender's build stage alone
        assert built_maps.keys() == converted.keys()
        for name, (t, s) in converted.items():
            assert built_maps[name][0].to_dict() == t.to_dict() and built_maps[name][1].to_dict() == s.to_dict()


def test_dcp_contender_goes_through_the_front_door(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's DCP contender builds what DCP's users build -- every rank's state dict of DTensors
    (``DTensor.from_local``) and every source rank's ``DefaultSavePlanner`` local plan -- and plans
    with the coordinator's global plan and every target rank's ``DefaultLoadPlanner``, through the
    conformance adapter's own ``front_door``: its plans are the adapter's, and the oracle's exact."""
    from refplan.cli.bench import _dcp_contender
    from refplan.plan import TransferPlan

    scenarios = _small_scenarios()
    made = [_dcp_contender(s.layout) for s in scenarios]
    if any(isinstance(c, str) and c.startswith("planner") for c in made):
        pytest.skip(str(made[0]))
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.tensor import DTensor

    calls = {"save": 0, "load": 0, "from_local": 0}

    def counted(key: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[key] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(default_planner.DefaultSavePlanner, "create_local_plan",
                        counted("save", default_planner.DefaultSavePlanner.create_local_plan))
    monkeypatch.setattr(default_planner.DefaultLoadPlanner, "create_local_plan",
                        counted("load", default_planner.DefaultLoadPlanner.create_local_plan))
    monkeypatch.setattr(DTensor, "from_local", staticmethod(counted("from_local", DTensor.from_local)))
    for scenario, contender in zip(scenarios, made):
        assert not isinstance(contender, str), (scenario.name, contender)
        layout = scenario.layout
        holders = sum(len(side.locations()) for p in layout.params for side in (p.source, p.target))
        for key in calls:
            calls[key] = 0
        _stages, output = contender.run(False)
        # one DTensor per (parameter, holder), one local save plan per source rank, one load plan per target rank
        assert calls == {"save": len(layout.source_process), "load": len(layout.target_process),
                         "from_local": holders}, scenario.name
        problem, _raw = output.output
        # charged what a sync waits for: the slowest source rank's save plan as the build, the
        # coordinator's global plans and the slowest target rank's load plan as the plan
        assert output.build_seconds == problem.save_seconds and output.planning_seconds == (
            _stages.plan, _stages.plan_wall)
        assert 0 < _stages.build == problem.save_seconds[0]
        assert all(isinstance(v, DTensor) for state in problem.source_states + problem.target_states
                   for v in state.values())
        got = {n: p.to_dict() for n, p in contender.plans(output).items()}
        adapter, translated = _case_problem("dcp", scenario)  # the conformance adapter, from refplan's maps
        want = adapter.convert(translated, adapter.call_peer(translated))
        assert got == {n: TransferPlan.from_dict(p, n).to_dict() for n, p in want.items()}, scenario.name
        assert verify_plans(scenario.pairs, contender.plans(output)).ok, scenario.name


def test_dcp_layout_states_placements_or_says_why_not() -> None:
    """A description's side as DTensor placements: replica-major or shard-major meshes; a split
    torch's chunking does not make, or shards in no mesh order, are refused with the reason."""
    pytest.importorskip("torch.distributed.tensor")
    from refplan.cli.bench import Side, dcp_layout

    def stated(shape: tuple[int, ...], side: Side) -> Any:
        got = dcp_layout("w", "source", shape, side)
        return got if isinstance(got, str) else (got.ranks, got.mesh, got.shards)

    assert stated((8, 4), Side(0, ((0, 1), (2, 3)))) == ((0, 1, 2, 3), (2, 2), (None, 0))
    assert stated((8, 4), Side(1, ((0, 2), (1, 3)))) == ((0, 1, 2, 3), (2, 2), (1, None))
    assert stated((8, 4), Side(0, ((4, 5, 6, 7),))) == ((4, 5, 6, 7), (4,), (0,))
    assert stated((8, 4), Side(None, ((3,), (9,)))) == ((3, 9), (2,), (None,))
    uneven = stated((10, 4), Side(0, ((0, 1, 2, 3),)))  # torch: 3, 3, 3, 1; the description: 3, 3, 2, 2
    assert isinstance(uneven, str) and "[3, 3, 3, 1]" in uneven and "[3, 3, 2, 2]" in uneven
    assert "neither replica-major nor shard-major" in stated((8, 4), Side(0, ((1, 0),)))
    assert "neither replica-major nor shard-major" in stated((8, 4), Side(0, ((0, 2), (3, 5), (4, 6))))
    assert stated((6, 4), Side(0, ((0, 3), (1, 4), (2, 5)))) == ((0, 1, 2, 3, 4, 5), (2, 3), (0, None))
    # the contender's row says unsupported, with the reason, instead of timing something else
    from refplan.cli.bench import Layout, ParamSpec, _dcp_contender

    def row(source: Side, shape: tuple[int, ...] = (10, 4)) -> Any:
        locs = source.locations()
        return _dcp_contender(Layout((ParamSpec("w", shape, source, Side(None, ((0,),))),),
                                     {loc: i for i, loc in enumerate(locs)}, {0: len(locs)}))

    for got, why in ((row(Side(0, ((0, 1, 2, 3),))), "cuts 10 into [3, 3, 3, 1]"),
                     (row(Side(None, ((5000,),))), "a world of 5001 ranks")):
        if isinstance(got, str) and got.startswith("planner"):
            pytest.skip(got)
        assert isinstance(got, str) and got.startswith("unsupported: ") and why in got, got
    assert not isinstance(row(Side(0, ((0, 1), (2, 3))), (8, 4)), str)


def test_end_to_end_targets_are_judged_from_the_rows() -> None:
    from refplan.cli.bench import BenchReport, E2ERow, ScenarioSummary, _e2e_targets

    def row(scenario: str, contender: str, peer: str, build: float, plan: float, verify: float | None = None
            ) -> E2ERow:
        return E2ERow(scenario, contender, peer, peer, 1, build, plan, build + plan, build + plan, build + plan, plan,
                      build + plan, plan, verify, "ok",
                      round_verified=None if verify is None else (build, plan, verify))

    report = BenchReport(model={}, deepspeed=None, repeat=1)
    report.e2e = [
        row("llama-sync", "refplan:balanced", "refplan", 0.002, 0.003, 0.001),
        row("llama-sync", "awex", "awex", 0.001, 0.003),
        row("llama-sync", "dcp", "dcp", 0.002, 0.006),
        row("zero2-sync-distinct", "refplan:balanced", "refplan", 0.001, 0.002, 0.004),
        row("zero2-sync-distinct", "megatron", "megatron", 0.002, 0.002),
        row("moe-large", "refplan:balanced", "refplan", 0.5, 0.7, 0.9),
    ]
    report.e2e.append(row("llama-sync-distinct", "refplan:balanced", "refplan", 0.001, 0.0119, 0.0122))
    report.summaries.append(ScenarioSummary("llama-sync-distinct", "", 200, 0, 0, 0.0, (), 0.0, 0))
    # Item 1 is judged at the machine speed: Megatron-Core 0.16.1 at 101 us per parameter there.
    # Here it builds + plans 200 parameters in 20.2 ms (101 us each), so the limit is 60 us.
    report.e2e.append(row("llama-sync-distinct", "megatron-0.16", "megatron-0.16", 0.0102, 0.01))
    report.replicate = {"copies": [128, 1024], "shape": [4096, 4096], "build_seconds": {"128": 0.005, "1024": 0.06},
                        "build_plan_seconds": {"128": 0.01, "1024": 0.1}, "ratio": 12.0}
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    assert met["llama-sync build+plan <= 1x the fastest peer's build+plan"][0] is False  # 5 ms vs awex's 4
    assert "awex" in met["llama-sync build+plan <= 1x the fastest peer's build+plan"][1]
    assert met["zero2-sync-distinct build+plan <= 1x the fastest peer's build+plan"][0] is True
    assert met["llama-sync verify <= plan"][0] is True and met["zero2-sync-distinct verify <= plan"][0] is False
    assert met["moe-large build + plan + verify <= 2 s"][0] is False  # 2.1 s
    # Judged on one round's three stages: the best build + plan round (1.2 s) and the least verify
    # of another round (0.5 s) sum to a 1.7 s no run paid; that round's own verify took 0.9 s.
    mixed = dataclasses.replace(report.e2e[5], build_seconds=0.5, plan_seconds=0.7, e2e_seconds=1.2,
                                verify_seconds=0.5, rounds=2, round_verified=(0.5, 0.7, 0.9))
    judged = {t["target"]: t for t in _e2e_targets(dataclasses.replace(report, e2e=[mixed]))}
    assert judged["moe-large build + plan + verify <= 2 s"]["met"] is False
    assert "0.50 + 0.70 + 0.90 = 2.10 s CPU" in judged["moe-large build + plan + verify <= 2 s"]["detail"]
    unjudged = dataclasses.replace(mixed, round_verified=None)
    judged = {t["target"]: t for t in _e2e_targets(dataclasses.replace(report, e2e=[unjudged]))}
    assert judged["moe-large build + plan + verify <= 2 s"]["met"] is None
    assert met["linear replicate: 1024 copies <= 10x 128 copies"][0] is False
    assert "zero2-sync build+plan <= 1x the fastest peer's build+plan" not in met  # not run: not judged
    # Item 2, build per holder: judged only where the rows count the description's holders.
    assert not [t for t in met if "per holder" in t]
    report.e2e = [dataclasses.replace(r, holders={"llama-sync": 2000, "zero2-sync-distinct": 1000,
                                                  "moe-large": 100000}.get(r.scenario, 0)) for r in report.e2e]
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    per = "{}: build per holder <= the cheapest peer's"
    # 2 ms over 2000 holders is 1 us each, but awex built its own in 1 ms: 0.5 us each.
    assert met[per.format("llama-sync")] == (False, "refplan 2.0 ms for 2000 holders = 1.00 us each; the cheapest "
                                                    "peer's build: awex 0.50 us per holder")
    assert met[per.format("zero2-sync-distinct")][0] is True  # 1 us each, megatron 2 us each
    assert met[per.format("moe-large")] == (None, "refplan 500.0 ms for 100000 holders = 5.00 us each; "
                                                  "no peer built it")
    # The 2 us: judged at the machine speed, n/a without a speed reference.
    at = "{}: build <= 2 us per holder at the issue's machine speed"
    assert met[at.format("llama-sync")][0] is None and "not judged" in met[at.format("llama-sync")][1]
    report.speed = {"us": 303.0, "source": "megatron-core 0.16.1 on llama-sync"}  # 3x slower: the limit is 6 us
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    assert met[at.format("llama-sync")][0] is True  # 1 us
    assert met[at.format("moe-large")] == (True, "refplan 500.0 ms for 100000 holders = 5.00 us each; megatron-core "
                                                 "0.16.1 on llama-sync: 303.0 us per parameter here, 101 where the 2 "
                                                 "us were set, so the limit here is 6.00 us")
    report.speed = {"us": 101.0, "source": "x"}
    assert {t["target"]: t["met"] for t in _e2e_targets(report)}[at.format("moe-large")] is False  # 5 us > 2 us
    # Judged on each contender's best build stage of any round where the rows have it (as verify is
    # judged against the best plan stage), saying so beside the build of the best build+plan round.
    best = {("moe-large", "refplan"): 0.15, ("zero2-sync-distinct", "refplan"): 0.0001,
            ("zero2-sync-distinct", "megatron"): 0.0015}
    report.e2e = [dataclasses.replace(r, build_only_seconds=best.get((r.scenario, r.peer))) for r in report.e2e]
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    assert met[at.format("moe-large")] == (True, "refplan 150.0 ms for 100000 holders = 1.50 us each (the best build "
                                                 "of 1 rounds, each contender's alike; 500.0 ms in the round of its "
                                                 "best build+plan); x: 101.0 us per parameter here, 101 where the 2 "
                                                 "us were set, so the limit here is 2.00 us")
    assert met[per.format("zero2-sync-distinct")] == (True, "refplan 0.1 ms for 1000 holders = 0.10 us each (the best "
                                                            "build of 1 rounds, each contender's alike; 1.0 ms in the "
                                                            "round of its best build+plan); the cheapest peer's "
                                                            "build: megatron 1.50 us per holder")
    report.speed = None
    # 11.9 ms and 12.2 ms over 200 parameters: 59.5 and 61 us each.
    item1 = "llama-sync-distinct: {} in <= 60 us per parameter at the issue's machine speed"
    planned = met[item1.format("planned")]
    assert planned[0] is True and planned[1].startswith("11.9 ms for 200 parameters = 59.5 us each here; ")
    assert "planned it in its end-to-end row (no speed probe ran) at 101.0 us each" in planned[1], planned[1]
    assert "the limit here is 60.0 us" in planned[1], planned[1]
    assert met[item1.format("verified")][0] is False
    # A machine twice as slow (the peer at 202 us each) doubles the limit; without the peer, n/a.
    slower = [r for r in report.e2e if r.contender != "megatron-0.16"]
    report.e2e = [*slower, row("llama-sync-distinct", "megatron-0.16", "megatron-0.16", 0.0204, 0.02)]
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    assert met[item1.format("verified")][0] is True and "the limit here is 120.0 us" in met[item1.format("verified")][1]
    # With the speed probe of the same rounds (heap frozen), the limit comes from it, not from the
    # peer's own end-to-end row, which pays the bench's heap in its collections (an outside audit:
    # 134 us there against 104 in the probe made the limit a third looser).
    probed = [dataclasses.replace(r, speed_us=104.0) if r.contender == "refplan:balanced"
              and r.scenario == "llama-sync-distinct" else r for r in report.e2e]
    report.e2e = [*probed, row("llama-sync-distinct", "megatron-0.16", "megatron-0.16", 0.0204, 0.02)]
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    detail = met[item1.format("verified")][1]
    assert "llama-sync in the speed probe of these rounds at 104.0 us each" in detail, detail
    assert "the limit here is 61.8 us" in detail and met[item1.format("verified")][0] is True, detail
    report.e2e = slower
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    assert met[item1.format("planned")][0] is None and "did not run" in met[item1.format("planned")][1]


def test_the_build_line_is_scaled_by_the_speed_probed_in_its_own_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-holder build line's limit is scaled by the reference peer's speed timed in the same
    rounds as the build (``E2ERow.speed_us``), not by one reading taken minutes away; a probe that
    fails gives no reference (the run's own, or n/a), never a number."""
    import gc

    from refplan.cli import bench as bench_module
    from refplan.cli.bench import BenchReport, Contender, E2ERow, Stages, _e2e_rounds, _e2e_targets

    scenario = _tiny_llama()
    layout = scenario.layout
    bound = load_lower_bound(collect_requests(scenario.pairs, endpoints=scenario.endpoints,
                                              element_size=scenario.element_size))
    refplan = bench_module._refplan_contender(layout, "balanced", POLICIES["balanced"], 1 << 20)
    times = iter([0.030, 0.020, 0.025, 0.021, 0.050, 0.040])
    calls: list[int] = []

    def probed(_gc_off: bool) -> tuple[Stages, Any]:
        calls.append(gc.get_freeze_count())  # the bench's heap frozen: not what the probe's collector scans
        build = next(times)
        return Stages(build, 0.001, build, 0.001), object()

    probe = Contender("megatron-0.16", "megatron-0.16", "megatron-core 0.16.1", probed, lambda _out: {})
    monkeypatch.setattr(bench_module, "E2E_MEASURED_SECONDS", 0.0)  # exactly two rounds
    rows = _e2e_rounds(scenario, layout, [refplan], {}, 2, oracle=False, bound=bound, probe=(probe, 200))
    assert len(calls) == 2 * bench_module.SPEED_PROBES and min(calls) > 0 and gc.get_freeze_count() == 0
    assert [r.speed_us for r in rows] == [pytest.approx((0.020 + 0.001) / 200 * 1e6)]  # the best probe: 105 us

    def failing(_gc_off: bool) -> tuple[Stages, Any]:
        raise RuntimeError("the peer broke")

    broken = Contender("megatron-0.16", "megatron-0.16", "megatron-core 0.16.1", failing, lambda _out: {})
    again = _e2e_rounds(scenario, layout, [refplan], {}, 2, oracle=False, bound=bound, probe=(broken, 200))
    assert [r.speed_us for r in again] == [None]

    at = "moe: build <= 2 us per holder at the issue's machine speed"
    report = BenchReport(model={}, deepspeed=None, repeat=1)
    report.speed = {"us": 101.0, "source": "llama-sync's rows"}  # there, 3 us per holder is over 2
    report.e2e = [E2ERow("moe", "refplan:balanced", "refplan", "balanced", 1, 0.3, 0.1, 0.4, holders=100000)]
    assert {t["target"]: t["met"] for t in _e2e_targets(report)}[at] is False
    report.e2e = [dataclasses.replace(report.e2e[0], speed_us=202.0)]  # its rounds ran at half the speed
    met = {t["target"]: (t["met"], t["detail"]) for t in _e2e_targets(report)}
    assert met[at][0] is True and "limit here is 4.00 us" in met[at][1], met[at]
    assert "best of 3 runs in each of this scenario's rounds" in met[at][1], met[at]


def test_the_rounds_keep_one_rounds_build_plan_and_verify_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """``E2ERow.round_verified`` is the round with the least build + plan + verify, its three
    stages as that round paid them: the best build + plan round (round 0 here) and the least
    verify (round 1's) are not summed, as the moe-large line did before."""
    from refplan.cli import bench as bench_module
    from refplan.cli.bench import Contender, Stages, _e2e_rounds

    scenario = _tiny_llama()
    assert scenario.oracle
    layout = scenario.layout
    bound = load_lower_bound(collect_requests(scenario.pairs, endpoints=scenario.endpoints,
                                              element_size=scenario.element_size))
    plans = plan_transfers(scenario.pairs, endpoints=scenario.endpoints, element_size=scenario.element_size)
    stages = iter([(0.5, 0.7), (0.5, 0.7), (0.6, 0.8), (0.6, 0.8)])  # per round: GC on, then off

    def run(_gc_off: bool) -> tuple[Stages, Any]:
        build, plan = next(stages)
        return Stages(build, plan, build, plan), (scenario.pairs, plans)

    verifies = iter([0.9, 0.3])
    real_timed = bench_module._timed

    def timed(fn: Any) -> tuple[float, float, Any]:
        _cpu, wall, value = real_timed(fn)
        return next(verifies), wall, value

    monkeypatch.setattr(bench_module, "_timed", timed)
    monkeypatch.setattr(bench_module, "E2E_MEASURED_SECONDS", 0.0)  # exactly two rounds
    fake = Contender("refplan:balanced", "refplan", "balanced", run, lambda made: made[1])
    rows = _e2e_rounds(scenario, layout, [fake], {}, 2, oracle=True, bound=bound)
    (row,) = rows
    assert row.rounds == 2 and row.e2e_seconds == pytest.approx(1.2) and row.verify_seconds == pytest.approx(0.3)
    assert row.round_verified == pytest.approx((0.6, 0.8, 0.3))  # 1.7 s against round 0's 2.1 s, not 1.5 s
    assert row.oracle == "ok"


def test_speed_reference_reads_the_rows_or_measures_the_peer() -> None:
    """Megatron-Core 0.16.1's build + plan of llama-sync per parameter: from the end-to-end rows when
    they have it (either form), else measured; without peers, none."""
    from refplan.cli.bench import BenchReport, E2ERow, ScenarioSummary, speed_reference

    report = BenchReport(model={}, deepspeed=None, repeat=1)
    assert speed_reference(report, False) is None
    report.summaries.append(ScenarioSummary("llama-sync-distinct", "", 194, 0, 0, 0.0, (), 0.0, 0))
    report.e2e.append(E2ERow("llama-sync-distinct", "megatron-0.16", "megatron-0.16", "megatron-core 0.16.1", 1,
                             0.01, 0.0094, 0.0194))
    got = speed_reference(report, False)
    assert got is not None and got["us"] == pytest.approx(100.0) and "llama-sync-distinct" in got["source"]
    measured = speed_reference(BenchReport(model={}, deepspeed=None, repeat=1), True, rounds=1)
    assert measured is not None
    if measured["us"] is None:  # the peer is not installed here: said so, never a number
        assert "megatron" in measured["source"]
    else:
        assert measured["us"] > 0 and "measured for this reference" in measured["source"]


def test_replicate_scaling_measures_both_sizes() -> None:
    from refplan.cli.bench import replicate_scaling

    got = replicate_scaling(1, copies=(2, 8))
    assert set(got["build_seconds"]) == {"2", "8"} and got["ratio"] > 0
    assert all(v > 0 for v in got["build_plan_seconds"].values())


def test_a_peer_whose_plan_is_wrong_gets_an_error_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer's answer that cannot be the described sync (a copy from a rank that does not hold the
    parameter) is that peer's row, said as wrong, never a crash of the bench nor a timed success."""
    from refplan.cli import bench as bench_module

    real = bench_module._e2e_contenders

    def with_a_wrong_peer(*args: Any, **kwargs: Any) -> Any:
        contenders, missing = real(*args, **kwargs)

        def wrong(_output: Any) -> Any:
            raise bench_module.UnsupportedLayoutError("reads parameter 'x' from rank 12, which does not hold it")

        fake = bench_module.Contender("megatron-0.16", "megatron-0.16", "fake megatron",
                                      lambda gc_off: (bench_module.Stages(0.001, 0.001, 0.001, 0.001), None), wrong)
        return [*contenders, fake], missing

    scenario = _tiny_llama()
    monkeypatch.setattr(bench_module, "_e2e_contenders", with_a_wrong_peer)
    report = run_bench([scenario], repeat=1, peer=False)
    rows = {r.contender: r for r in report.e2e}
    assert rows["megatron-0.16"].error is not None and rows["megatron-0.16"].error.startswith("wrong plan: reads")
    assert rows["megatron-0.16"].e2e_seconds is None
    assert rows["refplan:balanced"].oracle == "ok"


# -- judged figures and their statistics (an outside audit, 2026-12-06; each failed before) --------


def test_every_judged_figure_shows_its_side_of_the_limit() -> None:
    from refplan.cli import bench

    assert bench._judged(1.003, 1.0, False) == "1.003"  # was "1.00x" beside NOT MET
    assert bench._judged(59.5, 60.0, True, 1) == "59.5"
    text = bench._interval_text(1.2502, 1.27, 1.25)
    assert "x1.2502-x1.27, all above x1.25" in text, text  # was "x1.25-x1.27, all above x1.25"


def test_paired_ratios_judge_only_finite_positive_pairs_and_say_how_many() -> None:
    from refplan.cli import bench

    stats = bench.paired_ratios([1.0, 2.0, float("nan"), 1.5, 1.2, 1.1, 1.3], [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    assert stats["pairs"] == 5 and stats["median"] == 1.2, stats  # NaN and the zero raw time left out
    assert stats["best"] == 1.0
    assert bench._pairs_text(stats, 7) == "5 of 7" and bench._pairs_text({"pairs": 7}, 7) == "7"


def test_the_cross_check_ratio_is_the_best_rounds_plan_plus_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ratio added the best plan of one round to the best verify of another (reads low)."""
    from refplan.cli import bench

    class _Verdict:
        ok = True

    times = iter([1.0, 0.10, 0.50,   # round 1: DeepSpeed, plan, verify
                  1.0, 0.50, 0.10])  # round 2: the best plan and the best verify, in different rounds
    monkeypatch.setattr(bench, "_timed", lambda fn: (next(times), 0.0, _Verdict()))
    small = big = bench.Scenario("x", "x", {}, None, {})
    out = bench._cross_check(big, small, ("deepspeed", lambda pairs: pairs, lambda converted: {}), 2)
    assert out["ratio"] == pytest.approx(0.6) and out["plan_verify_seconds"] == pytest.approx(0.6)
    assert (out["plan_seconds"], out["oracle_seconds"]) == (0.10, 0.10)  # each part's own best, beside it
