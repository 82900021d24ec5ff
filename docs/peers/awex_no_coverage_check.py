"""Awex 0.9.0 plans from a training replica that covers only half of the tensor.

The training replica's single shard holds rows [0, 4) of an (8, 4) tensor; nothing checks that a
replica covers the tensor, so the plan silently leaves rows 4-7 of the inference copy unwritten.
Needs awex==0.9.0 (with the packages it imports) and torch. Prints the rows written.
"""

import torch
from awex.meta.weight_meta import ParameterMeta, ParameterReplicaMeta, ParameterShardMeta
from awex.transfer.transfer_plan import TransferPlanBuilder


def param(rows: int, rank: int, world: int) -> ParameterMeta:
    shard = ParameterShardMeta(tp_rank=0, attn_tp_rank=0, pp_rank=0, ep_rank=0, ep_tp_rank=0, global_rank=rank,
                               world_size=world, engine_rank=0, name="w", shape=(rows, 4), numel=rows * 4,
                               dtype=torch.float32, global_offset=(0, 0))
    return ParameterMeta(name="w", global_numel=32, global_shape=(8, 4), dtype=torch.float32, shards=[shard],
                         replicas=[ParameterReplicaMeta(shards=[shard])])


ops = TransferPlanBuilder(1, 1).build_weights_mapping_operations([param(8, 0, 1)], [param(4, 0, 1)])
print("accepted; target rows written:", [(op.inf_slices[0].start, op.inf_slices[0].stop) for op in ops], "of 8")
