"""Time planning and validation of layouts replicated over many locations, one process.

Why a script and not a bench target: these are the k² cases the twenty-seventh session removed
(docs/performance.md, "Growth, races and k² at scale"); no peer planner takes a description of
them, so there is nothing to time beside. Each row builds its maps from the description it
names, then plans (and, where said, verifies) — what a user pays for that layout. Run it against
another checkout with ``PYTHONPATH=<checkout>`` to time the code before a change in the same way.

    .venv/bin/python scripts/replication_scaling.py [--quick] [--scenario NAME ...]

``--scenario`` also plans named bench scenarios with ``split_balanced`` (maps built once, before
timing; median of 3): its grouping of shared holders is felt there too (docs/performance.md,
"split_balanced at large replication").
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import refplan
from refplan import contiguous_split_map, replicated_map
from refplan.errors import AffineTransferError
from refplan.planner import plan_transfers
from refplan.policies import POLICIES


def _timed(what: str, run: Callable[[], object]) -> None:
    started = time.perf_counter()
    try:
        run()
        result = f"{time.perf_counter() - started:.2f} s"
    except AffineTransferError as exc:
        result = f"refused after {time.perf_counter() - started:.2f} s ({str(exc)[:60]})"
    print(f"  {what}: {result}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smaller sizes only")
    parser.add_argument("--scenario", action="append", default=[], metavar="NAME",
                        help="also plan this bench scenario with split_balanced (repeatable)")
    args = parser.parse_args()
    quick = args.quick
    print(f"refplan from {os.path.dirname(refplan.__file__)}; load average {os.getloadavg()[0]:.2f}")
    from torch.distributed.tensor import Replicate

    from refplan.interop import from_dtensor

    for k in (16384,) if quick else (16384, 65536):
        _timed(f"from_dtensor((8, 8), ({k},), [Replicate()])", lambda k=k: from_dtensor((8, 8), (k,), [Replicate()]))
    source = contiguous_split_map((4096, 8), [64] * 64, 0)
    for k in (1024,) if quick else (1024, 4096):
        _timed(f"broadcast: replicated_map((4096, 8), {k}) from 64 row slabs, built and planned",
               lambda k=k: plan_transfers({"w": (replicated_map((4096, 8), k), source)}))
    k = 1024 if quick else 4096
    for name in sorted(POLICIES):
        _timed(f"replicated_map(({4 * k}, 8), {k}) into {k} row shards, built and planned, {name}",
               lambda name=name: plan_transfers(
                   {"w": (contiguous_split_map((4 * k, 8), [4] * k, 0), replicated_map((4 * k, 8), k))},
                   replica_policy=POLICIES[name], element_size=2))
    if args.scenario:
        from refplan.cli.bench import SCENARIOS

        for name in args.scenario:
            s = SCENARIOS[name]()
            times = []
            for _ in range(3):
                started = time.perf_counter()
                plan_transfers(s.pairs, endpoints=s.endpoints, element_size=s.element_size,
                               process_node=s.process_node, replica_policy=POLICIES["split_balanced"])
                times.append(time.perf_counter() - started)
            print(f"  bench scenario {name}, planned with split_balanced: {sorted(times)[1]:.2f} s (median of 3)",
                  flush=True)


if __name__ == "__main__":
    main()
