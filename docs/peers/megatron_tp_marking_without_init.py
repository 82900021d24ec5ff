"""Megatron-Core 0.16.1: a model built with `perform_initialization=False` loses its TP marking.

A model that will load its weights (from a checkpoint, or by a refit) may be built with
`ModelParallelConfig(perform_initialization=False)`, an opt-in that skips the random init the load
would overwrite. In 0.16.1, `ColumnParallelLinear` and `RowParallelLinear` set a weight's
tensor-parallel attributes (`tensor_model_parallel`, `partition_dim`, `partition_stride`) only inside
`_initialize_affine_weight_cpu/_gpu` (tensor_parallel/layers.py:169-172, 137-139), which they skip then
(layers.py:855 and 877 for the column layer, 1178 and 1201 for the row layer: `if
config.perform_initialization:` with no `else`), so `extract_param_metadata` (resharding/utils.py:257)
reports a TP-split weight as replicated, with a DP group and no TP group (utils.py:291-292), on every
rank alike. 0.19.2 sets the attributes in an `else` branch (layers.py:991-994, 1012-1015, and 1354-1357,
1375-1378 for RowParallelLinear): fixed there.

Part 1 builds the layers at TP=2 on CPU under a fake process group in both releases (0.19.2 in a
subprocess, its folder first on sys.path) and prints `is_tp` beside the expected `True`.

Part 2 (0.16.1) is a collocated refit through the front door only: 4 spawned gloo processes each build
a TP2xDP2 trainer (TP groups [0, 1], [2, 3]) and an engine from real `ColumnParallelLinear(16 -> 32)`
and `RowParallelLinear(32 -> 16)` layers with their process groups, then call
`build_centralized_reshard_plan(trainer, engine)` and `execute_reshard_plan(plan, trainer, engine,
GlooCopyService())`, the two calls `reshard_model_weights` makes (resharding/refit.py:109, 114). The
trainer's weights number their elements, so each rank reads back which rows of fc1 and columns of fc2
it received; the engine is filled with NaN first. Each engine layout runs twice: built with
initialization (a control: every rank receives its own rows) and without. One patch, for CPU torch,
and none to megatron-core: `GlooCopyService` creates a CUDA stream (gloo_copy_service.py:46) that it
only waits on (145-146); in the ranks `torch.cuda.Stream` returns None, so that wait is skipped.

- Engine TP2 with TP groups [0, 2] and [1, 3] (shapes agree with the trainer's): silent corruption.
  With the engine unmarked, `_build_descriptors_for_param` finds no destination TP group and builds no
  TP descriptor (planner.py:36-40); the replicated fallback copies a whole source shard from the chosen
  source DP group, `src_dp_ranks[dst_rank % len]` (planner.py:186-188). Rank 1 (TP index 0 of [1, 3],
  needs rows 0-15) gets DP group (1, 3) from `select_src_metadata_balanced` (utils.py:354-358) and so
  rank 3's shard, rows 16-31; rank 2 (needs 16-31) gets rank 0's, rows 0-15 (and the same columns of
  fc2). Same shapes: no error.
- Engine TP4: a crash. Each rank is planned a whole (16, 16) shard for its (8, 16) (fc1) or (16, 8) (fc2)
  shard: ranks 0 and 3 from themselves, rank 1 from rank 3, rank 2 from rank 0. The receive buffer has
  the destination's shape (execution.py:48-49); `GlooCopyService.run` does the local copies first
  (gloo_copy_service.py:91-123), where `copy_` refuses the size on ranks 0 and 3 (line 123), before
  any cross-rank send is posted (127-136). Ranks 1 and 2 then fail only because their senders' processes
  ended (gloo: connection closed, line 136); had those processes lived on, they would wait on them.

Needs megatron-core 0.16.1 (and 0.19.2 in .venv/peers/megatron-core-0.19.2 or
REFPLAN_MEGATRON_TARGET for its line; `make peers`). About 30 s on 2 cores (imports); the ranks are
killed after 180 s at most.
"""

import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from queue import Empty

if len(sys.argv) > 1:  # the 0.19.2 run: its folder first on sys.path
    sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
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


