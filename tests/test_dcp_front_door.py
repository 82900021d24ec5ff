"""The DCP adapter plans through DCP's own front doors, not through objects it builds itself.

Each test builds the same save independently here, as a DCP user's ranks would (a fake process
group per rank, ``DTensor.from_local`` on a ``DeviceMesh``, ``DefaultSavePlanner`` local plans, the
coordinator's ``create_global_plan``), and checks that the adapter's plan reads every chunk from
the rank DCP itself chose to write it; a changed placement changes that choice in both. Cheap: a
handful of four-rank saves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from refplan.conformance.adapters import make_adapter
from refplan.conformance.corpus import Case, parse_case
from refplan.conformance.peers import Inexpressible
from refplan.conformance.peers.dcp import DTensorLayout, dtensor_layout
from refplan.maps import contiguous_split_map, replicated_map

torch = pytest.importorskip("torch")
from torch.distributed.tensor import Replicate, Shard  # noqa: E402

from refplan.interop import from_dtensor  # noqa: E402

WORLD = 4
MESH = (2, 2)
HSDP = [Replicate(), Shard(0)]


def _adapter() -> Any:
    try:
        return make_adapter("dcp")
    except ValueError as exc:  # pragma: no cover - torch is a dependency, DCP ships with it
        pytest.skip(str(exc))


def _case(params: Mapping[str, tuple[tuple[int, ...], list[Any]]], slug: str) -> Case:
    """One target rank loads every parameter whole from a save of DTensors on a (2, 2) mesh."""
    raw = {"id": f"explore/dcp-front-door-{slug}", "why": "test", "tags": [],
           "parameters": {n: {"target": replicated_map(shape, 1).to_dict(),
                              "source": from_dtensor(shape, MESH, placements).to_dict()}
                          for n, (shape, placements) in sorted(params.items())},
           "expect": {"outcome": "accept"}}
    return parse_case(raw, "explore", "explore")


def _dcp_writers(params: Mapping[str, tuple[tuple[int, ...], list[Any]]]) -> dict[tuple[str, tuple[int, ...]], int]:
    """(fqn, chunk offset) -> the rank DCP's ``create_global_plan`` keeps as that chunk's writer."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.tensor import DeviceMesh, DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.testing._internal.distributed.fake_pg import FakeStore

    planners, plans = [], []
    for rank in range(WORLD):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
        try:
            mesh = DeviceMesh("cpu", torch.arange(WORLD).reshape(MESH), _init_backend=False)
            state = {}
            for name, (shape, placements) in sorted(params.items()):
                local, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
                state[name] = DTensor.from_local(torch.zeros(local), mesh, placements, shape=torch.Size(shape),
                                                 stride=(shape[1], 1), run_check=False)
        finally:
            dist.destroy_process_group()
        planner = DefaultSavePlanner()
        planner.set_up_planner(state, is_coordinator=rank == 0)
        planners.append(planner)
        plans.append(planner.create_local_plan())
    global_plan, _ = planners[0].create_global_plan(plans)
    return {(i.index.fqn, tuple(i.index.offset)): rank for rank, p in enumerate(global_plan) for i in p.items}


def _readers(case: Case) -> dict[tuple[str, tuple[int, ...]], set[int]]:
    """(fqn, chunk offset) -> the source ranks the adapter's plan reads that chunk from."""
    adapter = _adapter()
    problem = adapter.translate(case)
    output = adapter.call_peer(problem)
    plans = adapter.convert(problem, output)
    chunk_at: dict[tuple[str, int], tuple[int, ...]] = {}
    for rank, plan in enumerate(problem.local_plans):
        for item in plan.items:
            chunk_at[(item.index.fqn, rank)] = tuple(item.index.offset)
    out: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    for name, plan in plans.items():
        for seg in plan["segments"]:
            rank = seg["source"][0]
            out.setdefault((name, chunk_at[(name, rank)]), set()).add(rank)
    return out


PARAMS = {"w0": ((1, 8), HSDP), "w1": ((4, 4), HSDP), "w2": ((2, 4), [Replicate(), Replicate()])}


def test_the_adapter_reads_each_chunk_from_the_writer_dcp_chose() -> None:
    want = _dcp_writers(PARAMS)
    got = _readers(_case(PARAMS, "a"))
    nonempty = {k: {v} for k, v in want.items() if k != ("w0", (1, 0))}  # w0's empty FSDP shard has nothing to read
    assert got == nonempty
    # the finding: rank 1 writes w2 and w1's second chunk, rank 3 only w0's empty chunk
    assert want[("w1", (2, 0))] == 1 and want[("w2", (0, 0))] == 1 and want[("w0", (1, 0))] == 3


def test_a_changed_placement_changes_the_writers_in_both() -> None:
    changed = {**PARAMS, "w2": ((2, 4), HSDP)}  # w2 sharded like the others instead of replicated
    want = _dcp_writers(changed)
    assert want != _dcp_writers(PARAMS)
    got = _readers(_case(changed, "b"))
    assert got == {k: {v} for k, v in want.items() if k != ("w0", (1, 0))}


def test_the_finding_is_quality_through_the_front_door() -> None:
    from refplan.conformance.runner import judge

    adapter = _adapter()
    case = _case(PARAMS, "c")
    case = parse_case({**case.raw, "expect": {"outcome": "accept", "max_sender_load": 8}}, "explore", "explore")
    verdict, reason, _ = judge(case, adapter.plan(case), adapter)
    assert verdict == "quality" and "moves 16 > 8" in reason


def test_layouts_are_found_as_torch_places_them_and_others_are_unsupported() -> None:
    assert dtensor_layout(from_dtensor((1, 8), MESH, HSDP), "w") == DTensorLayout((0, 1, 2, 3), (2, 2), (None, 0))
    assert dtensor_layout(from_dtensor((7, 3), (3,), [Shard(0)]), "w").shards == (0,)  # torch's 3, 3, 1
    with pytest.raises(Inexpressible, match="no DTensor layout"):
        dtensor_layout(contiguous_split_map((7, 3), [3, 2, 2], 0), "w")  # an even-first split torch never makes
    outcome = _adapter().plan(parse_case(
        {"id": "explore/dcp-front-door-split", "why": "test", "tags": [],
         "parameters": {"w": {"target": replicated_map((7, 3), 1).to_dict(),
                              "source": contiguous_split_map((7, 3), [3, 2, 2], 0).to_dict()}},
         "expect": {"outcome": "accept"}}, "explore", "explore"))
    assert outcome.kind == "unsupported" and "no DTensor layout" in outcome.message


def test_the_load_planner_itself_refuses_a_size_mismatch() -> None:
    """Shapes that differ between save and load reach ``DefaultLoadPlanner.create_local_plan``,
    whose own check refuses them (default_planner.py:500-507)."""
    case = parse_case({"id": "explore/dcp-front-door-shape", "why": "test", "tags": [],
                       "parameters": {"w": {"target": replicated_map((4, 8), 1).to_dict(),
                                            "source": replicated_map((8, 4), 2).to_dict()}},
                       "expect": {"outcome": "refuse", "error": "InvalidMapError"}}, "explore", "explore")
    outcome = _adapter().plan(case)
    assert outcome.kind == "refuse" and outcome.error == "ValueError" and "Size mismatch" in outcome.message
