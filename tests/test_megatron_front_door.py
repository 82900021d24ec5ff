"""The Megatron adapters' ``ParameterMetadata`` against what Megatron's own metadata path reports.

The adapters build one ``ParameterMetadata`` per rank and parameter field for field from a case (a
case is a layout, not a model). Here the same configurations are built as real Megatron models on
CPU (``ColumnParallelLinear``, ``RowParallelLinear`` and a replicated LayerNorm-like parameter, one
simulated rank at a time under a fake process group, in ``megatron_worker.py``) and read by the
release's own path: 0.16.1's ``extract_param_metadata`` as ``build_centralized_reshard_plan`` calls it,
0.19.2's ``_extract_module_metadata`` as ``build_local_reshard_plan`` calls it (with its rank offset for
an engine on other ranks). Every field of every rank's metadata must be equal: a difference means the
peer is judged on input its front door never produces.

Grouped experts: Megatron builds them only through Transformer Engine (``TEGroupedLinear``,
megatron/core/extensions/transformer_engine.py:1459 in 0.16.1), which is not installed here (it needs
CUDA). The worker builds the parameters TE would hold instead, with the attributes TE and Megatron stamp
on them: ``GroupedLinear.reset_parameters`` marks every ``weightK`` tensor-parallel on axis 0 with
stride 1 (TE's grouped_linear.py:730-738 at 8ebb47e5; ``parallel_mode`` is None once
``TEGroupedLinear`` takes the expert communication over under EP, transformer_engine.py:1520-1531),
and ``TEGroupedLinear`` sets ``allreduce=False`` on them under EP (transformer_engine.py:1551), in a
``pg_collection`` with EP and expert-TP groups; then the same extractors read them
(``test_expert_metadata_is_te_marked``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core.resharding.utils")

from refplan.conformance.corpus import parse_case
from refplan.conformance.explore import build_case
from refplan.conformance.peers import make_peer_adapter, megatron_target

WORKER = Path(__file__).resolve().parents[1] / "refplan" / "conformance" / "peers" / "megatron_worker.py"
KIND = {0: "column", 1: "row", None: "norm"}
DTYPE = {None: "float32", 2: "bfloat16", 4: "float32", 8: "float64"}


def _param(shape: list[int], axis: int | None, size: int | None = None) -> dict[str, Any]:
    return {"shape": shape, "axis": axis, "element_size": size}


def _side(tp: int, dp: int) -> dict[str, int]:
    return {"tp": tp, "dp": dp}


CONFIGS: dict[str, dict[str, Any]] = {
    # the collocated refit of the Megatron findings: column, row and a replicated norm
    "tp2dp2-to-tp2dp2": {"source": _side(2, 2), "target": _side(2, 2), "experts": 0,
                         "params": [_param([32, 16], 0), _param([16, 32], 1), _param([16], None)]},
    # a pure-DP trainer (TP=1: ColumnParallelLinear marks its weight TP with one-rank groups) -> TP4
    "tp1dp4-to-tp4": {"source": _side(1, 4), "target": _side(4, 1), "experts": 0,
                      "params": [_param([32, 16], 0), _param([8], None)]},
    # a row-parallel weight in 2-byte elements, TP4 -> TP2xDP2
    "tp4-to-tp2dp2-bf16": {"source": _side(4, 1), "target": _side(2, 2), "experts": 0,
                           "params": [_param([16, 32], 1, 2), _param([32, 16], 0, 2)]},
}
"""Configurations in ``explore.build_case``'s form; parameter ``i`` is ``layers.{i}.weight`` (split) or
``layers.{i}.norm`` (replicated), as the real model names it."""


class _Extractor:
    """A ``megatron_worker.py`` process answering ``extract`` requests for one release."""

    def __init__(self, folder: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-P", str(WORKER), folder], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        self.version = json.loads(self.proc.stdout.readline())["ready"]

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        assert "error" not in answer, answer
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class _AdapterWorker:
    """0.19.2's extractor: the adapter's own worker process (one process start fewer)."""

    def __init__(self, adapter: Any) -> None:
        self.worker = adapter._worker

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.worker._ask(request)
        assert "error" not in answer, answer
        return answer


ADAPTERS: dict[str, Any] = {}


def _adapter(planner: str) -> Any:
    if planner not in ADAPTERS:
        ADAPTERS[planner] = make_peer_adapter(planner)
    return ADAPTERS[planner]


@pytest.fixture(scope="module")
def extractors() -> Any:
    started: dict[str, Any] = {"megatron-0.16": _Extractor("-")}
    target = megatron_target()
    if (target / "megatron" / "core" / "resharding" / "planner.py").is_file():
        started["megatron"] = _AdapterWorker(_adapter("megatron"))
    yield started
    started["megatron-0.16"].close()


def _models(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for role in ("source", "target"):
        params = [{"name": f"layers.{i}.{'weight' if p['axis'] is not None else 'norm'}", "kind": KIND[p["axis"]],
                   "shape": p["shape"], "dtype": DTYPE[p["element_size"]]} for i, p in enumerate(config["params"])]
        out[role] = {"tp": config[role]["tp"], "params": params}
    return out


def _real(extractor: _Extractor, config: dict[str, Any], collocated: bool) -> dict[str, dict[int, dict[str, Any]]]:
    """{side: {rank: {name: fields}}} from Megatron's own metadata path."""
    models = _models(config)
    ws = config["source"]["tp"] * config["source"]["dp"]
    wt = config["target"]["tp"] * config["target"]["dp"]
    if collocated:
        assert ws == wt, "a collocated refit holds both models on every rank"
        clusters = [{"world": ws, "offset": 0, "models": models}]
    else:  # 0.19.2: the engine is a cluster of its own, its ranks offset by the trainer's world
        clusters = [{"world": ws, "offset": 0, "models": {"source": models["source"]}},
                    {"world": wt, "offset": ws, "models": {"target": models["target"]}}]
    answer = extractor.ask({"extract": {"clusters": clusters}})["extract"]
    return {side: {int(rank): {m["resolved_name"]: m for m in metas} for rank, metas in answer[side].items()}
            for side in ("source", "target")}


