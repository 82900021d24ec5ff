"""Megatron-Core 0.16.1: a collocated refit reads every parameter from source replica 0.

Megatron's own front door, end to end: four CPU processes (gloo) each build the trainer's and the
engine's model from real `ColumnParallelLinear` layers with their process groups, and call
`build_centralized_reshard_plan(src_module, dst_module)` (planner.py:213), which extracts the
metadata (`extract_param_metadata`, utils.py:247), all-gathers it, plans on rank 0 and broadcasts the
plan. Each rank prints where it reads each parameter from.

Case 1, TP2xDP2 -> TP2xDP2 on ranks 0-3 (TP groups [0, 1] and [2, 3], DP groups [0, 2] and [1, 3]),
two (32, 16) weights: the engine has the trainer's layout, so every rank already holds its shard.
Case 2, TP1xDP4 -> TP4 on ranks 0-3: every rank holds the whole (32, 16) weight, the engine a quarter.
`select_src_metadata_balanced` (utils.py:322-358) returns the first entry of the chosen DP bucket,
replica 0's, so every read leaves replica 0 (ranks 0-1 in case 1, rank 0 in case 2), also where the
destination rank holds the same shard itself. Both are 0.16.1's documented choice (its comment at
utils.py:357: any representative works, use the first; case 2 is its one-bucket fast path, utils.py:330),
and the local copy printed as expected is what refplan asks for, which 0.16.1 never promises: an
enhancement to ask for, not a defect (0.19.2 reads local copies first).
Needs megatron-core==0.16.1 and torch (`make peers`); about 10 s of CPU per process (imports).
"""

import os
import socket
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4


def model(tp: int, names: list, rank: int) -> torch.nn.Module:
    """One rank's model: `names` as ColumnParallelLinear(16 -> 32) layers, TP `tp` x DP WORLD/tp."""
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    tp_groups = [dist.new_group(list(range(g * tp, (g + 1) * tp))) for g in range(WORLD // tp)]
    dp_groups = [dist.new_group(list(range(j, WORLD, tp))) for j in range(tp)]
    config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)
    m = torch.nn.Module()
    for name in names:
        setattr(m, name, ColumnParallelLinear(16, 32, config=config, init_method=torch.nn.init.zeros_, bias=False,
                                              tp_group=tp_groups[rank // tp]))
    m.pg_collection = ProcessGroupCollection(tp=tp_groups[rank // tp], dp=dp_groups[rank % tp])
    return m


def rank_main(rank: int, port: int, queue) -> None:  # type: ignore[no-untyped-def]
    import logging

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from megatron.core.resharding.planner import build_centralized_reshard_plan

    out = {}
    for case, (src_tp, dst_tp, names) in {1: (2, 2, ["a", "b"]), 2: (1, 4, ["w"])}.items():
        src, dst = model(src_tp, names, rank), model(dst_tp, names, rank)
        plan = build_centralized_reshard_plan(src, dst)
        out[case] = sorted({(op.param_name.split(".")[0], op.peer_rank) for op in plan.recv_ops})
    queue.put((rank, out))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["PYTHONWARNINGS"] = "ignore"  # the ranks' imports warn that Transformer Engine is absent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, free_port, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=600) for _ in range(WORLD))
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        sys.exit("a rank failed")
    print("case 1: TP2xDP2 -> TP2xDP2, collocated on ranks 0-3 (each rank holds its own shard)")
    for rank in range(WORLD):
        print(f"  destination rank {rank}: expected (parameter, source rank) {[(n, rank) for n in 'ab']} (local), "
              f"actual {got[rank][1]}")
    print("case 2: TP1xDP4 -> TP4, collocated on ranks 0-3 (each rank holds the whole weight)")
    for rank in range(WORLD):
        print(f"  destination rank {rank}: expected {[('w', rank)]} (local), actual {got[rank][2]}")
