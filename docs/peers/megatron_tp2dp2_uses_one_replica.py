"""Megatron-Core 0.16.1: TP=2 x DP=2 sources serve every destination from DP replica 0.

Ranks 0-1 and 2-3 are two TP=2 replicas of a (32, 16) weight (DP groups [0, 2] and [1, 3]); the
destination is TP=2 on ranks 4-5. The DP round robin picks a metadata from either DP group, but both
carry the TP group of replica 0 ([0, 1]), so ranks 2 and 3 never send, for every parameter.
Prints the source ranks per destination rank for two parameters.
"""

import torch
from megatron.core.resharding.planner import _determine_source_ranks_for_dst_param
from megatron.core.resharding.utils import ParameterMetadata, select_src_metadata_balanced


def meta(name: str, rank: int, tp: list[int], dp: list[int]) -> ParameterMetadata:
    return ParameterMetadata(name=name, shape=(16, 16), dtype=torch.float32, element_size=4, is_tp=True,
                             partition_dim=0, owner_rank=rank, tensor_parallel_group_ranks=tp,
                             data_parallel_group_ranks=dp, resolved_name=name)


for name in ("a", "b"):
    sources = [meta(name, r, [0, 1] if r < 2 else [2, 3], [0, 2] if r % 2 == 0 else [1, 3]) for r in range(4)]
    for dst_rank in (4, 5):
        dst = meta(name, dst_rank, [4, 5], [dst_rank])
        ops = _determine_source_ranks_for_dst_param(name, select_src_metadata_balanced(sources, dst, dst_rank),
                                                    dst, dst_rank)
        print(f"parameter {name}: destination rank {dst_rank} reads from source ranks {[op[0] for op in ops]}")