def _adapter_fields(planner: str, config: dict[str, Any], collocated: bool) -> dict[str, dict[int, dict[str, Any]]]:
    """{side: {rank: {name: fields}}} as the adapter hands them to the planner."""
    raw = build_case({**config, "collocated": collocated}, planner)
    case = parse_case({**raw, "expect": {"outcome": "accept"}}, "explore", "test")
    adapter = _adapter(planner)
    problem = adapter.translate(case)
    full = adapter.planner_metadata(problem)
    return {side: {rank: dict(by_name) for rank, by_name in full[side].items()} for side in ("source", "target")}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("planner, collocated", [("megatron-0.16", True), ("megatron", True), ("megatron", False)])
def test_adapter_metadata_is_megatrons_own(extractors: Any, planner: str, collocated: bool, name: str) -> None:
    if planner not in extractors:
        pytest.skip("megatron-core 0.19.2 is not installed (`make peers`)")
    config = CONFIGS[name]
    worlds = {config[side]["tp"] * config[side]["dp"] for side in ("source", "target")}
    if collocated and len(worlds) > 1:
        pytest.skip("a collocated refit needs one world for both models")
    real = _real(extractors[planner], config, collocated)
    ours = _adapter_fields(planner, config, collocated)
    assert sorted(ours["source"]) == sorted(real["source"]) and sorted(ours["target"]) == sorted(real["target"])
    differences = [(side, rank, param, field, ours[side][rank][param].get(field), value)
                   for side in ("source", "target") for rank, by_name in real[side].items()
                   for param, fields in by_name.items() for field, value in fields.items()
                   if ours[side][rank][param].get(field) != value]
    assert not differences, "(side, rank, parameter, field, adapter, Megatron):\n" + "\n".join(map(str, differences))


