"""DCP's save-side dedup weighs every chunk as the whole tensor, so it balances item counts, not bytes.

Two ranks each hold the same (14, 4) float32 tensor as chunks of 8,1,1,1,1,1,1 rows. The dedup gives
rank 0 the 8-row chunk and three 1-row chunks (11 rows) and rank 1 three rows; a byte-balanced
choice loads at most 8 rows on either. Needs only torch (2.13.0). Prints the rows each rank saves.
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
print(f"rows saved (and later read) per rank: {saved}; a byte-balanced split needs at most 8 on either")
