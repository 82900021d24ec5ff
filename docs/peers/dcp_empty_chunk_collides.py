"""DCP's dedup keys a chunk by its offset only, so an empty chunk can displace a real one.

A (12, 8) tensor saved by two ranks as a fused parameter of sub-parameters: rank 0 holds rows 0-7
and 8-9, rank 1 an empty slice at row 8 (its share of the second sub-parameter is zero rows wide)
and rows 10-11. The dedup sees rank 0's real chunk and rank 1's empty one under the same key
(fqn, offset (8, 0)), keeps the empty one, and the global plan check then fails with "invalid fill"
(80 of 96 elements): a valid save refused. Needs only torch (2.13.0). Prints the save's error.
"""

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType


def item(offsets: list[int], sizes: list[int]) -> WriteItem:
    chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
    data = TensorWriteData(chunk=chunk, properties=TensorProperties(dtype=torch.float32), size=torch.Size([12, 8]))
    return WriteItem(index=MetadataIndex("w", torch.Size(offsets)), type=WriteItemType.SHARD, tensor_data=data)


rank0 = SavePlan([item([0, 0], [8, 8]), item([8, 0], [2, 8])])
rank1 = SavePlan([item([8, 0], [0, 8]), item([10, 0], [2, 8])])  # an empty chunk where rank 0 has rows 8-9
try:
    DefaultSavePlanner(flatten_state_dict=False).create_global_plan([rank0, rank1])
    print("accepted")
except ValueError as exc:
    print(f"refused a valid save: {exc}")
