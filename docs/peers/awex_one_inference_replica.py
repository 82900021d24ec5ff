"""Awex 0.9.0: inference replica i reads from training replica i mod T, for every parameter.

Two parameters of (32, 16) (HF names of one decoder layer's MLP), each held whole by training ranks 0
and 1 (a DP=2 trainer at TP=1, two replicas), synced to one inference engine of one rank. The
`ParameterMeta`s come from Awex's own metadata path: each rank reports its local tensors (name,
shape, numel, dtype) with its `RankInfo`, Awex's `ShardingStrategy.get_sharding_strategy`
(awex/sharding/param_sharding.py:252-262) classifies them (TP=1: NO_SHARDING), and
`ParamMetaResolver._build_params_meta` (awex/meta/meta_resolver.py:93-228) builds replicas, global
shape and offsets from the shards. Only the two engine hooks a resolver subclass provides (the ranks'
raw metadata, the strategy call, as `McoreParamMetaResolver` does at train_meta_resolver.py:198-203)
are filled in here, because the real subclasses gather them from a running engine.
`check_train_infer_params_meta` (awex/util/common.py:171) accepts the pair as Awex's reader and writer
do before planning (weights_reader.py:216). Then `TransferPlanBuilder.build_weights_mapping_operations`
pairs inference replica 0 with training replica 0 % 2 = 0 for both parameters
(awex/transfer/transfer_plan.py:320-323), so training rank 1 never sends. This is Awex's design, pinned
by its own test (awex/tests/test_transfer_plan.py:194-228): an enhancement to ask for, not a defect.
Needs awex==0.9.0 and torch (`make peers`). Prints what a per-parameter rotation would give beside
what Awex does.
"""

import logging
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
from awex.meta.meta_resolver import ParamMetaResolver  # noqa: E402
from awex.sharding.param_sharding import ShardingStrategy  # noqa: E402
from awex.sharding.rank_info import RankInfo  # noqa: E402
from awex.transfer.transfer_plan import TransferPlanBuilder  # noqa: E402
from awex.util.common import check_train_infer_params_meta  # noqa: E402

NAMES = ["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"]


def rank_info(rank: int, world: int, dp: int, infer: bool) -> RankInfo:
    return RankInfo(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, dp_size=dp, dp_rank=rank, ep_rank=0, ep_size=1,
                    ep_tp_rank=0, ep_tp_size=1, attn_tp_rank=0, attn_tp_size=1, attn_dp_rank=0, world_size=world,
                    global_rank=rank, local_rank=rank, engine_rank=0, is_infer=infer)


class Resolver(ParamMetaResolver):
    """The engine hooks of a resolver: what each rank reports about its local tensors."""

    def __init__(self, world: int, dp: int, infer: bool) -> None:
        self.world, self.dp, self.infer = world, dp, infer
        self.num_hidden_layers = 1  # what the real resolvers read from the HF config
        self.hf_config = None

    def get_model_arch_name(self) -> str:
        return "LlamaForCausalLM"

    def get_parameters_meta(self):  # type: ignore[no-untyped-def]
        return self._build_params_meta()

    def _get_params_raw_meta(self):  # type: ignore[no-untyped-def]
        local = torch.empty(32, 16)  # every rank holds each weight whole (TP=1)
        return [{"rank_info": rank_info(r, self.world, self.dp, self.infer),
                 "params_meta": [{"name": n, "shape": list(local.shape), "numel": local.numel(), "dtype": local.dtype}
                                 for n in NAMES]} for r in range(self.world)]

    def _get_sharding_info(self, name, rank_info, param_meta):  # type: ignore[no-untyped-def]
        strategy = ShardingStrategy(engine_name="mcore", enable_dp_attention=False, enable_dp_lm_head=False,
                                    moe_dense_tp_size=1, tp_size=rank_info.tp_size, ep_size=1, ep_tp_size=1,
                                    rank_info=rank_info)
        return strategy.get_sharding_strategy(name, rank_info=rank_info, param_meta=param_meta)


train = Resolver(world=2, dp=2, infer=False).get_parameters_meta()
infer = Resolver(world=1, dp=1, infer=True).get_parameters_meta()
print("training replicas per parameter (Awex's resolver):",
      {p.name.split(".")[-2]: [[s.global_rank for s in r.shards] for r in p.replicas] for p in train})
check_train_infer_params_meta(train, infer, raise_exception=True)
ops = TransferPlanBuilder(1, 2, num_infer_engines=1).build_weights_mapping_operations(infer, train)
actual = sorted((op.send_shard_meta.name.split(".")[-2], op.send_rank - 1) for op in ops)  # inference ranks first
print("training rank sending each parameter:")
print("  rotated per parameter (refplan's batch policy): e.g. [('down_proj', 0), ('up_proj', 1)]")
print(f"  Awex, by design: {actual}")
