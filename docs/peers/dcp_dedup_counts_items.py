"""DCP's save-side dedup weighs every chunk as its whole tensor, so it balances tensor sizes, not bytes.

Through DCP's front door, on CPU with torch (2.13.0) alone: four ranks, each in its own fake process
group (torch's FakeStore, backend "fake"), build their state dict of DTensors on an HSDP mesh
(2 replicas x FSDP 2, placements [Replicate(), Shard(0)]): w0 of 1 row (torch's chunking leaves FSDP
shard 1 empty), w1 of 4 rows, and w2 replicated ([Replicate(), Replicate()]). Each rank runs
`DefaultSavePlanner().set_up_planner(state_dict, is_coordinator=rank == 0)` and `create_local_plan()`
(one SHARD write item per DTensor, planner_helpers.py:177-194, the empty chunk included), and the
coordinator's `create_global_plan` deduplicates the replicas: `dedup_save_plans` adds
`write_item.tensor_storage_size()` per kept item (_dedup_save_plans.py:53), the whole tensor's size
(planner.py:80-82), not the chunk's. Rank 3's empty chunk of w0 thus weighs 8 elements, and w1's
second chunk goes to rank 1, which already writes w2. Prints expected beside actual, and the same
greedy weighed by chunk sizes (what the dedup would do with `chunk.sizes`).
"""

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.tensor import DeviceMesh, DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.testing._internal.distributed.fake_pg import FakeStore

WORLD = 4
PARAMS = {"w0": ((1, 8), [Replicate(), Shard(0)]), "w1": ((4, 4), [Replicate(), Shard(0)]),
          "w2": ((2, 4), [Replicate(), Replicate()])}

planners, local_plans = [], []
for rank in range(WORLD):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        mesh = DeviceMesh("cpu", torch.arange(WORLD).reshape(2, 2), _init_backend=False)
        state_dict = {}
        for name, (shape, placements) in PARAMS.items():
            local_shape, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
            state_dict[name] = DTensor.from_local(torch.zeros(local_shape), mesh, placements,
                                                  shape=torch.Size(shape), stride=(shape[1], 1), run_check=False)
    finally:
        dist.destroy_process_group()
    planner = DefaultSavePlanner()
    planner.set_up_planner(state_dict, is_coordinator=rank == 0)
    planners.append(planner)
    local_plans.append(planner.create_local_plan())

global_plan, _ = planners[0].create_global_plan(local_plans)
written = [sum(item.tensor_data.chunk.sizes.numel() for item in plan.items) for plan in global_plan]

# The same greedy (in the same order, ties to the same rank) weighed by each chunk's own size.
holders: dict = {}
for rank, plan in enumerate(local_plans):
    for item in plan.items:
        holders.setdefault(item.index, (item.tensor_data.chunk.sizes.numel(), []))[1].append(rank)
weight, by_chunk = [0] * WORLD, [0] * WORLD
for size, ranks in holders.values():
    chosen = min(ranks, key=lambda r: weight[r])
    weight[chosen] += size or 1
    by_chunk[chosen] += size

print(f"elements written (and later read) per rank: expected at most 8 on any rank (chunk-sized greedy: {by_chunk}), "
      f"actual {written}")
