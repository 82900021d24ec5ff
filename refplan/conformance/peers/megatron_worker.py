"""The megatron-core 0.19.2 side of ``--planner megatron``: a subprocess, not imported by refplan.

megatron-core 0.19.2's wheel is for CPython 3.12 only, but its resharding modules are pure Python;
``make peers`` installs it (and the ``triton`` it imports) with ``pip install --target`` into a folder
of its own, which this process puts first on ``sys.path`` (so the 0.16.1 in the virtual environment
stays as it is, for ``--planner megatron-0.16``). It reads one JSON request per line on stdin: the
rosters ``build_plan_from_rosters`` takes, each ``ParameterMetadata`` as a dict of its fields; for
every destination rank it calls ``build_plan_from_rosters(dst_rosters, src_rosters, rank)`` (0.19.2's
pure, collective-free entry point) and answers one JSON line: the receive ops as (parameter,
destination rank, source rank, source slices, destination slices) with the CPU and wall seconds of
the slowest rank's planning call alone (``seconds``, ``wall_seconds``, what ``refplan bench``
reports: each rank of a refit makes its own call, all at once), or the
exception's class and message. Run as ``python -P megatron_worker.py FOLDER`` (``-P``: its own
folder, which holds refplan's ``megatron.py``, stays off ``sys.path``); ``FOLDER`` ``-`` is the
megatron-core of the virtual environment (0.16.1), which answers ``extract`` requests only.

Two more requests check the adapter's metadata against Megatron's own (``tests/test_megatron_front_door.py``,
``docs/peers/megatron_*.py``): ``{"extract": spec}`` builds real ``ColumnParallelLinear`` /
``RowParallelLinear`` modules (and plain replicated parameters, as a LayerNorm holds them) on CPU, one
simulated rank at a time under a ``fake`` process group (``torch.testing._internal.distributed.fake_pg``:
real ``new_group`` objects whose ranks ``dist.get_process_group_ranks`` reports, collectives that do
nothing), and answers what the release's own metadata path reports for them: 0.16.1's
``extract_param_metadata`` over ``named_parameters`` as ``build_centralized_reshard_plan`` calls it
(planner.py:229-257), 0.19.2's ``_extract_module_metadata`` (planner.py:359-385, with its rank offset for a
separate cluster) as ``build_local_reshard_plan`` calls it; ``{"rosters": request}`` answers every field
of the ``ParameterMetadata`` this worker builds from a planning request (what the planner is given).
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import sys
import time
import warnings
from typing import Any


def _slices(value: Any) -> list[list[int | None]]:
    return [[s.start, s.stop, s.step] for s in value]


def _fields(meta: Any) -> dict[str, Any]:
    """Every field of one ``ParameterMetadata``, JSON-ready (the dtype by its torch name)."""
    import dataclasses

    doc = dataclasses.asdict(meta)
    doc["shape"] = list(doc["shape"])
    doc["dtype"] = str(doc["dtype"]).removeprefix("torch.")
    return doc


def _build_model(model: dict[str, Any], rank: int, world: int, perform_init: bool) -> Any:
    """One rank's model of ``model`` (``tp``, ``params``) in a world of ``world`` ranks, Megatron's rank
    order (TP fastest): its TP and DP groups are ``new_group``s of the current (fake) default group."""
    import torch
    import torch.distributed as dist
    from megatron.core.model_parallel_config import ModelParallelConfig  # type: ignore[import-untyped]
    from megatron.core.process_groups_config import ProcessGroupCollection  # type: ignore[import-untyped]
    from megatron.core.tensor_parallel.layers import (  # type: ignore[import-untyped]
        ColumnParallelLinear,
        RowParallelLinear,
    )

    tp = int(model["tp"])
    # every rank creates every group, in one order (new_group's contract), and keeps its own
    tp_groups = [dist.new_group(list(range(g * tp, (g + 1) * tp))) for g in range(world // tp)]
    dp_groups = [dist.new_group(list(range(j, world, tp))) for j in range(tp)]
    tp_group, dp_group = tp_groups[rank // tp], dp_groups[rank % tp]
    layers = torch.nn.ModuleList()
    for p in model["params"]:
        dtype = getattr(torch, p.get("dtype", "float32"))
        config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True,
                                     perform_initialization=perform_init, params_dtype=dtype)
        out_size, in_size = p["shape"][0], p["shape"][-1]
        init = torch.nn.init.zeros_
        if p["kind"] == "column":
            layer = ColumnParallelLinear(in_size, out_size, config=config, init_method=init, bias=False,
                                         stride=int(p.get("stride", 1)), tp_group=tp_group)
        elif p["kind"] == "row":
            layer = RowParallelLinear(in_size, out_size, config=config, init_method=init, bias=False,
                                      input_is_parallel=True, skip_bias_add=True, stride=int(p.get("stride", 1)),
                                      tp_group=tp_group)
        else:  # replicated on every rank, as a LayerNorm's weight: no tensor-parallel attributes
            layer = torch.nn.Module()
            layer.register_parameter(p["name"].rsplit(".", 1)[1],
                                     torch.nn.Parameter(torch.zeros(p["shape"], dtype=dtype)))
        layers.append(layer)
    root = torch.nn.Module()
    root.layers = layers
    groups: dict[str, Any] = {"tp": tp_group, "dp": dp_group}
    experts = model.get("experts")  # {"count", "ep", "shape"}: a grouped MoE layer at ETP=1
    if experts:
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        ep = int(experts["ep"])
        ep_groups = [dist.new_group(list(range(g * ep, (g + 1) * ep))) for g in range(world // ep)]
        expt_tp_groups = [dist.new_group([r]) for r in range(world)]
        groups.update(ep=ep_groups[rank // ep], expt_tp=expt_tp_groups[rank])
        fc1 = torch.nn.Module()
        for k in range(int(experts["count"]) // ep):
            weight = torch.nn.Parameter(torch.zeros(experts["shape"]))
            # what TE's GroupedLinear.reset_parameters stamps on weightK when TEGroupedLinear clears
            # parallel_mode under EP (dim 0, stride 1), and TEGroupedLinear's allreduce=False for experts
            set_tensor_model_parallel_attributes(weight, True, 0, 1)
            setattr(weight, "allreduce", False)  # noqa: B010
            fc1.register_parameter(f"weight{k}", weight)
        root.experts = torch.nn.Module()
        root.experts.linear_fc1 = fc1
    root.pg_collection = ProcessGroupCollection(**groups)
    return root


def _extract(spec: dict[str, Any]) -> dict[str, Any]:
    """``{"clusters": [{"world", "offset", "models": {role: {"tp", "params"}}}], "perform_initialization"}``
    -> ``{role: {global rank: [metadata fields]}}``, each simulated rank under its own fake default group."""
    import torch.distributed as dist
    from megatron.core.resharding import planner, utils  # type: ignore[import-untyped]
    from torch.testing._internal.distributed.fake_pg import FakeStore

    perform_init = bool(spec.get("perform_initialization", True))
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for cluster in spec["clusters"]:
        world, offset = int(cluster["world"]), int(cluster.get("offset", 0))
        for rank in range(world):
            dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
            try:
                for role, model in sorted(cluster["models"].items()):
                    module = _build_model(model, rank, world, perform_init)
                    if hasattr(planner, "_extract_module_metadata"):  # 0.19.2
                        metas = planner._extract_module_metadata(module, rank + offset, spec.get("num_experts"),
                                                                 offset, {})
                    else:  # 0.16.1: build_centralized_reshard_plan's own loop
                        if offset:
                            raise ValueError("megatron-core 0.16.1 has no rank offset (one world)")
                        prefix = utils._build_layer_module_prefix_map(module)
                        metas = [utils.extract_param_metadata(p, name, rank, module.pg_collection,
                                                              num_experts=spec.get("num_experts"),
                                                              layer_module_prefix_map=prefix)
                                 for name, p in module.named_parameters(recurse=True)]
                    out.setdefault(role, {})[str(rank + offset)] = [_fields(m) for m in metas]
            finally:
                dist.destroy_process_group()
    return out


def main() -> int:
    if sys.argv[1] != "-":
        sys.path.insert(0, sys.argv[1])
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import megatron.core  # type: ignore[import-untyped]
        import torch
        from megatron.core.resharding import planner
        from megatron.core.resharding.utils import ParameterMetadata  # type: ignore[import-untyped]
    from importlib.metadata import version  # the folder is first on sys.path: its dist-info wins

    print(json.dumps({"ready": version("megatron-core"), "torch": torch.__version__,
                      "file": megatron.core.__file__}), flush=True)

    def meta(d: dict[str, Any]) -> Any:
        fields = dict(d)
        fields["shape"] = tuple(fields["shape"])
        fields["dtype"] = getattr(torch, fields["dtype"])
        return ParameterMetadata(**fields)

    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "extract" in request:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    extracted = _extract(request["extract"])
                print(json.dumps({"extract": extracted}), flush=True)
                continue
            if "rosters" in request:
                req = request["rosters"]
                answer: dict[str, Any] = {
                    "dst": {r: [_fields(meta(m)) for m in ms] for r, ms in req["dst"].items()},
                    "src": {n: [_fields(meta(m)) for m in ms] for n, ms in req["src"].items()}}
                print(json.dumps(answer), flush=True)
                continue
            dst = {int(r): {m["resolved_name"]: meta(m) for m in ms} for r, ms in request["dst"].items()}
            src = {name: [meta(m) for m in ms] for name, ms in request["src"].items()}
            ops: list[list[Any]] = []
            with contextlib.redirect_stdout(io.StringIO()):
                # Only the planning calls are timed (CPU and wall), not the request's decoding nor the
                # answer's encoding: `refplan bench` reports these seconds, not the round trip. Each
                # rank calls build_plan_from_rosters for itself, all at once (build_local_reshard_plan,
                # planner.py:500): the seconds are the slowest rank's own call, not the sum.
                # Each call starts as a rank's would: no other rank's plan alive, the collector's
                # state fresh; its receive ops are read after it, outside the clock.
                cpu = wall = 0.0
                for rank in sorted(dst):
                    gc.collect()
                    w, c = time.perf_counter(), time.process_time()
                    plan = planner.build_plan_from_rosters(dst, src, rank)
                    cpu, wall = max(cpu, time.process_time() - c), max(wall, time.perf_counter() - w)
                    ops.extend([op.param_name, rank, op.peer_rank, _slices(op.peer_slice), _slices(op.my_slice)]
                               for op in plan.recv_ops)
                    del plan
            answer = {"ops": ops, "seconds": cpu, "wall_seconds": wall}
        except Exception as exc:  # reported to the adapter, which judges refusal or crash by class
            answer = {"error": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else ""}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
