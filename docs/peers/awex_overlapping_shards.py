"""Awex 0.9.0 plans overlapping shards of one training replica twice (a double write).

Training rank 0 holds rows [0, 6) and rank 1 rows [4, 8) of an (8, 4) tensor, as one replica; the
inference rank holds it whole. Both shards are intersected with the target, so rows 4-5 are written
twice (and nothing checks that the replica's shards are disjoint). Prints the planned row ranges.
"""

import torch
from awex.meta.weight_meta import ParameterMeta, ParameterReplicaMeta, ParameterShardMeta
from awex.transfer.transfer_plan import TransferPlanBuilder


def shard(rank: int, rows: int, start: int, world: int) -> ParameterShardMeta:
    return ParameterShardMeta(tp_rank=0, attn_tp_rank=0, pp_rank=0, ep_rank=0, ep_tp_rank=0, global_rank=rank,
                              world_size=world, engine_rank=0, name="w", shape=(rows, 4), numel=rows * 4,
                              dtype=torch.float32, global_offset=(start, 0))


def param(shards: list[ParameterShardMeta]) -> ParameterMeta:
    return ParameterMeta(name="w", global_numel=32, global_shape=(8, 4), dtype=torch.float32, shards=shards,
                         replicas=[ParameterReplicaMeta(shards=shards)])


ops = TransferPlanBuilder(1, 2).build_weights_mapping_operations([param([shard(0, 8, 0, 1)])],
                                                                 [param([shard(0, 6, 0, 2), shard(1, 4, 4, 2)])])
print("target rows written:", [(op.inf_slices[0].start, op.inf_slices[0].stop) for op in ops])
