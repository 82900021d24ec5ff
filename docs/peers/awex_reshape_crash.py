"""Awex 0.9.0 crashes with IndexError when the two sides disagree on the number of axes.

The training side describes a parameter as (64,), the inference side as (8, 8): a metadata mistake
that should be refused with a clear error. The planner indexes one side's dimensions with the
other's and raises IndexError. Needs awex==0.9.0 (with the packages it imports) and torch.
"""

import torch
from awex.meta.weight_meta import ParameterMeta, ParameterReplicaMeta, ParameterShardMeta
from awex.transfer.transfer_plan import TransferPlanBuilder


def param(shape: tuple[int, ...], rank: int, world: int) -> ParameterMeta:
    shard = ParameterShardMeta(tp_rank=0, attn_tp_rank=0, pp_rank=0, ep_rank=0, ep_tp_rank=0, global_rank=rank,
                               world_size=world, engine_rank=0, name="w", shape=shape, numel=64, dtype=torch.float32,
                               global_offset=(0,) * len(shape))
    return ParameterMeta(name="w", global_numel=64, global_shape=shape, dtype=torch.float32, shards=[shard],
                         replicas=[ParameterReplicaMeta(shards=[shard])])


try:
    TransferPlanBuilder(1, 1).build_weights_mapping_operations([param((8, 8), 0, 1)], [param((64,), 0, 1)])
    print("planned")
except IndexError as exc:
    print(f"crashed: IndexError: {exc}")
