"""Megatron-Core 0.16.1: a collocated refit reads every parameter from source replica 0.

A refit runs both models on one world (`build_centralized_reshard_plan`, planner.py:219-220, 296).
Case 1, TP2xDP2 -> TP2xDP2 on ranks 0-3: ranks 0-1 and 2-3 are two TP=2 replicas of a (32, 16) weight
(DP groups [0, 2] and [1, 3]); the destination has the same layout, so every rank already holds its
shard. Case 2, TP1xDP4 -> TP4 on ranks 0-3: every rank holds the whole weight. The metadata are what
`extract_param_metadata` (utils.py:247) reports for these layouts (it needs a process group; here they
are built directly), and the loop is rank 0's in `build_centralized_reshard_plan` (planner.py:296-308):
`select_src_metadata_balanced` (utils.py:322-358) returns the first entry of a DP bucket, replica 0's,
so every read leaves replica 0. Needs megatron-core==0.16.1 and torch. Prints expected beside actual.
"""

import torch
from megatron.core.resharding.planner import _determine_source_ranks_for_dst_param
from megatron.core.resharding.utils import ParameterMetadata, select_src_metadata_balanced


def meta(name: str, rank: int, shape: tuple, tp: list, dp: list) -> ParameterMetadata:
    return ParameterMetadata(name=name, shape=shape, dtype=torch.float32, element_size=4, is_tp=True,
                             partition_dim=0, owner_rank=rank, tensor_parallel_group_ranks=tp,
                             data_parallel_group_ranks=dp, resolved_name=name)


def plan(name, sources, destinations):
    out = {}
    for dst_rank, dst in destinations.items():
        chosen = select_src_metadata_balanced(sources, dst, dst_rank)
        out[dst_rank] = sorted({op[0] for op in _determine_source_ranks_for_dst_param(name, chosen, dst, dst_rank)})
    return out


print("case 1: TP2xDP2 -> TP2xDP2, collocated on ranks 0-3 (each rank holds its own shard)")
for name in ("a", "b"):
    layout = {r: meta(name, r, (16, 16), [0, 1] if r < 2 else [2, 3], [0, 2] if r % 2 == 0 else [1, 3])
              for r in range(4)}
    got = plan(name, [layout[r] for r in range(4)], layout)
    for dst_rank in range(4):
        print(f"parameter {name}: destination rank {dst_rank}: expected source ranks [{dst_rank}] (local), "
              f"actual {got[dst_rank]}")

print("case 2: TP1xDP4 -> TP4, collocated on ranks 0-3 (each rank holds the whole weight)")
sources = [meta("w", r, (32, 16), [r], [0, 1, 2, 3]) for r in range(4)]
destinations = {r: meta("w", r, (8, 16), [0, 1, 2, 3], [r]) for r in range(4)}
got = plan("w", sources, destinations)
for dst_rank in range(4):
    print(f"parameter w: destination rank {dst_rank}: expected source ranks [{dst_rank}] (local), "
          f"actual {got[dst_rank]}")
