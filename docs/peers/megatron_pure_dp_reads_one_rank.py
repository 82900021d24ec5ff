"""Megatron-Core 0.16.1: with pure data-parallel sources every destination reads from one rank.

Source: a (32, 16) weight on ranks 0-3, TP=1 (tensor-parallel attribute set, TP group of one), one DP
group [0, 1, 2, 3]. Destination: TP=4 on ranks 4-7. `select_src_metadata_balanced` sees one DP layout
and returns the first source for every destination, so rank 0 sends all four quarters. Needs
megatron-core==0.16.1 (installed with --no-deps) and torch. Prints the source rank of each transfer.
"""

import torch
from megatron.core.resharding.planner import _determine_source_ranks_for_dst_param
from megatron.core.resharding.utils import ParameterMetadata, select_src_metadata_balanced


def meta(rank: int, shape: tuple[int, int], tp: list[int], dp: list[int]) -> ParameterMetadata:
    return ParameterMetadata(name="w", shape=shape, dtype=torch.float32, element_size=4, is_tp=True, partition_dim=0,
                             owner_rank=rank, tensor_parallel_group_ranks=tp, data_parallel_group_ranks=dp,
                             resolved_name="w")


sources = [meta(r, (32, 16), [r], [0, 1, 2, 3]) for r in range(4)]
for dst_rank in range(4, 8):
    dst = meta(dst_rank, (8, 16), [4, 5, 6, 7], [dst_rank])
    chosen = select_src_metadata_balanced(sources, dst, dst_rank)
    ops = _determine_source_ranks_for_dst_param("w", chosen, dst, dst_rank)
    print(f"destination rank {dst_rank} reads from source ranks {[op[0] for op in ops]}")
