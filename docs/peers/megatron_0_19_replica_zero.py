"""Megatron-Core 0.19.2: with the engine on other ranks, one source replica sends every parameter.

0.19.2's wheel is for CPython 3.12, but its resharding modules are pure Python: `make peers` installs
it (and the triton it imports) with `pip install --target` into .venv/peers/megatron-core-0.19.2
(or set REFPLAN_MEGATRON_TARGET), which this script puts first on sys.path. `build_plan_from_rosters`
(planner.py:403) is 0.19.2's pure, collective-free entry point: the rosters are the
`ParameterMetadata` that `extract_param_metadata` reports on every rank (built directly here).
Case 1: a TP2xDP2 trainer on ranks 0-3 (TP groups [0, 1] and [2, 3]) -> a TP2 engine on ranks 4-5,
four parameters: `_round_robin_dp` (utils.py:498-529) keys its choice by the destination rank only,
so every parameter comes from replica 0 (ranks 0-1). Case 2: TP1xDP4 on ranks 0-3 -> TP4 on ranks 4-7:
one DP group, the fast path (utils.py:514-516) returns rank 0 for everything. Prints expected beside
actual.
"""

import os
import sys
from pathlib import Path

TARGET = os.environ.get("REFPLAN_MEGATRON_TARGET") or str(Path(sys.prefix) / "peers" / "megatron-core-0.19.2")
sys.path.insert(0, TARGET)

import torch  # noqa: E402
from megatron.core.resharding.planner import build_plan_from_rosters  # noqa: E402
from megatron.core.resharding.utils import ParameterMetadata  # noqa: E402


def meta(name, rank, shape, tp, dp):
    return ParameterMetadata(name=name, shape=shape, dtype=torch.float32, element_size=4, is_tp=True,
                             partition_dim=0, owner_rank=rank, tensor_parallel_group_ranks=tp,
                             data_parallel_group_ranks=dp, resolved_name=name)


def senders(names, src, dst):
    loads = {}
    for rank in sorted(dst):
        for op in build_plan_from_rosters(dst, src, rank).recv_ops:
            loads.setdefault(op.param_name, set()).add(op.peer_rank)
    return {name: sorted(loads[name]) for name in names}


names = ["a", "b", "c", "d"]
src = {n: [meta(n, r, (16, 16), [0, 1] if r < 2 else [2, 3], [0, 2] if r % 2 == 0 else [1, 3]) for r in range(4)]
       for n in names}
dst = {r: {n: meta(n, r, (16, 16), [4, 5], [r]) for n in names} for r in (4, 5)}
print("case 1: TP2xDP2 (ranks 0-3) -> TP2 (ranks 4-5), four parameters")
print("  expected: two parameters from replica 0 (ranks [0, 1]) and two from replica 1 (ranks [2, 3])")
print(f"  actual source ranks per parameter: {senders(names, src, dst)}")

src = {"w": [meta("w", r, (32, 16), [r], [0, 1, 2, 3]) for r in range(4)]}
dst = {r: {"w": meta("w", r, (8, 16), [4, 5, 6, 7], [r])} for r in range(4, 8)}
print("case 2: TP1xDP4 (ranks 0-3) -> TP4 (ranks 4-7)")
print("  expected: each of ranks 0-3 sends one quarter")
print(f"  actual source ranks: {senders(['w'], src, dst)}")
