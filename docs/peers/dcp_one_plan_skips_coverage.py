"""DCP's global save-plan check tests coverage only when there is more than one plan.

One rank saves a chunk holding rows 0-3 of an (8, 4) tensor and nothing else. With one SavePlan the
"invalid fill" check is skipped and the plan is accepted, so a later load reads rows 4-7 from nowhere.
Needs only torch (2.13.0). Prints the stored chunks of a tensor of 32 elements that cover 16.
"""

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 4]))
item = WriteItem(index=MetadataIndex("w", torch.Size([0, 0])), type=WriteItemType.SHARD,
                 tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties(dtype=torch.float32),
                                             size=torch.Size([8, 4])))
_, metadata = DefaultSavePlanner(flatten_state_dict=False).create_global_plan([SavePlan([item])])
md = metadata.state_dict_metadata["w"]
print(f"accepted: tensor {tuple(md.size)} stored as {[(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]}")
