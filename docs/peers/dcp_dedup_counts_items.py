"""DCP's save-side dedup weighs every chunk as the whole tensor, so it balances item counts, not bytes.

Two ranks each hold the same (14, 4) float32 tensor as chunks of 8,1,1,1,1,1,1 rows (a replicated save
whose shards differ in size). Each rank's `SavePlan` holds one SHARD `WriteItem` per chunk, as
`DefaultSavePlanner.create_local_plan` writes them for a sharded tensor (planner_helpers.py), and
`DefaultSavePlanner().create_global_plan` deduplicates them: `dedup_save_plans` adds
`write_item.tensor_storage_size()` per kept item (_dedup_save_plans.py:53), which is the whole tensor's
size (planner.py:80-82), not the chunk's. Rank 0 keeps the 8-row chunk and three 1-row chunks (11 rows),
rank 1 three rows; a byte-balanced choice loads at most 8 rows on either. Needs only torch (2.13.0).
Prints expected beside actual.
"""

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

rows = [8, 1, 1, 1, 1, 1, 1]


def plan() -> SavePlan:
    items, start = [], 0
    for r in rows:
        chunk = ChunkStorageMetadata(offsets=torch.Size([start, 0]), sizes=torch.Size([r, 4]))
        data = TensorWriteData(chunk=chunk, properties=TensorProperties(dtype=torch.float32), size=torch.Size([14, 4]))
        items.append(WriteItem(index=MetadataIndex("w", torch.Size([start, 0])), type=WriteItemType.SHARD,
                               tensor_data=data))
        start += r
    return SavePlan(items)


global_plan, _ = DefaultSavePlanner(flatten_state_dict=False).create_global_plan([plan(), plan()])
saved = [sum(item.tensor_data.chunk.sizes[0] for item in p.items) for p in global_plan]
print(f"rows saved (and later read) per rank: expected at most 8 on either (e.g. [8, 6]), actual {saved}")
