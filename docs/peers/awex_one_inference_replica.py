"""Awex 0.9.0: inference replica i reads from training replica i mod T, for every parameter.

Two parameters of (32, 16), each held whole by training ranks 0 and 1 (DP=2, two replicas); one
inference engine with one rank holds each whole. The `ParameterMeta`s are what Awex's meta resolver
builds for these ranks (`MetaResolver._build_params_meta`, awex/meta/meta_resolver.py:93-228: one
replica per rank for an unsharded weight, offsets from the shards); `check_train_infer_params_meta`
(awex/util/common.py:171) accepts them as Awex's reader and writer do before planning. Then
`TransferPlanBuilder.build_weights_mapping_operations` pairs inference replica 0 with training replica
0 % 2 = 0 for both parameters (awex/transfer/transfer_plan.py:320-323), so training rank 1 never
sends. Needs awex==0.9.0 (with the packages it imports) and torch. Prints expected beside actual.
"""

import torch
from awex.meta.weight_meta import ParameterMeta, ParameterReplicaMeta, ParameterShardMeta
from awex.transfer.transfer_plan import TransferPlanBuilder
from awex.util.common import check_train_infer_params_meta


def shard(name: str, rank: int, world: int) -> ParameterShardMeta:
    return ParameterShardMeta(tp_rank=0, attn_tp_rank=0, pp_rank=0, ep_rank=0, ep_tp_rank=0, global_rank=rank,
                              world_size=world, engine_rank=0, name=name, shape=(32, 16), numel=512,
                              dtype=torch.float32, global_offset=(0, 0))


def param(name: str, ranks: list, world: int) -> ParameterMeta:
    replicas = [ParameterReplicaMeta(shards=[shard(name, r, world)]) for r in ranks]
    return ParameterMeta(name=name, global_numel=512, global_shape=(32, 16), dtype=torch.float32,
                         shards=[s for rep in replicas for s in rep.shards], replicas=replicas)


infer = [param("a", [0], 1), param("b", [0], 1)]
train = [param("a", [0, 1], 2), param("b", [0, 1], 2)]
check_train_infer_params_meta(train, infer, raise_exception=True)
ops = TransferPlanBuilder(1, 2).build_weights_mapping_operations(infer, train)
actual = sorted((op.send_shard_meta.name, op.send_rank - 1) for op in ops)  # inference ranks come first
print("training rank sending each parameter: expected one parameter from each rank, e.g. [('a', 0), ('b', 1)]; "
      f"actual {actual}")