@pytest.mark.parametrize("planner", ["megatron-0.16", "megatron"])
def test_interleaved_gated_weight(extractors: Any, planner: str) -> None:
    """A gated MLP's fc1 (``ColumnParallelLinear(stride=2)``: [gate; up] blocks interleaved over TP)
    in a collocated TP2xDP2 -> TP4 refit. ``explore.build_case`` has no interleaved layout, so the case's
    maps are read back from Megatron's own metadata (``interop.from_megatron``); the adapter must
    recover every field from that layout, ``partition_stride`` 2 included."""
    if planner not in extractors:
        pytest.skip("megatron-core 0.19.2 is not installed (`make peers`)")
    from megatron.core.resharding.utils import ParameterMetadata

    from refplan.interop import from_megatron

    fc1 = [{"name": "layers.0.weight", "kind": "column", "shape": [32, 16], "stride": 2}]
    answer = extractors[planner].ask({"extract": {"clusters": [{"world": 4, "offset": 0, "models": {
        "source": {"tp": 2, "params": fc1}, "target": {"tp": 4, "params": fc1}}}]}})["extract"]
    real = {side: {int(r): {m["resolved_name"]: m for m in ms} for r, ms in answer[side].items()}
            for side in ("source", "target")}
    shared = set(ParameterMetadata.__dataclass_fields__)  # 0.16.1's fields: what from_megatron reads

    def maps(side: str) -> Any:
        by_rank = {r: [ParameterMetadata(**{**{k: v for k, v in m.items() if k in shared}, "shape": tuple(m["shape"]),
                                            "dtype": getattr(torch, m["dtype"])}) for m in ms.values()]
                   for r, ms in real[side].items()}
        return from_megatron(by_rank)["layers.0.weight"]

    src, tgt = maps("source"), maps("target")
    assert tgt.pieces_by_rank[0][0].shape[0] == 4  # interleaved: 4-row blocks, not one 8-row box
    raw = {"id": "explore/stride", "why": "stride", "tags": [], "expect": {"outcome": "accept"},
           "parameters": {"layers.0.weight": {"target": tgt.to_dict(), "source": src.to_dict()}},
           "endpoints": {"source": {str(r): r for r in range(4)}, "target": {str(r): r for r in range(4)}}}
    adapter = _adapter(planner)
    ours = adapter.planner_metadata(adapter.translate(parse_case(raw, "explore", "test")))
    for side in ("source", "target"):
        for rank, by_name in real[side].items():
            assert ours[side][rank]["layers.0.weight"] == by_name["layers.0.weight"], (side, rank)
    assert real["target"][0]["layers.0.weight"]["partition_stride"] == 2


def test_the_comparison_can_fail(extractors: Any) -> None:
    """A real model of another layout (DP groups [0, 1] / [2, 3] instead of [0, 2] / [1, 3]: TP1xDP2
    models side by side, not TP2xDP2) differs from the adapter's TP2xDP2 metadata in its groups."""
    config = CONFIGS["tp2dp2-to-tp2dp2"]
    real = _real(extractors["megatron-0.16"], {**config, "source": _side(1, 4)}, True)
    ours = _adapter_fields("megatron-0.16", config, True)
    assert real["source"][0]["layers.0.weight"]["data_parallel_group_ranks"] != \
        ours["source"][0]["layers.0.weight"]["data_parallel_group_ranks"]


def test_tp_marking_without_initialization(extractors: Any) -> None:
    """``perform_initialization=False`` (a model built to load a checkpoint into): megatron-core 0.16.1's
    ColumnParallelLinear/RowParallelLinear never set the tensor-parallel attributes (they are set only
    inside ``_initialize_affine_weight_*``, which tensor_parallel/layers.py:855/877 and 1178/1201 skip),
    so ``extract_param_metadata`` reports a TP-split weight as replicated; 0.19.2 sets them either way
    (layers.py:991-994, 1012-1015). What ``docs/peers/megatron_tp_marking_without_init.py`` shows."""
    models = _models(CONFIGS["tp2dp2-to-tp2dp2"])
    marked = {}
    for planner, extractor in sorted(extractors.items()):
        answer = extractor.ask({"extract": {"perform_initialization": False,
                                            "clusters": [{"world": 4, "offset": 0, "models": models}]}})["extract"]
        marked[planner] = {m["name"]: m["is_tp"] for m in answer["source"]["0"]}
    assert marked["megatron-0.16"] == {"layers.0.weight": False, "layers.1.weight": False, "layers.2.norm": False}
    if "megatron" in marked:
        assert marked["megatron"] == {"layers.0.weight": True, "layers.1.weight": True, "layers.2.norm": False}