# The refit. Full weights: fc1.weight (32, 16), split by rows; fc2.weight (16, 32), split by columns.
# The trainer's element (i, j) is i * ncols + j, so a received element names its row (fc1) or column (fc2).
TRAINER = [[0, 1], [2, 3]]  # TP groups of the TP2xDP2 trainer; its DP groups are [0, 2] and [1, 3]
ENGINES = [  # (TP groups of the engine, built with initialization); the last one breaks the world
    ([[0, 2], [1, 3]], True),
    ([[0, 2], [1, 3]], False),
    ([[0, 1, 2, 3]], True),
    ([[0, 1, 2, 3]], False),
]
NAMES = ("fc1.weight", "fc2.weight")
WAIT_S = 180  # for the whole refit; then the ranks are killed


def model(tp_groups: list, rank: int, initialize: bool) -> torch.nn.Module:
    """One rank's model of two real layers; the i-th DP group holds the i-th rank of every TP group."""
    groups = [dist.new_group(g) for g in tp_groups]
    dp_groups = [dist.new_group([g[i] for g in tp_groups]) for i in range(len(tp_groups[0]))]
    group = next(g for g in tp_groups if rank in g)
    tp = groups[tp_groups.index(group)]
    config = ModelParallelConfig(tensor_model_parallel_size=len(group), use_cpu_initialization=True,
                                 perform_initialization=initialize)

    def numbered(w: torch.Tensor) -> torch.Tensor:
        return w.copy_(torch.arange(w.numel(), dtype=w.dtype).reshape(w.shape))

    m = torch.nn.Module()
    m.fc1 = ColumnParallelLinear(16, 32, config=config, init_method=numbered, bias=False, tp_group=tp)
    m.fc2 = RowParallelLinear(32, 16, config=config, init_method=numbered, bias=False, input_is_parallel=True,
                              skip_bias_add=True, tp_group=tp)
    m.pg_collection = ProcessGroupCollection(tp=tp, dp=dp_groups[group.index(rank)])
    return m


