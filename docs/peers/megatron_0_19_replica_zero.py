"""Megatron-Core 0.19.2: with the engine on other ranks, one source replica sends every parameter.

0.19.2's wheel is for CPython 3.12, but its resharding modules are pure Python: `make peers` installs
it (and the triton it imports) with `pip install --target` into .venv/peers/megatron-core-0.19.2
(or set REFPLAN_MEGATRON_TARGET), which this script puts first on sys.path.

Megatron's own path, rank by rank: each rank of the trainer (a cluster of its own) and of the engine (a
second cluster, its ranks offset by the trainer's world: `dst_rank_offset`) builds its model from real
`ColumnParallelLinear` layers under a fake process group (real `new_group` objects, one simulated rank
at a time, on CPU), and reads its metadata with `_extract_module_metadata` (planner.py:359-385), which
`build_local_reshard_plan` (planner.py:454) all-gathers; the gathered list goes through
`index_metadata_rosters` (planner.py:388) and `build_plan_from_rosters` (planner.py:403, 0.19.2's
pure, collective-free entry point) for every engine rank. Only the all-gather is replaced (by a list
in rank order).

Case 1: a TP2xDP2 trainer on ranks 0-3 (TP groups [0, 1] and [2, 3]) -> a TP2 engine on ranks 4-5,
four (32, 16) weights: `_round_robin_dp` (utils.py:498-529) keys its choice by the destination rank
only, so every parameter comes from replica 0 (ranks 0-1): its design, which balances destination
ranks and not parameters (an enhancement to ask for, not a defect). Case 2: TP1xDP4 on ranks 0-3 ->
TP4 on ranks 4-7: one DP group, the fast path (utils.py:514-516) returns rank 0 for everything,
against the docstring's cycle within the group (utils.py:505-507): a defect by its own contract.
Prints, for case 1, what a per-parameter rotation would give, and for case 2, what the docstring
promises, beside what Megatron does.
"""

import logging
import os
import sys
import warnings
from pathlib import Path

TARGET = os.environ.get("REFPLAN_MEGATRON_TARGET") or str(Path(sys.prefix) / "peers" / "megatron-core-0.19.2")
sys.path.insert(0, TARGET)
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core.model_parallel_config import ModelParallelConfig  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.resharding.planner import (  # noqa: E402
    _extract_module_metadata,
    build_plan_from_rosters,
    index_metadata_rosters,
)
from megatron.core.tensor_parallel.layers import ColumnParallelLinear  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402


def cluster_metadata(tp: int, dp: int, names: list, offset: int) -> list:
    """Per rank of a TP x DP cluster whose ranks start at `offset`: the metadata its model reports."""
    world, out = tp * dp, []
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        tp_groups = [dist.new_group(list(range(g * tp, (g + 1) * tp))) for g in range(dp)]
        dp_groups = [dist.new_group(list(range(j, world, tp))) for j in range(tp)]
        config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)
        model = torch.nn.Module()
        for name in names:
            setattr(model, name, ColumnParallelLinear(16, 32, config=config, init_method=torch.nn.init.zeros_,
                                                      bias=False, tp_group=tp_groups[rank // tp]))
        model.pg_collection = ProcessGroupCollection(tp=tp_groups[rank // tp], dp=dp_groups[rank % tp])
        out.append(_extract_module_metadata(model, rank + offset, None, offset, {}))
        dist.destroy_process_group()
    return out


def senders(trainer: tuple, engine: tuple, names: list) -> dict:
    src = cluster_metadata(*trainer, names, 0)
    dst = cluster_metadata(*engine, names, len(src))
    gathered = [(metas, []) for metas in src] + [([], metas) for metas in dst]  # what the all-gather returns
    dst_rosters, src_rosters = index_metadata_rosters(gathered)
    loads: dict = {}
    for rank in range(len(src), len(gathered)):
        for op in build_plan_from_rosters(dst_rosters, src_rosters, rank).recv_ops:
            loads.setdefault(op.param_name.split(".")[0], set()).add(op.peer_rank)
    return {name: sorted(loads[name]) for name in names}


print("case 1: TP2xDP2 (ranks 0-3) -> TP2 (ranks 4-5), four parameters")
print("  rotated per parameter (an enhancement): two from replica 0 (ranks [0, 1]), two from replica 1 ([2, 3])")
print(f"  actual source ranks per parameter: {senders((2, 2), (2, 1), ['a', 'b', 'c', 'd'])}")
print("case 2: TP1xDP4 (ranks 0-3) -> TP4 (ranks 4-7)")
print("  expected by the docstring's cycle (utils.py:505-507): each of ranks 0-3 sends one quarter")
print(f"  actual source ranks: {senders((1, 4), (4, 1), ['w'])}")