EXPERT_CONFIG: dict[str, Any] = {
    "source": {"tp": 2, "dp": 2, "ep": 2}, "target": {"tp": 4, "dp": 1, "ep": 4}, "experts": 4,
    "expert_shape": [8, 16], "params": [_param([32, 16], 0), _param([16], None)]}
"""An MoE refit in ``explore.build_case``'s form: dense TP2xDP2 -> TP4, four experts EP2 x expert-DP2 ->
EP4 (expert ``e`` on EP rank ``e // (4 / EP)`` of every EP group), named ``experts.{e}.w1``."""


@pytest.mark.parametrize("planner, collocated", [("megatron-0.16", True), ("megatron", True), ("megatron", False)])
def test_expert_metadata_is_te_marked(extractors: Any, planner: str, collocated: bool) -> None:
    """Every field of an expert's metadata is what the release's extractor reports for a TE grouped
    expert weight of the same model (is_tp on axis 0 in a one-rank expert-TP group, the model's DP
    group, ``is_ep`` with its EP group, the global expert index), matched by global expert index (the
    real ``weightK`` is local; its ``resolved_name`` global); the dense parameters field for field.
    Then 0.16.1 (or 0.19.2) plans with them and reads every expert from a rank that holds it."""
    if planner not in extractors:
        pytest.skip("megatron-core 0.19.2 is not installed (`make peers`)")
    config = EXPERT_CONFIG
    models = _models(config)
    for role in ("source", "target"):
        models[role]["experts"] = {"count": config["experts"], "ep": config[role]["ep"],
                                   "shape": config["expert_shape"]}
    ws = wt = 4
    clusters = ([{"world": ws, "offset": 0, "models": models}] if collocated else
                [{"world": ws, "offset": 0, "models": {"source": models["source"]}},
                 {"world": wt, "offset": ws, "models": {"target": models["target"]}}])
    answer = extractors[planner].ask({"extract": {"clusters": clusters, "num_experts": config["experts"]}})["extract"]

    def key(fields: dict[str, Any]) -> str:
        index = fields.get("global_expert_index")
        return fields["resolved_name"] if index is None else f"expert {index}"

    real = {side: {int(rank): {key(m): m for m in metas} for rank, metas in answer[side].items()}
            for side in ("source", "target")}
    raw = build_case({**config, "collocated": collocated}, planner)
    adapter = _adapter(planner)
    problem = adapter.translate(parse_case({**raw, "expect": {"outcome": "accept"}}, "explore", "test"))
    full = adapter.planner_metadata(problem)
    ours = {side: {rank: {key(m): m for m in by_name.values()} for rank, by_name in full[side].items()}
            for side in ("source", "target")}
    experts = 0
    for side in ("source", "target"):
        assert sorted(ours[side]) == sorted(real[side]), side
        for rank, by_key in real[side].items():
            assert sorted(ours[side][rank]) == sorted(by_key), (side, rank)
            for k, fields in by_key.items():
                mine = ours[side][rank][k]
                skip = {"name", "resolved_name"} if k.startswith("expert ") else set()
                differences = {f: (mine.get(f), v) for f, v in fields.items() if f not in skip and mine.get(f) != v}
                assert not differences, (side, rank, k, differences)
                if k.startswith("expert "):
                    experts += 1
                    assert fields["is_tp"] and fields["is_ep"] and fields["partition_dim"] == 0
                    assert fields["tensor_parallel_group_ranks"] == [rank]
    assert experts == 4 * 2 + 4  # every expert holder on both sides was compared
    holders = problem["loc_of"]["source"]
    read = 0
    for name, dst_rank, _dst, ops in adapter.call_peer(problem):
        for src_rank, _src, _to in ops:
            assert src_rank in holders[name], (name, dst_rank, src_rank, sorted(holders[name]))
            read += name.startswith("experts.")
    assert read == 4  # one whole read per expert and destination holder
