"""Adapters for the planners people run: PyTorch DCP, Megatron-Core's refit planner, and Awex.

Each adapter calls the peer's real, pinned package on CPU, outside any process group, through the
functions its users' code paths reach:

``dcp`` / ``dcp-lowest``
    torch's ``torch.distributed.checkpoint`` through its front doors (``peers/dcp.py``): every
    parameter's layout found as a DTensor layout (``Replicate``/``Shard`` on a ``DeviceMesh``,
    torch's chunking), every rank's state dict of ``DTensor.from_local`` tensors built in its own
    fake process group, ``DefaultSavePlanner`` local plans, the coordinator's ``create_global_plan``
    (DCP's replica choice: by planned bytes, or to the lowest rank for ``dcp-lowest``) and each
    target rank's ``DefaultLoadPlanner`` local plan; its ``ReadItem``s become strided segments.
``megatron``
    megatron-core 0.19.2's ``build_plan_from_rosters`` in a subprocess (``megatron_worker.py``) whose
    ``sys.path`` starts with the ``pip install --target`` folder ``make peers`` fills.
``megatron-0.16``
    ``megatron.core.resharding`` (megatron-core 0.16.1): one ``ParameterMetadata`` per rank and
    parameter, then, as ``build_centralized_reshard_plan`` does on rank 0, for every destination
    rank and parameter ``select_src_metadata_balanced`` and ``_determine_source_ranks_for_dst_param``.
``awex``
    ``awex.transfer.transfer_plan.TransferPlanBuilder.build_weights_mapping_operations`` (awex
    0.9.0) on ``ParameterMeta``s with their replicas.

Why every translation is checked: a conformance result only means something if the peer saw the
case's problem and not a neighbour of it. So an adapter translates a parameter only when the
peer's own description expresses both maps *exactly*: it rebuilds the maps from the peer's input
objects alone (``rebuild``) and compares them with the case's maps piece for piece (tests compare
them element for element as well). Anything else is ``unsupported`` with the reason ("uneven TP
split", "more than one box per rank", ...), so it can never pass or fail.

How outcomes read: a peer that raises a deliberate error (``ValueError``, ``RuntimeError``,
``AssertionError``, ``NotImplementedError``) refuses; any other exception is a crash (a failure
with the peer's own message). Peers have their own error classes, so a refusal of a case that
must be refused passes whatever its class (noted); refusing a valid case fails. The batch policy
expectations (busiest-sender bound, local-first sources) are judged as *quality*, not
correctness (see ``runner.judge``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...maps import ParamAffineMap
from ..base import Adapter
from ..corpus import Case
from .awex import AwexAdapter
from .common import Chunk, Inexpressible, PeerAdapter, _quiet, check_tiled, maps_differ, peer_version
from .dcp import DCPAdapter
from .megatron import MegatronAdapter

__all__ = [
    "PEER_PINS",
    "PEER_SPECS",
    "AwexAdapter",
    "Chunk",
    "DCPAdapter",
    "Inexpressible",
    "MegatronAdapter",
    "PeerAdapter",
    "WorkerTimed",
    "bench_contender",
    "check_tiled",
    "make_peer_adapter",
    "maps_differ",
    "peer_version",
]

PEER_PINS = {"dcp": "torch==2.13.0", "megatron": "megatron-core==0.19.2 (in .venv/peers/megatron-core-0.19.2)",
             "megatron-0.16": "megatron-core==0.16.1", "awex": "awex==0.9.0"}
"""The versions the adapters were written against (``make peers`` installs them)."""

PEER_SPECS = ("dcp", "dcp-lowest", "megatron", "megatron-0.16", "awex")


def megatron_target() -> Path:
    """The ``pip install --target`` folder of megatron-core 0.19.2 (and the triton it imports) that
    ``make peers`` fills: ``$REFPLAN_MEGATRON_TARGET``, else ``<venv>/peers/megatron-core-0.19.2``."""
    return Path(os.environ.get("REFPLAN_MEGATRON_TARGET") or Path(sys.prefix) / "peers" / "megatron-core-0.19.2")

PEER_NOTES = {
    "dcp": (
        "Called through DCP's front doors: each parameter's layout is found as a DTensor layout (a `DeviceMesh` "
        "over the side's locations with `Replicate()`/`Shard(d)` per mesh axis, torch's chunking with its uneven "
        "and empty last shards); every rank builds its state dict of `DTensor.from_local` tensors in its own fake "
        "process group (`FakeStore`, backend `fake`) and runs `DefaultSavePlanner().set_up_planner` + "
        "`create_local_plan`; the coordinator's `create_global_plan` deduplicates replicas (DCP's only replica "
        "choice: by planned bytes, or to the lowest rank for `dcp-lowest`) and writes the `Metadata`; every target "
        "rank runs `DefaultLoadPlanner().set_up_planner(state_dict, metadata)` + `create_local_plan`, so DCP's own "
        "load checks (missing keys, size mismatches) run. Expressible: one box per rank per parameter (a rank's "
        "pieces forming one dense row-major box are that box), placed as some DTensor places it; not: several "
        "boxes per rank, splits torch's chunking never makes, targets that load part of a tensor or overlap, "
        "`_StridedShard` layouts, scaled or reshaped pieces, endpoints, scripted answers, budgets."
    ),
    "megatron-core 0.19": (
        "`--planner megatron`: megatron-core 0.19.2 (installed by `make peers` with `pip install --target` into "
        "`.venv/peers/megatron-core-0.19.2`, with the triton it imports; its wheel is for CPython 3.12, its "
        "resharding modules are pure Python) in a subprocess whose `sys.path` starts with that folder: one "
        "`ParameterMetadata` per rank and parameter as for 0.16.1, then `build_plan_from_rosters(dst_rosters, "
        "src_rosters, rank)` (planner.py:403, pure and collective-free) for every destination rank. Without "
        "endpoints, target locations take the ranks after the source's (an RL refit to an engine on other ranks). "
        "Expressible as for `megatron-0.16`. A change of `partition_dim` is refused on purpose (`contract`)."
    ),
    "megatron": (
        "`--planner megatron-0.16`. Called as rank 0 of `build_centralized_reshard_plan` does: one "
        "`ParameterMetadata` per rank and "
        "parameter, then for every destination rank and parameter `select_src_metadata_balanced` and "
        "`_determine_source_ranks_for_dst_param`. 0.16.1 refits inside one world where every rank holds both "
        "models (planner.py:219-220, 296): the k-th target location runs on the k-th source rank (with endpoints, "
        "the processes), and a case with targets outside the source world is unsupported. Expressible: an even TP "
        "split along one axis (with `partition_stride` interleaving) replicated over DP, and fully replicated "
        "parameters; a location whose pieces form one dense row-major box is given as that box; not: uneven "
        "splits, several boxes per rank outside the stride pattern. A change of `partition_dim` is refused on "
        "purpose (`contract`)."
    ),
    "awex": (
        "Called as its weight sync does: `ParameterMeta`s as its meta resolver builds them from the ranks' "
        "shards (replica c: the c-th holder of every box; global shape and offsets derived from the shards, "
        "meta_resolver.py:93-228), `check_train_infer_params_meta(raise_exception=True)` as its reader and writer "
        "run it before planning, then `TransferPlanBuilder(infer_world, train_world)."
        "build_weights_mapping_operations`. Expressible: one dense box per rank per parameter (pieces forming one "
        "dense row-major box are given as that box), shards laid end to end along one axis; not: several boxes "
        "per rank (fused weights), boxes with unequal numbers of holders, a side no rank holds (its front door "
        "never passes `replicas=[]`). TP sizes that do not divide each other are refused on purpose (`contract`)."
    ),
}
"""How each peer is called and what it can express, for the generated ``docs/conformance.md``."""

PEER_FINDINGS_OUTSIDE_CORPUS = {
    "megatron-core 0.16": [
        (
            "Weights lose their TP marking when the model is built without initialization (0.16.1; fixed in "
            "0.19.2). A model about to load its weights (a checkpoint, or a refit's engine) may be built with "
            "`perform_initialization=False`, an opt-in that skips the random init it would overwrite; "
            "`ColumnParallelLinear`/`RowParallelLinear` set `tensor_model_parallel`, "
            "`partition_dim` and `partition_stride` only inside `_initialize_affine_weight_*`, which they then skip "
            "(megatron/core/tensor_parallel/layers.py:855, 877, 1178, 1201: `if config.perform_initialization:` with "
            "no `else`), so `extract_param_metadata` "
            "(resharding/utils.py:257) reports TP-split weights as replicated on every rank. Through the front "
            "door (4 gloo processes, `build_centralized_reshard_plan` then `execute_reshard_plan` with "
            "`GlooCopyService`, whose CUDA stream, used only for a wait at gloo_copy_service.py:145-146, is "
            "replaced by None on CPU torch, the one change; from a TP2xDP2 trainer with TP groups [0, 1] and "
            "[2, 3]), a refit to such an "
            "engine builds no TP descriptor (planner.py:36-40) and the replicated fallback copies a whole source "
            "shard (planner.py:186-188). Where the shapes agree that is silent corruption: to a TP2 engine whose "
            "TP groups are [0, 2] and [1, 3] (an unusual rank order) the refit runs without error, and rank 1 "
            "holds rows 16-31 of the column layer's weight (and columns 16-31 of the row layer's) where it needs "
            "0-15, rank 2 rows 0-15 where it needs 16-31; the same engine built with initialization gets its own "
            "rows. To TP4 the refit crashes: each rank is planned a whole (16, 16) shard for its (8, 16) or "
            "(16, 8) one, ranks 0 and 3 from themselves, and `GlooCopyService` does local copies before any "
            "cross-rank send, so a size mismatch is raised there (copy_services/gloo_copy_service.py:123) and "
            "ranks 1 and 2, whose senders are ranks 3 and 0, never receive. 0.19.2 sets the attributes in an "
            "`else` branch (layers.py:991-994, 1012-1015 for `ColumnParallelLinear`, 1354-1357 and 1375-1378 "
            "for `RowParallelLinear`). This is the local-spec layers; the Transformer Engine spec passes a no-op "
            "init rather than skipping it, so TE-spec models are probably not affected (not checked here: TE is "
            "not installed). Real layers on CPU in `tests/test_megatron_front_door.py`.",
            "megatron_tp_marking_without_init.py",
        ),
    ],
}
"""Findings about a peer that the corpus cannot state (they need the peer's own richer metadata)."""

def make_peer_adapter(spec: str) -> Adapter:
    """The adapter for ``dcp``, ``dcp-lowest``, ``megatron``, ``megatron-0.16`` or ``awex``; ``ValueError`` when the
    peer is not importable (``make peers`` installs it)."""
    try:
        if spec == "dcp":
            return DCPAdapter()
        if spec == "dcp-lowest":
            return DCPAdapter(lowest_rank=True)
        if spec == "megatron":
            target = megatron_target()
            if not (target / "megatron" / "core" / "resharding" / "planner.py").is_file():
                raise ImportError(f"no megatron-core 0.19.2 in {target}")
            return MegatronAdapter(target=str(target))
        if spec == "megatron-0.16":
            return MegatronAdapter()
        if spec == "awex":
            return AwexAdapter()
    except Exception as exc:  # ImportError, or whatever the peer's own imports raise here
        pin = PEER_PINS["dcp" if spec.startswith("dcp") else spec] if spec in PEER_SPECS else "?"
        raise ValueError(f"planner {spec!r}: the peer is not importable ({type(exc).__name__}: {exc}); "
                         f"`make peers` installs {pin}") from None
    raise ValueError(f"planner {spec!r}: not a peer ({', '.join(PEER_SPECS)})")


@dataclass(frozen=True)
class WorkerTimed:
    """A peer's planning output with the (CPU, wall) seconds its planning costs a user, timed by the
    peer's side: from a worker subprocess (megatron-core 0.19.2: the slowest rank's call, not the
    round trip of encoding, pipes and decoding), or one rank's own calls where each rank plans for
    itself (Awex: ``AwexAdapter.rank_seconds``; DCP: ``DCPAdapter.call_peer_timed``). ``refplan
    bench`` reports ``planning_seconds`` instead of its own clock, and ``build_seconds``, where
    set, instead of its clock around the build (DCP: the slowest source rank's local save plan)."""

    output: Any
    planning_seconds: tuple[float, float]
    build_seconds: tuple[float, float] | None = None


def bench_contender(
    spec: str,
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]],
    *,
    endpoints: Mapping[str, Mapping[int, int]] | None = None,
    element_size: Mapping[str, int] | None = None,
) -> tuple[str, Any, Any] | str:
    """(peer name, planning call, conversion) for ``refplan bench``, or why the peer cannot run.

    Translation (and its exactness check, minus the element-level memory check) happens here, not
    timed; the zero-argument call runs only the peer's own planning routine, and the conversion
    turns its output into plan dicts afterwards (not timed either). ``megatron`` (0.19.2) plans in
    a worker subprocess: its call returns ``WorkerTimed``, the seconds the worker measured around
    ``build_plan_from_rosters`` alone, the slowest destination rank's own call (each rank plans for
    itself, at once); Awex likewise returns one rank's seconds (``AwexAdapter.rank_seconds``), its
    global call run for the conversion only, and DCP the coordinator's global plans with the slowest
    target rank's own load plan (``DCPAdapter.call_peer_timed``); ``megatron-0.16`` is timed
    in-process (its rank 0 plans for every rank). Endpoints
    reach only the peer whose planner reads them (Megatron's global ranks); DCP and Awex plan
    without them, and the bench accounts loads per process from the plans as for every contender.
    """
    try:
        adapter: Any = make_peer_adapter(spec)
    except ValueError as exc:
        return str(exc)
    adapter.check_memory = False
    if hasattr(adapter, "one_world"):
        adapter.one_world = False  # time Megatron's loop on the scenario's ranks (see MegatronAdapter.one_world)
    raw: dict[str, Any] = {
        "id": f"bench/{spec}", "why": "bench", "tags": [],
        "parameters": {n: {"target": t.to_dict(), "source": s.to_dict()} for n, (t, s) in sorted(pairs.items())},
        "expect": {"outcome": "accept"},
    }
    if endpoints is not None and "endpoints" in adapter.features:
        raw["endpoints"] = {side: {str(k): v for k, v in endpoints[side].items()} for side in ("source", "target")}
    if element_size is not None:
        raw["element_size"] = dict(element_size)
    from ..corpus import Expect

    case = Case(raw["id"], "bench", "bench", (), raw, Expect("accept"))
    try:
        problem = adapter.translate(case)
    except Inexpressible as exc:
        return f"unsupported: {exc}"

    worker = getattr(adapter, "_worker", None)

    rank_seconds = getattr(adapter, "rank_seconds", None)
    call_peer_timed = getattr(adapter, "call_peer_timed", None)

    def run() -> Any:
        with _quiet():
            if callable(call_peer_timed):  # DCP: the coordinator's steps and the slowest rank's own plan
                return WorkerTimed(*call_peer_timed(problem))
            output = adapter.call_peer(problem)
            if callable(rank_seconds):  # Awex: what one rank pays, each planning for itself at once
                return WorkerTimed(output, rank_seconds(problem))
        if worker is not None:  # megatron-core 0.19.2: the seconds its worker timed, not the round trip
            return WorkerTimed(output, worker.seconds)
        return output

    def convert(output: Any) -> dict[str, Any]:
        if isinstance(output, WorkerTimed):
            output = output.output
        plans: dict[str, Any] = adapter.convert(problem, output)
        return plans

    return adapter.name, run, convert
