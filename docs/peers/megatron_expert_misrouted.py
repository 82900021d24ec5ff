"""Megatron-Core 0.16.1 copies an expert weight from a rank that does not hold that expert.

Refit of 4 experts from EP=2 (world 4, TP=1: ranks 0 and 2 hold experts 0-1 as local `weight0`,
`weight1`; ranks 1 and 3 hold experts 2-3 under the same local names) to EP=1 (every rank holds
all four). An expert weight is not TP-split, so the planner takes its replicated fallback: the
source and destination DP groups are equal (pg.dp spans all four ranks), so it plans a *local copy*
on every destination rank, including rank 0 for expert 2, which rank 0 does not hold. The send op
names the source's local parameter `weight0`, which on rank 0 is expert 0: wrong weights, silently.
Needs megatron-core==0.16.1 (installed with --no-deps) and torch. Prints each misrouted copy.
"""

import torch
from megatron.core.resharding.planner import _determine_source_ranks_for_dst_param
from megatron.core.resharding.utils import (
    ParameterMetadata,
    assign_ep_resolved_name_inplace,
    select_src_metadata_balanced,
)

WORLD, EXPERTS = 4, 4


def expert(rank: int, local: int, ep_group: list[int]) -> ParameterMetadata:
    meta = ParameterMetadata(name=f"experts.weight{local}", shape=(6, 4), dtype=torch.float32, element_size=4,
                             is_ep=True, num_experts=EXPERTS, owner_rank=rank, expert_parallel_group_ranks=ep_group,
                             data_parallel_group_ranks=list(range(WORLD)))
    assign_ep_resolved_name_inplace(meta)
    return meta


# source: EP=2, EP groups [0, 1] and [2, 3]; destination: EP=1, every rank its own EP group
src = {r: [expert(r, i, [0, 1] if r < 2 else [2, 3]) for i in range(2)] for r in range(WORLD)}
dst = {r: [expert(r, i, [r]) for i in range(EXPERTS)] for r in range(WORLD)}
holders = {}
for r, metas in src.items():
    for m in metas:
        holders.setdefault(m.resolved_name, set()).add(r)
for dst_rank, metas in dst.items():
    for d in metas:
        candidates = [m for r in sorted(src) for m in src[r] if m.resolved_name == d.resolved_name]
        chosen = select_src_metadata_balanced(candidates, d, dst_rank)
        for src_rank, _, _ in _determine_source_ranks_for_dst_param(d.resolved_name, chosen, d, dst_rank):
            if src_rank not in holders[d.resolved_name]:
                print(f"destination rank {dst_rank}, {d.resolved_name}: copied from rank {src_rank}, which holds "
                      f"only {sorted(m.resolved_name for m in src[src_rank])}")
