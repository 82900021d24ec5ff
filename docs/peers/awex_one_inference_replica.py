"""Awex 0.9.0: inference replica i reads from training replica i mod T, per parameter.

Two parameters of (32, 16), each held whole by training ranks 0 and 1 (two replicas); one inference
rank holds each whole. Every parameter is read from training replica 0, so training rank 0 sends
both and rank 1 nothing. Needs awex==0.9.0 (with the packages it imports) and torch.
"""

import torch
from awex.meta.weight_meta import ParameterMeta, ParameterReplicaMeta, ParameterShardMeta
from awex.transfer.transfer_plan import TransferPlanBuilder


def shard(name: str, rank: int) -> ParameterShardMeta:
    return ParameterShardMeta(tp_rank=0, attn_tp_rank=0, pp_rank=0, ep_rank=0, ep_tp_rank=0, global_rank=rank,
                              world_size=2, engine_rank=0, name=name, shape=(32, 16), numel=512, dtype=torch.float32,
                              global_offset=(0, 0))


def param(name: str, ranks: list[int]) -> ParameterMeta:
    replicas = [ParameterReplicaMeta(shards=[shard(name, r)]) for r in ranks]
    return ParameterMeta(name=name, global_numel=512, global_shape=(32, 16), dtype=torch.float32,
                         shards=[s for rep in replicas for s in rep.shards], replicas=replicas)


ops = TransferPlanBuilder(1, 2).build_weights_mapping_operations([param("a", [0]), param("b", [0])],
                                                                 [param("a", [0, 1]), param("b", [0, 1])])
print("training rank of each send (inference ranks are numbered first):",
      [(op.send_shard_meta.name, op.send_rank - 1) for op in ops])
