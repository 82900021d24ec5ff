"""Megatron-Core 0.16.1: a model built with `perform_initialization=False` loses its TP marking.

A model that will load its weights (from a checkpoint, or by a refit) may be built with
`ModelParallelConfig(perform_initialization=False)`, an opt-in that skips the random init the load
would overwrite. In 0.16.1, `ColumnParallelLinear` and
`RowParallelLinear` set a weight's tensor-parallel attributes (`tensor_model_parallel`,
`partition_dim`, `partition_stride`) only inside `_initialize_affine_weight_cpu/_gpu`, which they skip
then (tensor_parallel/layers.py:855 and 877 for the column layer, 1178 and 1201 for the row layer:
`if config.perform_initialization:` with no `else`), so `extract_param_metadata`
(resharding/utils.py:257) reports a TP-split weight as replicated (`is_tp=False`, no TP group) on every
rank alike. 0.19.2 sets the attributes in an `else` branch (layers.py:991-994, 1012-1015, and 1354-1357, 1375-1378
for RowParallelLinear): fixed there.

The script builds real layers at TP=2 on CPU under a fake process group (one simulated rank at a
time) in both releases and prints `is_tp` beside the expected `True`; for 0.16.1 it then plans a
collocated refit from a trained TP2xDP2 model to a TP4 engine built without initialization, as rank 0
of `build_centralized_reshard_plan` does for destination rank 1 (`select_src_metadata_balanced`, then
`_determine_source_ranks_for_dst_param`, planner.py:296-308): with no TP marking on the destination,
no TP descriptor is built (planner.py:36-40) and the replicated fallback copies the source's whole
(16, 16) shard into the destination's (8, 16) shard. Needs megatron-core 0.16.1 (and 0.19.2 in
.venv/peers/megatron-core-0.19.2 or REFPLAN_MEGATRON_TARGET for its line; `make peers`).
"""

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

if len(sys.argv) > 1:  # the 0.19.2 run: its folder first on sys.path
    sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core.model_parallel_config import ModelParallelConfig  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.resharding.utils import extract_param_metadata  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

WORLD = 4


def metadata(tp: int, initialize: bool) -> dict:
    """{rank: {name: ParameterMetadata}} of a TP x (WORLD / tp) model of one column and one row layer."""
    out = {}
    for rank in range(WORLD):
        dist.init_process_group("fake", rank=rank, world_size=WORLD, store=FakeStore())
        tp_groups = [dist.new_group(list(range(g * tp, (g + 1) * tp))) for g in range(WORLD // tp)]
        dp_groups = [dist.new_group(list(range(j, WORLD, tp))) for j in range(tp)]
        pg = ProcessGroupCollection(tp=tp_groups[rank // tp], dp=dp_groups[rank % tp])
        config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True,
                                     perform_initialization=initialize)
        layers = {
            "fc1.weight": ColumnParallelLinear(16, 32, config=config, init_method=torch.nn.init.zeros_, bias=False,
                                               tp_group=pg.tp).weight,
            "fc2.weight": RowParallelLinear(32, 16, config=config, init_method=torch.nn.init.zeros_, bias=False,
                                            input_is_parallel=True, skip_bias_add=True, tp_group=pg.tp).weight,
        }
        out[rank] = {name: extract_param_metadata(p, name, rank, pg) for name, p in layers.items()}
        dist.destroy_process_group()
    return out


from importlib.metadata import version  # noqa: E402

release = version("megatron-core")
built = metadata(2, initialize=False)[0]
print(f"megatron-core {release}, TP=2, perform_initialization=False: is_tp of rank 0's weights "
      f"(expected True for both): {({n: m.is_tp for n, m in built.items()})}")

if len(sys.argv) == 1:
    from megatron.core.resharding.planner import _determine_source_ranks_for_dst_param
    from megatron.core.resharding.utils import select_src_metadata_balanced

    trained, engine = metadata(2, initialize=True), metadata(4, initialize=False)
    dst = engine[1]["fc1.weight"]
    chosen = select_src_metadata_balanced([trained[r]["fc1.weight"] for r in range(WORLD)], dst, 1)
    ops = _determine_source_ranks_for_dst_param("fc1.weight", chosen, dst, 1)
    print("refit TP2xDP2 (trained) -> TP4 (built without initialization), destination rank 1, fc1.weight "
          f"{tuple(dst.shape)}:")
    print("  expected: rows 8-15 of the (32, 16) weight, i.e. rows 8-15 of rank 0's (16, 16) shard")
    for src, _, _ in ops:
        print(f"  actual:   the whole {tuple(trained[src]['fc1.weight'].shape)} shard of rank {src} (rows "
              f"{16 * (src % 2)}-{16 * (src % 2) + 15} of the weight) into the whole {tuple(dst.shape)} destination")
    target = os.environ.get("REFPLAN_MEGATRON_TARGET") or str(Path(sys.prefix) / "peers" / "megatron-core-0.19.2")
    if (Path(target) / "megatron" / "core").is_dir():
        sys.stdout.flush()
        subprocess.run([sys.executable, "-P", __file__, target], check=True)
    else:
        print(f"(megatron-core 0.19.2 not found in {target}: `make peers`)")
