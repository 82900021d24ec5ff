"""A store agreement against a 2-word ``all_reduce(MAX)`` as the group grows (issue 26, item 8c).

Launches N gloo processes on this machine (default 4 8 16 32) and, in each, times ``agree_max``
on a clone of the world's store (what the executor does on a linked group) and the all-reduce it
replaces, back to back after 10 warm ones, twice each, alternating. Prints the slowest process's
wall time per agreement and the CPU of all processes summed (the store server's, in this
launching process, not counted). This is what ``refplan.execute.agree._STORE_MAX_PROCESSES``
rests on (docs/performance.md, "Protocol 7"). ``store-uniform`` is the outcome's agreement since
protocol 8 (one word, the same on every process that finished: no records exchanged). A measuring
aid, not a test.

    .venv/bin/python scripts/agree_scaling.py [N ...] [--ops K]
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any


def _work(ops: int) -> Any:
    def work(rank: int, world: int) -> dict[str, tuple[float, float]]:
        import torch
        import torch.distributed as dist

        from refplan.execute import agree

        world_group: Any = dist.group.WORLD
        store: Any = dist.distributed_c10d._get_process_group_store(world_group)
        store = store.clone()  # a connection of its own, as the executor's link has
        link = agree._Link(store, "scripts/agree_scaling", world, rank)
        uniform = agree._Link(store, "scripts/agree_scaling/uniform", world, rank)
        words = torch.zeros(2, dtype=torch.int64)

        def by_store() -> None:
            agree.agree_max(link, [rank, 0], timedelta(seconds=60))

        def by_store_uniform() -> None:  # the outcome's agreement: one word, the same on every process
            agree.agree_max(uniform, [0], timedelta(seconds=60), uniform=True)

        def by_all_reduce() -> None:
            dist.all_reduce(words, op=dist.ReduceOp.MAX)

        out: dict[str, tuple[float, float]] = {}
        for name, once in (("all_reduce", by_all_reduce), ("store", by_store), ("store-uniform", by_store_uniform),
                           ("all_reduce again", by_all_reduce), ("store again", by_store),
                           ("store-uniform again", by_store_uniform)):
            for _ in range(10):
                once()
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(ops):
                once()
            out[name] = ((time.perf_counter() - wall) / ops, (time.process_time() - cpu) / ops)
        return out

    return work


def main(argv: list[str] | None = None) -> int:
    from refplan.cli.sync import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("processes", nargs="*", type=int, default=[4, 8, 16, 32])
    parser.add_argument("--ops", type=int, default=150, help="timed agreements per kind and pass")
    args = parser.parse_args(argv)
    for world in args.processes:
        outcomes = run_ranks(_work(args.ops), world, backend="gloo", timeout=timedelta(seconds=300))
        failed = [o for o in outcomes if not o.ok]
        if failed:
            print(f"{world} processes: process {failed[0].rank} failed: {failed[0].error}")
            return 1
        for name in outcomes[0].value:
            wall = max(o.value[name][0] for o in outcomes)
            cpu = sum(o.value[name][1] for o in outcomes)
            print(f"{world:3d} processes  {name:<19} {wall * 1e3:7.3f} ms per agreement, "
                  f"CPU summed {cpu * 1e3:7.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
