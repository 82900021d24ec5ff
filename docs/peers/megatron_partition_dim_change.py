"""Megatron-Core 0.16.1 refuses to reshard a weight split on rows into one split on columns.

Source TP=2 splits a (8, 8) weight on axis 0 (local (4, 8)); destination TP=4 splits it on axis 1
(local (8, 2)). The descriptor takes the destination's partition dim and checks world x local size
on it for both sides (2 x 8 != 4 x 2), raising RuntimeError for a valid transfer. Needs
megatron-core==0.16.1 (installed with --no-deps) and torch. Prints the error.
"""

import torch
from megatron.core.resharding.planner import _determine_source_ranks_for_dst_param
from megatron.core.resharding.utils import ParameterMetadata, select_src_metadata_balanced


def meta(rank: int, shape: tuple[int, int], dim: int, tp: list[int]) -> ParameterMetadata:
    return ParameterMetadata(name="w", shape=shape, dtype=torch.float32, element_size=4, is_tp=True,
                             partition_dim=dim, owner_rank=rank, tensor_parallel_group_ranks=tp,
                             data_parallel_group_ranks=[rank], resolved_name="w")


sources = [meta(r, (4, 8), 0, [0, 1]) for r in (0, 1)]
dst = meta(2, (8, 2), 1, [2, 3, 4, 5])
try:
    _determine_source_ranks_for_dst_param("w", select_src_metadata_balanced(sources, dst, 2), dst, 2)
    print("planned")
except RuntimeError as exc:
    print(f"refused a valid reshard: {str(exc).splitlines()[0]}")
