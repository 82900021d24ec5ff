"""Where the whole call's excess over raw ``all_to_all_single`` goes, in CPU (issue 26, item 8a).

On the ``--sync`` bench's 272.6 MiB batch (``refplan.cli.bench.WHOLE_LAYOUT``, balanced plan,
processes 0-1 -> 2-3), each process times, per call, wall time, its CPU (``time.process_time``:
every thread) and its own thread's CPU (``time.thread_time``) for three things interleaved in
one launch, each after a barrier, the order reversing every run: a warm ``execute_transfers``
call, raw ``all_to_all_single`` of the same per-pair bytes, and the executor with packing
switched off (``transport._pack`` made a no-op: wrong data, for the count only). Prints each
process's medians and the call's phases.

``--two``: the same bytes with a core per process on this 2-core machine: 2 processes, one
holding both sources, the other both targets (no packing-off row).

A measuring aid for docs/performance.md ("Where (a)'s excess goes"), not a test: no target element
is checked here (the bench checks them; the packing-off row lands wrong data on purpose).

    .venv/bin/python scripts/whole_call_cpu.py [--runs N] [--two]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta
from typing import Any


def _work(runs: int, two: bool) -> Any:
    def work(rank: int, world: int) -> dict[str, list[tuple[float, float, float, dict[str, float]]]]:
        import torch
        import torch.distributed as dist

        import refplan.execute.transport as transport
        from refplan.cli import bench
        from refplan.execute import execute_transfers
        from refplan.planner import plan_transfers
        from refplan.policies import POLICIES
        from refplan.requests import TransferEndpoints

        pairs, apart = bench._raw_layouts()[bench.WHOLE_LAYOUT]
        dtype = torch.bfloat16
        endpoints = TransferEndpoints({0: 0, 1: 0}, {0: 1, 1: 1}) if two else apart
        sources: dict[str, dict[int, Any]] = {}
        expected: dict[str, dict[int, Any]] = {}
        for sub in ((0, 1) if rank == 0 else (2, 3)) if two else (rank,):
            got_sources, got_expected = bench._marker_shards(pairs, apart, sub, dtype)
            for name, per in got_sources.items():
                sources.setdefault(name, {}).update(per)
            for name, per in got_expected.items():
                expected.setdefault(name, {}).update(per)
        plans = plan_transfers(pairs, endpoints=endpoints, element_size=dict.fromkeys(pairs, bench.BF16),
                               replica_policy=POLICIES["balanced"])
        dtypes = dict.fromkeys(plans, dtype)
        targets = bench._blank_targets(expected, dtype)
        timeout = timedelta(seconds=120)
        warm = execute_transfers(plans, sources, targets, endpoints, dtypes=dtypes, timeout=timeout)
        sends, receives, out_buf, in_buf = bench._raw_buffers(warm, world)
        dist.all_to_all_single(out_buf, in_buf, receives, sends)
        packing = transport._pack
        kinds = ("executor", "raw") if two else ("executor", "raw", "packing off")
        res: dict[str, list[tuple[float, float, float, dict[str, float]]]] = {k: [] for k in kinds}
        for i in range(runs):
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                dist.barrier()
                wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
                phases: dict[str, float] = {}
                if kind == "raw":
                    dist.all_to_all_single(out_buf, in_buf, receives, sends)
                else:
                    transport._pack = packing if kind == "executor" else (lambda *a: None)
                    try:
                        stats = execute_transfers(plans, sources, targets, endpoints, dtypes=dtypes, timeout=timeout)
                    finally:
                        transport._pack = packing
                    phases = dict(stats.phases)
                res[kind].append((time.perf_counter() - wall, time.process_time() - cpu,
                                  time.thread_time() - own, phases))
        return res

    return work


def main(argv: list[str] | None = None) -> int:
    from refplan.cli.sync import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--two", action="store_true", help="2 processes, a core each")
    args = parser.parse_args(argv)
    outcomes = run_ranks(_work(args.runs, args.two), 2 if args.two else 4, backend="gloo",
                         timeout=timedelta(seconds=600))
    failed = [o for o in outcomes if not o.ok]
    if failed:
        print(f"process {failed[0].rank} failed: {failed[0].error}")
        return 1
    for o in outcomes:
        for kind, rows in o.value.items():
            wall, cpu, own = (statistics.median(row[j] for row in rows) * 1e3 for j in range(3))
            phases = ", ".join(f"{p} {statistics.median(row[3][p] for row in rows) * 1e3:.2f}"
                               for p in rows[0][3])
            print(f"process {o.rank} {kind:<12} wall {wall:6.1f} ms, CPU {cpu:5.1f} ms (own thread {own:5.1f})"
                  + (f"; phases ms: {phases}" if phases else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