def lines(t: torch.Tensor, name: str) -> list:
    """The rows (fc1) or columns (fc2) of the full weight that `t`'s elements came from, None where NaN."""
    if name == "fc1.weight":
        return [None if v != v else int(v) // 16 for v in t[:, 0].tolist()]
    return [None if v != v else int(v) % 32 for v in t[0, :].tolist()]


def failure(exc: Exception) -> str:
    """The exception's first line and the innermost megatron-core line it passed through."""
    where = [f for f in traceback.extract_tb(exc.__traceback__) if "megatron" in f.filename]
    text = str(exc).splitlines()[0]
    if "Connection closed by peer" in text:  # gloo's message names a port: keep what is stable
        text = "gloo: Connection closed by peer"
    site = f" (at megatron/{where[-1].filename.split('/megatron/')[-1]}:{where[-1].lineno})" if where else ""
    return f"{type(exc).__name__}: {text}{site}"


def rank_main(rank: int, store: str, queue) -> None:  # type: ignore[no-untyped-def]
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    from megatron.core.resharding.copy_services.gloo_copy_service import GlooCopyService
    from megatron.core.resharding.execution import execute_reshard_plan
    from megatron.core.resharding.planner import build_centralized_reshard_plan

    torch.cuda.Stream = lambda *a, **k: None  # CPU torch has no stream; GlooCopyService then skips its wait
    service = GlooCopyService()
    trainer = model(TRAINER, rank, True)
    shards = dict(trainer.named_parameters())
    for case, (tp_groups, initialize) in enumerate(ENGINES):
        engine = model(tp_groups, rank, initialize)
        with torch.no_grad():
            for p in engine.parameters():
                p.fill_(float("nan"))  # what the refit does not write stays NaN
        plan = build_centralized_reshard_plan(trainer, engine)  # as reshard_model_weights does (refit.py:109)
        sent = {op.task_id: (rank, tuple(shards[op.param_name].shape), whole(op.my_slice),
                             lines(shards[op.param_name].data[op.my_slice], op.param_name)) for op in plan.send_ops}
        wanted = [(op.param_name, op.task_id, op.my_slice) for op in plan.recv_ops]
        queue.put((case, rank, "plan", (sent, wanted)))
        try:
            execute_reshard_plan(plan, trainer, engine, service=service)  # refit.py:114
        except Exception as exc:
            queue.put((case, rank, "error", failure(exc)))
            return  # as a crashed rank would: its process ends
        queue.put((case, rank, "done", {n: lines(p.data, n) for n, p in engine.named_parameters()}))
    dist.destroy_process_group()


def whole(index: tuple) -> bool:
    return all(s == slice(None) for s in index)


def span(rows: list) -> str:
    if all(r is None for r in rows):
        return "nothing (NaN)"
    if None not in rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return f"{rows[0]}-{rows[-1]}"
    return str(rows)


def expected(tp_groups: list, rank: int) -> list:
    group = next(g for g in tp_groups if rank in g)
    size = 32 // len(group)
    return list(range(group.index(rank) * size, (group.index(rank) + 1) * size))


def refit() -> dict:
    """{case: {"plan" | "done" | "error": {rank: ...}}} from WORLD spawned ranks, killed after WAIT_S."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    got: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, os.path.join(tmp, "store"), queue), daemon=True)
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + WAIT_S
        last = len(ENGINES) - 1
        while time.monotonic() < deadline:
            try:
                case, rank, kind, value = queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except Empty:  # the time is up
                break
            got.setdefault(case, {}).setdefault(kind, {})[rank] = value
            if kind == "error":  # the others fail or hang soon after: give them 10 s
                deadline = min(deadline, time.monotonic() + 10)
            if sum(len(got.get(last, {}).get(k, {})) for k in ("done", "error")) == WORLD:
                break
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    return got


def report(got: dict) -> None:
    print("Collocated refit from a TP2xDP2 trainer (TP groups [0, 1], [2, 3]) on 4 gloo processes: "
          "build_centralized_reshard_plan, then execute_reshard_plan with GlooCopyService. Rows of the full "
          "fc1.weight (32, 16) and columns of the full fc2.weight (16, 32) each rank should hold and holds:")
    for case, (tp_groups, initialize) in enumerate(ENGINES):
        tp = len(tp_groups[0])
        print(f"engine TP{tp}, TP groups {' and '.join(map(str, tp_groups))}, built "
              f"{'with' if initialize else 'without'} initialization:")
        result = got.get(case, {})
        done = result.get("done", {})
        if len(done) == WORLD and all(span(done[r][n]) == span(expected(tp_groups, r)) for r in done for n in NAMES):
            print(f"  every rank: as expected ({', '.join(span(expected(tp_groups, r)) for r in range(WORLD))})")
            continue
        sends = {task: v for sent, _ in result.get("plan", {}).values() for task, v in sent.items()}
        for rank in range(WORLD):
            want = span(expected(tp_groups, rank))
            if rank in done:
                held = {span(done[rank][n]) for n in NAMES}
                held = held.pop() if len(held) == 1 else ", ".join(f"{n} {span(done[rank][n])}" for n in NAMES)
                print(f"  rank {rank}: expected {want}, received {held}: "
                      f"{'ok' if held == want else 'WRONG, and no error'}")
                continue
            planned = {}
            for name, task, my_slice in result.get("plan", {}).get(rank, ({}, []))[1]:
                src, src_shape, all_of_it, rows = sends[task]
                into = "its whole shard" if whole(my_slice) else f"its {my_slice}"
                part = "whole" if all_of_it else "part of the"
                planned[name] = f"rank {src}'s {part} {src_shape} shard ({span(rows)}) into {into}"
            text = (f"both weights, {planned[NAMES[0]]}" if len(set(planned.values())) == 1 and len(planned) == 2
                    else "; ".join(f"{n}, {v}" for n, v in planned.items()) or "nothing")
            shapes = f"shards fc1 {(32 // tp, 16)}, fc2 {(16, 32 // tp)}"
            print(f"  rank {rank}: expected {want} ({shapes}); planned: {text}")
            print(f"    execute: {result.get('error', {}).get(rank, 'no result in time (killed)')}")
    missing = [case for case in range(len(ENGINES) - 1) if len(got.get(case, {}).get("done", {})) != WORLD]
    if missing:
        sys.exit(f"the refit did not complete for engines {missing}: {got}")


if __name__ == "__main__":
    from importlib.metadata import version

    release = version("megatron-core")
    built = metadata(2, initialize=False)[0]
    print(f"megatron-core {release}, TP=2, perform_initialization=False: is_tp of rank 0's weights "
          f"(expected True for both): {({n: m.is_tp for n, m in built.items()})}")
    if len(sys.argv) == 1:
        report(refit())
        target = os.environ.get("REFPLAN_MEGATRON_TARGET") or str(Path(sys.prefix) / "peers" / "megatron-core-0.19.2")
        if (Path(target) / "megatron" / "core").is_dir():
            sys.stdout.flush()
            subprocess.run([sys.executable, "-P", __file__, target], check=True, timeout=120)
        else:
            print(f"(megatron-core 0.19.2 not found in {target}: `make peers`)")
