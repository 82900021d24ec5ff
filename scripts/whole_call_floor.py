"""The floor under the whole call's ratio to raw ``all_to_all_single`` (issue 26, item 8a).

On the ``--sync`` bench's 272.6 MiB batch (``refplan.cli.bench.WHOLE_LAYOUT``, balanced plan,
processes 0-1 -> 2-3), each process replays the executor's own schedule with nothing around it
(``refplan.cli.bench._floor``, which ``refplan bench --sync`` prints as ``call/floor``): the same
messages (pieces, tags, rounds, two staging slots per queue, a round reusing a slot only after
the round before it on that slot has completed) posted straight on the process group, views made
once outside the timed region, no checks, no verdict, no outcome, no timeouts. Five kinds,
interleaved in one launch, each after a barrier, the order reversing every run:

- ``raw``: ``all_to_all_single`` of the same per-pair bytes (what (a) is judged against);
- ``messages``: the replay without the packing and unpacking copies (wrong data: a count of
  what the executor's messages and rounds cost by themselves);
- ``copies``: the replay with them: the least any sync that keeps this schedule pays, since the
  layout needs one copy of every strided row;
- ``move``: the executor's own transport (``transport._move``) on the schedule of its warm call,
  without the checks and agreements around it, and without packing ahead during the verdict;
- ``executor``: a warm ``execute_transfers`` call, outcome on.

The replay with its copies (on zeroed staging and targets of its own) and the executor each have
every target element checked before and after the timed runs.

Prints each kind's median (slowest process per run) and its median per-run ratio to raw.
Why: it separates what the layout costs (the copy) from what the executor adds around it
(checks, the verdict and outcome agreements, its own Python), which docs/performance.md
("The floor under (a)") reads off it. A measuring aid, not a test.

    .venv/bin/python scripts/whole_call_floor.py [--runs N] [--layers L]

``--layers`` replaces the batch by the same model at L layers (10 is the bench's batch).
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta
from typing import Any

KINDS = ("raw", "messages", "copies", "move", "executor")


def _work(runs: int, layers: int | None) -> Any:
    def work(rank: int, world: int) -> dict[str, list[Any]]:
        import numpy as np
        import torch
        import torch.distributed as dist

        from refplan.cli import bench
        from refplan.cli.sync import bits_of
        from refplan.execute import execute_transfers, transport

        whole = bench._warm_whole_call(rank, layers)
        plans, apart, sources, expected, targets, dtypes, timeout = (
            whole.plans, whole.endpoints, whole.sources, whole.expected, whole.targets, whole.dtypes, whole.timeout)
        warm, moved, dtype = whole.stats, whole.sched, torch.bfloat16  # moved: for its transport alone (``move``)
        floor_targets = bench._blank_targets(expected, dtype)
        replays = {"messages": bench._floor(plans, apart, sources, floor_targets, dtypes, copies=False),
                   "copies": bench._floor(plans, apart, sources, floor_targets, dtypes)}

        def check(kind: str, landed: dict[str, dict[int, Any]]) -> None:
            for name, per in expected.items():
                for loc, want in per.items():
                    if not np.array_equal(bits_of(landed[name][loc]), want):
                        raise AssertionError(f"{kind}: process {rank}'s target {name}[{loc}] is wrong")
                    landed[name][loc].view(torch.int16).fill_(-1)

        sends_b, receives_b, out_buf, in_buf = bench._raw_buffers(warm, world)
        dist.all_to_all_single(out_buf, in_buf, receives_b, sends_b)
        check("the warm executor call", targets)
        replays["copies"]()
        check("the replay with its copies", floor_targets)
        times: dict[str, list[Any]] = {kind: [] for kind in (*KINDS, "phases")}
        for run in range(runs):
            for kind in KINDS if run % 2 == 0 else KINDS[::-1]:
                dist.barrier()
                started = time.perf_counter()
                if kind == "raw":
                    dist.all_to_all_single(out_buf, in_buf, receives_b, sends_b)
                elif kind == "executor":
                    stats = execute_transfers(plans, sources, targets, apart, dtypes=dtypes, timeout=timeout)
                    times["phases"].append(dict(stats.phases))
                elif kind == "move":
                    transport._move(whole.ctx, moved, timeout)
                else:
                    replays[kind]()
                times[kind].append(time.perf_counter() - started)
        # Checked once more, each alone, after the timed runs rather than after each: a check
        # reads and rewrites every target, which would leave the caches cold for the next kind.
        for kind in ("copies", "executor"):
            dist.barrier()
            if kind == "copies":
                replays["copies"]()
                check(f"{kind} after the timed runs", floor_targets)
            else:
                execute_transfers(plans, sources, targets, apart, dtypes=dtypes, timeout=timeout)
                check(f"{kind} after the timed runs", targets)
        return times

    return work


def main(argv: list[str] | None = None) -> int:
    from refplan.cli.sync import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--layers", type=int, default=None, help="the model at this many layers (10: the bench's)")
    args = parser.parse_args(argv)
    outcomes = run_ranks(_work(args.runs, args.layers), 4, backend="gloo", timeout=timedelta(seconds=600))
    failed = [o for o in outcomes if not o.ok]
    if failed:
        for o in failed:  # the first to fail raised; the others lost it
            print(f"process {o.rank} failed: {(o.error or '').splitlines()[0]}")
        return 1
    slowest = {kind: [max(o.value[kind][i] for o in outcomes) for i in range(args.runs)] for kind in KINDS}
    for kind in KINDS:
        ratio = statistics.median(a / b for a, b in zip(slowest[kind], slowest["raw"]))
        print(f"{kind:<9} median {statistics.median(slowest[kind]) * 1e3:7.1f} ms, "
              f"median per-run ratio to raw x{ratio:.2f}")
    def phase(name: str) -> float:
        return float(statistics.median(max(o.value["phases"][i][name] for o in outcomes) for i in range(args.runs)))

    print("executor phases, slowest process of each run, median: "
          + ", ".join(f"{name} {phase(name) * 1e3:.2f} ms" for name in outcomes[0].value["phases"][0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
