"""What an executor call costs before its verdict on schedules of many small pieces (issue 26, item 6).

Launches 4 gloo processes on this machine and, per case, runs ``execute_transfers`` once and
prints the slowest process's time: the whole call when it moved (and how much of it came before
the verdict), or the time until ``TransferRejectedError`` when it was refused (with the start of
its message). The cases are the ones the issue measured:

- ``segments``: 10^5 one-element segments, each process sending to the next (one parameter);
- ``one-element``: the bench's ZeRO-2 4-layer batch (DP2 -> TP2, processes 0-1 -> 2-3) with a
  staging budget of one bf16 element per peer (refused by ``max_chunks`` alone);
- ``64-bytes``: the same batch with ``bytes_per_peer=64``;
- ``one-element-small``, ``64-bytes-small``: the same 4-layer model at hidden 64 (about 2**17
  elements per sending process), so that the schedule is within ``max_chunks``: only the work
  bound (``StagingBudget.max_work``) stands in its way; ``64-bytes-small-unbounded`` runs it
  with that bound (and ``max_rounds``) lifted, to show what the bound saves (not in the default list).

A measuring aid for docs/performance.md and the issue, not a test: timings belong here.

    .venv/bin/python scripts/executor_costs.py [CASE ...]
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any

CASES = ("segments", "one-element", "64-bytes", "one-element-small", "64-bytes-small")


def _segments_plan(count: int) -> tuple[Any, Any]:
    from refplan import TransferEndpoints, TransferPlan, TransferSegment

    # Location p (process p) holds count // 4 elements and sends each alone to location (p + 1) % 4.
    per = count // 4
    segments = tuple(
        TransferSegment(p, i, (1,), (p + 1) % 4, i, (1,), (1,)) for p in range(4) for i in range(per)
    )
    plan = TransferPlan(segments, (4 * per,), 4 * per)
    return {"w": plan}, TransferEndpoints({p: p for p in range(4)}, {p: p for p in range(4)})


def _case(name: str, rank: int) -> dict[str, Any]:
    import torch

    from refplan.cli.bench import BF16, POLICIES, _marker_shards, _model_pairs, _sync_layouts
    from refplan.execute import StagingBudget, TransferRejectedError, execute_transfers
    from refplan.planner import plan_transfers

    if name == "segments":
        plans, endpoints = _segments_plan(100_000)
        per = plans["w"].logical_shape[0] // 4
        sources = {"w": {rank: torch.arange(per, dtype=torch.float32)}}
        targets = {"w": {rank: torch.zeros(per, dtype=torch.float32)}}
        dtypes = {"w": torch.float32}
        budget = StagingBudget()
    else:
        pairs, endpoints = _sync_layouts()["zero2 DP2 -> TP2 (procs 0-1 -> 2-3)"]
        if "-small" in name:
            pairs = _model_pairs(1, 2, 2, layers=4, hidden=64, ffn=172, vocab=500)
        plans = plan_transfers(pairs, endpoints=endpoints, element_size=dict.fromkeys(pairs, BF16),
                               replica_policy=POLICIES["balanced"])
        dtype = torch.bfloat16
        sources, expected = _marker_shards(pairs, endpoints, rank, dtype)
        targets = {n: {loc: torch.empty(b.shape, dtype=dtype) for loc, b in per_loc.items()}
                   for n, per_loc in expected.items()}
        dtypes = dict.fromkeys(plans, dtype)
        budget = StagingBudget(2) if name.startswith("one-element") else StagingBudget(64)
        if name.endswith("-unbounded"):  # what the work bound saves: the same schedule, run
            budget = StagingBudget(budget.bytes_per_peer, max_rounds=1 << 20, max_work=1 << 40)
    started = time.perf_counter()
    try:
        stats = execute_transfers(plans, sources, targets, endpoints, dtypes=dtypes, budget=budget,
                                  timeout=timedelta(seconds=600))
    except TransferRejectedError as exc:
        return {"refused": True, "seconds": time.perf_counter() - started, "message": str(exc)}
    return {"refused": False, "seconds": stats.seconds, "before_move": stats.seconds - stats.move_seconds,
            "rounds": stats.rounds, "chunks": stats.chunks}


def main(argv: list[str]) -> int:
    from refplan.cli.sync import run_ranks

    for name in argv or list(CASES):
        outcomes = run_ranks(lambda rank, _world, n=name: _case(n, rank), 4, timeout=timedelta(seconds=900),
                             deadline_s=1800)
        bad = [o for o in outcomes if not o.ok]
        if bad:
            print(f"{name}: process {bad[0].rank} failed: {bad[0].error}")
            continue
        values = [o.value for o in outcomes]
        slowest = max(v["seconds"] for v in values)
        if values[0]["refused"]:
            print(f"{name}: refused after {slowest:.2f} s (slowest process): {values[0]['message'][:300]}")
        else:
            before = max(v["before_move"] for v in values)
            print(f"{name}: done in {slowest:.2f} s (slowest process; {before:.2f} s before the move), "
                  f"rounds {max(v['rounds'] for v in values)}, chunks {max(v['chunks'] for v in values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
