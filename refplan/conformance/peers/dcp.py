"""PyTorch DCP (``torch.distributed.checkpoint``, torch 2.13.0) driven through its front doors.

A DCP user saves and loads state dicts of DTensors; DCP never sees a map. So the adapter first
finds, for every parameter and side, the DTensor layout that places exactly the case's boxes: a
``DeviceMesh`` over the side's locations (row-major, one to three mesh axes) with ``Replicate()``
or ``Shard(d)`` per mesh axis, shards as torch's own chunking makes them (uneven last shards,
empty shards included). A case no such layout produces (several boxes on one rank, a target that
leaves part of the tensor unloaded, overlapping or hand-placed chunks, strided shards) is
``unsupported`` with that reason: DCP's front door never sees it.

Then each rank is simulated as DCP's own callers run it: one fake process group per rank
(``torch.testing._internal.distributed.fake_pg.FakeStore``, backend ``fake``), a ``DeviceMesh``
built on it, ``DTensor.from_local`` of the rank's local tensor (an ``as_strided`` view where the
case puts the box in the rank's memory), and that rank's state dict handed to
``DefaultSavePlanner().set_up_planner`` + ``create_local_plan`` (rank 0 the coordinator). The
coordinator's ``create_global_plan`` over all local plans deduplicates replicas (DCP's only
replica choice) and writes the ``Metadata``; each target rank's ``DefaultLoadPlanner().set_up_planner
(state_dict, metadata)`` + ``create_local_plan`` gives its ``ReadItem``s, so DCP's own load checks
(missing keys, size mismatches) run. A read of a saved chunk is a copy from the rank DCP chose
to write it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ...box import Box, row_major_strides, volume
from ...errors import AffineTransferError
from ...maps import ParamAffineMap
from ..corpus import Case
from .common import (
    Inexpressible,
    PeerAdapter,
    _case_maps,
    _chunks,
    _dtype_name,
    _import,
    _no_options,
    _quiet,
    _rebuild_map,
    _segment,
    check_tiled,
    merge_dense,
    peer_version,
    timed_call,
)

_MAX_WORLD = 4096
"""Largest simulated world (one fake process group per rank)."""


@dataclass(frozen=True)
class DTensorLayout:
    """How DTensor places one parameter on one side: mesh ranks (row-major), mesh shape, and one
    placement per mesh axis (``None``: ``Replicate()``, ``d``: ``Shard(d)``)."""

    ranks: tuple[int, ...]
    mesh: tuple[int, ...]
    shards: tuple[int | None, ...]

    def describe(self) -> str:
        pl = ", ".join("Replicate()" if s is None else f"Shard({s})" for s in self.shards)
        return f"mesh {self.mesh} over ranks {list(self.ranks)}, placements [{pl}]"


def _factorizations(n: int, most: int = 3) -> list[tuple[int, ...]]:
    """Ordered factorizations of ``n`` into at most ``most`` factors > 1 (``(n,)`` first)."""
    out: list[tuple[int, ...]] = [(n,)]

    def grow(rest: int, prefix: tuple[int, ...]) -> None:
        if len(prefix) >= most:
            return
        for f in range(2, rest):
            if rest % f == 0:
                cand = (*prefix, f, rest // f)
                if len(cand) <= most:
                    out.append(cand)
                grow(rest // f, (*prefix, f))

    grow(n, ())
    return sorted(set(out), key=lambda t: (len(t), t))


def dtensor_layout(m: ParamAffineMap, what: str) -> DTensorLayout:
    """The DTensor layout whose local tensors are exactly ``m``'s boxes, or ``Inexpressible``.

    Boxes only: where a box sits in its rank's memory is the local tensor's own stride and offset
    (an ``as_strided`` view), which DCP never reads. Candidates are tried fewest mesh axes first,
    ``Replicate()`` before ``Shard``; each is placed by ``interop.from_dtensor`` (tested against
    torch's ``distribute_tensor``), and the front door itself is checked afterwards: the adapter's
    gate compares the case's maps with what DCP's own write items and chunk lists say.
    """
    from torch.distributed.tensor import Replicate, Shard

    from ...interop import from_dtensor

    boxes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for c in _chunks(m, what):
        if c.location in boxes:
            raise Inexpressible(f"{what}: location {c.location} holds more than one box; a DTensor's local tensor "
                                "is one box (one write item per rank and tensor, planner_helpers.py:177-194)")
        boxes[c.location] = (c.origin, c.shape)
    ranks = tuple(sorted(set(m.pieces_by_rank) | set(m.shard_shapes)))
    if not ranks:
        raise Inexpressible(f"{what}: no location")
    if any(r < 0 for r in ranks) or ranks[-1] >= _MAX_WORLD:
        raise Inexpressible(f"{what}: locations {ranks[0]}..{ranks[-1]} are not ranks of a world of at most "
                            f"{_MAX_WORLD}")
    import numpy as np

    ndim = len(m.logical_shape)
    for mesh in _factorizations(len(ranks)):
        for shards in itertools.product((None, *range(ndim)), repeat=len(mesh)):
            placements = [Replicate() if s is None else Shard(s) for s in shards]
            try:
                cand = from_dtensor(m.logical_shape, mesh, placements, mesh_locations=np.array(ranks).reshape(mesh))
            except AffineTransferError as exc:  # refplan's own limits (max_ndim), not DTensor's
                raise Inexpressible(f"{what}: interop.from_dtensor cannot place it ({exc})") from None
            got = {c.location: (c.origin, c.shape) for c in _chunks(cand, what)}
            if got == boxes:
                return DTensorLayout(ranks, mesh, tuple(shards))
    raise Inexpressible(f"{what}: no DTensor layout (Replicate/Shard over a mesh of locations {list(ranks)}, torch's "
                        "chunking) places these boxes, so no DCP save or load of a DTensor state dict has them")


@dataclass
class _FrontDoor:
    """What the fake ranks built and DCP planned locally; the global steps run in ``call_peer``."""

    names: list[str]
    logical: dict[str, tuple[int, ...]]
    layouts: dict[tuple[str, str], DTensorLayout]
    shapes: dict[tuple[str, str], tuple[int, ...]]
    """(name, side) -> global shape (the sides may differ; ``DefaultLoadPlanner`` refuses that)."""
    shard_shapes: dict[tuple[str, str], dict[int, tuple[int, ...]]]
    source_states: list[dict[str, Any]]
    """Rank r's DCP state dict for the save (``{fqn: DTensor}``)."""
    target_states: list[dict[str, Any]]
    save_planners: list[Any]
    local_plans: list[Any]
    """``DefaultSavePlanner.create_local_plan()`` of every source rank, in rank order."""
    memory: dict[tuple[str, str, int], tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    """(name, side, rank) -> (storage offset, strides) of that rank's local tensor."""
    save_seconds: tuple[float, float] = (0.0, 0.0)
    """(CPU, wall) of the slowest source rank's ``set_up_planner`` + ``create_local_plan``: what a
    save waits for before the coordinator's global plan, every rank planning for itself at once."""


class DCPAdapter(PeerAdapter):
    """torch.distributed.checkpoint through ``DefaultSavePlanner``/``DefaultLoadPlanner`` on DTensor
    state dicts: save-side dedup chooses the replica, each load reads from the chosen writer."""

    merges_boxes = True
    """A rank's pieces forming one dense row-major box are one local tensor: that DTensor's."""

    def __init__(self, lowest_rank: bool = False) -> None:
        self.lowest_rank = lowest_rank
        self._planner = _import("torch.distributed.checkpoint.default_planner")
        self._helpers = _import("torch.distributed.checkpoint.planner_helpers")
        self._md = _import("torch.distributed.checkpoint.metadata")
        self._pl = _import("torch.distributed.checkpoint.planner")
        self._torch = _import("torch")
        self._dist = _import("torch.distributed")
        self._tensor = _import("torch.distributed.tensor")
        self._fake = _import("torch.testing._internal.distributed.fake_pg")
        version = peer_version("torch")
        self.name = f"dcp{'-lowest' if lowest_rank else ''} (torch {version})"

    # ------------------------------------------------------------------ translation

    def translate(self, case: Case) -> _FrontDoor:
        _no_options(case)
        torch = self._torch
        pairs = _case_maps(case, None)  # shapes may differ: DefaultLoadPlanner refuses that itself
        given = {n: (merge_dense(t), merge_dense(s)) for n, (t, s) in pairs.items()}
        names = sorted(pairs)
        layouts: dict[tuple[str, str], DTensorLayout] = {}
        shard_shapes: dict[tuple[str, str], dict[int, tuple[int, ...]]] = {}
        dtypes: dict[str, Any] = {}
        for name in names:
            tmap, smap = given[name]
            dtypes[name] = getattr(torch, _dtype_name(case, name))
            for side, m in (("source", smap), ("target", tmap)):
                what = f"parameter {name!r}, {side}"
                if any(m.shard_shapes.get(loc) is None for loc in m.pieces_by_rank):
                    raise Inexpressible(f"{what}: a location without a shard shape")
                if self.check_memory:
                    check_tiled(pairs[name][0 if side == "target" else 1], what)
                layouts[(name, side)] = dtensor_layout(m, what)
                shard_shapes[(name, side)] = dict(m.shard_shapes)
        shapes = {(n, side): pairs[n][i].logical_shape for n in names for side, i in (("target", 0), ("source", 1))}
        placed: dict[str, dict[tuple[str, int], tuple[int, tuple[int, ...]]]] = {}  # the case's memory placement
        for side, index in (("source", 1), ("target", 0)):
            placed[side] = {(n, c.location): (c.dest_offset, c.dest_strides)
                            for n in names for c in _chunks(given[n][index], f"parameter {n!r}, {side}")}
        problem = self.front_door(names, layouts, shapes, dtypes, shard_shapes, placed)
        self._gate(pairs, problem)
        return problem

    def front_door(self, names: list[str], layouts: dict[tuple[str, str], DTensorLayout],
                   shapes: dict[tuple[str, str], tuple[int, ...]], dtypes: dict[str, Any],
                   shard_shapes: dict[tuple[str, str], dict[int, tuple[int, ...]]] | None = None,
                   placed: dict[str, dict[tuple[str, int], tuple[int, tuple[int, ...]]]] | None = None) -> _FrontDoor:
        """What DCP's users' processes build before any global planning, from DTensor layouts directly
        (``layouts[(name, "source"|"target")]``, global ``shapes`` per side, torch ``dtypes`` per
        name): every rank's state dict of DTensors on both sides, and every source rank's
        ``DefaultSavePlanner`` set up on its state dict with its ``create_local_plan()``.

        One function for ``translate`` (layouts found from a case's maps) and for ``refplan bench``
        (layouts stated by its plain descriptions), so DCP's build cost has one definition.
        ``shard_shapes`` (name, side) -> {rank: buffer shape} and ``placed`` side -> {(name, rank):
        (storage offset, strides)} say where a case puts each local tensor in its rank's memory;
        without them a rank's local tensor is its whole buffer, dense and row-major at offset 0.
        """
        problem = _FrontDoor(names, {n: shapes[(n, "source")] for n in names}, layouts, shapes,
                             {} if shard_shapes is None else shard_shapes, [], [], [], [])
        for side in ("source", "target"):
            states = self._rank_states(problem, side, (placed or {}).get(side, {}), dtypes)
            if side == "source":
                problem.source_states = states
            else:
                problem.target_states = states
        with _quiet():
            for rank, state in enumerate(problem.source_states):
                (planner, plan), cpu, wall = timed_call(lambda rank=rank, state=state: self._save_plan(rank, state))
                problem.save_planners.append(planner)
                problem.local_plans.append(plan)
                problem.save_seconds = (max(problem.save_seconds[0], cpu), max(problem.save_seconds[1], wall))
        return problem

    def _rank_states(self, problem: _FrontDoor, side: str, placed: dict[tuple[str, int], tuple[int, tuple[int, ...]]],
                     dtypes: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's state dict of DTensors for one side, each rank in its own fake process group."""
        torch, dist, dt = self._torch, self._dist, self._tensor
        if dist.is_initialized():
            raise RuntimeError("the DCP adapter simulates every rank in its own fake process group, but this "
                               "process already has a default process group")
        world = 1 + max(r for n in problem.names for r in problem.layouts[(n, side)].ranks)
        if world > _MAX_WORLD:
            raise Inexpressible(f"{side}: a world of {world} ranks (at most {_MAX_WORLD} are simulated)")
        states: list[dict[str, Any]] = []
        with _quiet():
            for rank in range(world):
                state: dict[str, Any] = {}
                mine = [n for n in problem.names if rank in problem.layouts[(n, side)].ranks]
                if mine:
                    dist.init_process_group("fake", store=self._fake.FakeStore(), rank=rank, world_size=world)
                    try:
                        meshes: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = {}
                        for name in mine:
                            lay = problem.layouts[(name, side)]
                            key = (lay.ranks, lay.mesh)
                            if key not in meshes:
                                meshes[key] = dt.DeviceMesh("cpu", torch.tensor(lay.ranks).reshape(lay.mesh),
                                                            _init_backend=False)
                            state[name] = self._dtensor(problem, side, name, rank, meshes[key], dtypes[name],
                                                        placed.get((name, rank)))
                    finally:
                        dist.destroy_process_group()
                states.append(state)
        return states

    def _dtensor(self, problem: _FrontDoor, side: str, name: str, rank: int, mesh: Any, dtype: Any,
                 placed: tuple[int, tuple[int, ...]] | None) -> Any:
        """Rank ``rank``'s DTensor of ``name``: its local tensor has torch's local shape and sits in a
        buffer of the case's shard shape where the case puts it (dense at 0 for an empty shard)."""
        torch, dt = self._torch, self._tensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        lay = problem.layouts[(name, side)]
        placements = [dt.Replicate() if s is None else dt.Shard(s) for s in lay.shards]
        logical = problem.shapes[(name, side)]
        local, _ = compute_local_shape_and_global_offset(logical, mesh, placements)
        local = tuple(int(n) for n in local)
        shard = problem.shard_shapes.setdefault((name, side), {}).setdefault(rank, local)
        offset, strides = placed if placed is not None else (0, row_major_strides(local))
        last = offset + sum((e - 1) * s for e, s in zip(local, strides)) if volume(local) else -1
        if len(strides) != len(local) or offset < 0 or min(strides, default=0) < 0 or last >= max(volume(shard), 1):
            raise Inexpressible(f"parameter {name!r}, {side}, location {rank}: the local tensor {local} at offset "
                                f"{offset} with strides {tuple(strides)} is not inside its shard {shard}")
        # DCP's planners read only the local tensor's shape, dtype and properties (and the placement
        # is recorded in ``problem.memory``, checked above), so one element broadcast to the local
        # shape stands for the shard: a real buffer per rank reserved the whole model's memory
        # (about 67 GB of address space for the bench's llama-sync, 2 TB for moe-model), enough to
        # make the next fork of the process fail with ENOMEM.
        view = torch.zeros((), dtype=dtype).expand(local)
        problem.memory[(name, side, rank)] = (offset, tuple(strides))
        return dt.DTensor.from_local(view, mesh, placements, shape=torch.Size(logical),
                                     stride=torch.Size(row_major_strides(logical)), run_check=False)

    # ------------------------------------------------------------------ contract

    def contract(self, case: Case, problem: Any) -> list[tuple[str, ...]]:
        """What DCP's save/load contract allows here and refplan's rules forbid (see ``PeerAdapter``)."""
        torch = peer_version("torch") or "?"
        out: list[tuple[str, ...]] = []
        if self.lowest_rank:
            out.append(("quality", f"torch {torch}: DefaultSavePlanner(dedup_save_to_lowest_rank=True) "
                                   "(default_planner.py:78, _dedup_save_plans.py:43-44) writes every duplicate from "
                                   "its lowest rank, as the user asked"))
        bound = case.expect.max_sender_load
        if bound is not None:
            sizes = case.raw.get("element_size") or {}
            items = [(i.index.fqn, tuple(i.tensor_data.chunk.offsets), tuple(i.tensor_data.chunk.sizes))
                     for p in problem.local_plans for i in p.items]
            largest = max((volume(s) * int(sizes.get(n, 1)) for n, _, s in items), default=0)
            if largest > bound:
                out.append(("quality", f"torch {torch}: DCP writes each saved chunk whole from one rank "
                                       f"(_dedup_save_plans.py:42-55); a chunk of {largest} exceeds the bound "
                                       f"{bound}, which no item-granular save can meet"))
            else:
                read = self._most_read_chunk(case, problem, items)
                if read is not None and read[0] > bound:
                    out.append(("quality", f"torch {torch}: a checkpoint holds one copy of each chunk "
                                           "(_dedup_save_plans.py:42-55 keeps one writer per chunk) and every load "
                                           "reads it from that copy (planner_helpers.py:254); the chunk at "
                                           f"{read[1]} is read {read[0]} in all, more than the bound {bound}"))
        return out

    @staticmethod
    def _most_read_chunk(case: Case, problem: _FrontDoor,
                         items: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
                         ) -> tuple[int, tuple[int, ...]] | None:
        """(bytes, origin) of the saved chunk the target ranks read most in all: whichever rank DCP
        keeps as its one writer sends all of it, so no DCP save meets a bound below it. ``None``
        when there are too many chunk pairs to count."""
        sizes = case.raw.get("element_size") or {}
        reads: dict[str, list[Box]] = {}
        for state in problem.target_states:
            for name, value in state.items():
                for c in value.__create_chunk_list__():
                    reads.setdefault(name, []).append(Box(tuple(c.offsets), tuple(c.sizes)))
        best: tuple[int, tuple[int, ...]] | None = None
        pairs = 0
        for name, origin, shape in dict.fromkeys(items):
            boxes = reads.get(name, [])
            pairs += len(boxes)
            if pairs > 1 << 20:
                return None
            total = 0
            for b in boxes:
                overlap = 1
                for o, e, to, te in zip(origin, shape, b.origin, b.extent):
                    overlap *= max(0, min(o + e, to + te) - max(o, to))
                total += overlap
            total *= int(sizes.get(name, 1))
            if best is None or total > best[0]:
                best = (total, origin)
        return best

    # ------------------------------------------------------------------ reading the peer's input back

    def rebuild(self, problem: Any) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        """The maps DCP's own objects describe: each source rank's write items (its local plan) and
        each target rank's chunk list (``DTensor.__create_chunk_list__``, what the load planner
        reads), placed in memory where the rank's local tensor sits."""
        entries: dict[tuple[str, str], list[Any]] = {}
        for rank, plan in enumerate(problem.local_plans):
            for item in plan.items:
                chunk = item.tensor_data.chunk
                self._entry(problem, entries, item.index.fqn, "source", rank, chunk)
        for rank, state in enumerate(problem.target_states):
            for name, value in state.items():
                for chunk in value.__create_chunk_list__():
                    self._entry(problem, entries, name, "target", rank, chunk)
        out: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
        for name in problem.names:
            sides = []
            for side in ("target", "source"):
                got = entries.get((name, side), [])
                for loc, shard in problem.shard_shapes[(name, side)].items():
                    if all(e[0] != loc for e in got):
                        zero = (0,) * len(shard)
                        got.append((loc, zero, zero, shard, 0, row_major_strides(shard)))
                sides.append(_rebuild_map(problem.shapes[(name, side)], got))
            out[name] = (sides[0], sides[1])
        return out

    def _entry(self, problem: _FrontDoor, entries: dict[tuple[str, str], list[Any]], name: str, side: str,
               rank: int, chunk: Any) -> None:
        off, strides = problem.memory[(name, side, rank)]
        entries.setdefault((name, side), []).append(
            (rank, tuple(chunk.offsets), tuple(chunk.sizes), problem.shard_shapes[(name, side)][rank], off, strides))

    # ------------------------------------------------------------------ the peer's planning

    def save(self, problem: Any) -> tuple[list[Any], Any]:
        """DCP's global save planning on the coordinator: (deduplicated plans, ``Metadata``)."""
        global_plan, metadata = problem.save_planners[0].create_global_plan(problem.local_plans)
        return list(global_plan), metadata

    def _save_plan(self, rank: int, state: dict[str, Any]) -> tuple[Any, Any]:
        """(planner, local plan) of one source rank's ``DefaultSavePlanner``."""
        planner = self._planner.DefaultSavePlanner(dedup_save_to_lowest_rank=self.lowest_rank)
        planner.set_up_planner(state, is_coordinator=rank == 0)
        return planner, planner.create_local_plan()

    def _load_plan(self, rank: int, state: dict[str, Any], metadata: Any) -> Any:
        """One target rank's ``DefaultLoadPlanner`` local plan."""
        planner = self._planner.DefaultLoadPlanner()
        planner.set_up_planner(state, metadata, is_coordinator=rank == 0)
        return planner.create_local_plan()

    def call_peer(self, problem: Any) -> tuple[list[Any], Any]:
        """The coordinator's ``create_global_plan`` (dedup, metadata), then every target rank's
        ``DefaultLoadPlanner`` local plan and the coordinator's global load plan."""
        global_plan, metadata = self.save(problem)
        load_plans = [self._load_plan(rank, state, metadata) for rank, state in enumerate(problem.target_states)]
        return global_plan, self._planner.DefaultLoadPlanner().create_global_plan(load_plans)

    def call_peer_timed(self, problem: Any) -> tuple[tuple[list[Any], Any], tuple[float, float]]:
        """``call_peer``'s answer, with the (CPU, wall) seconds a sync waits for, as
        ``torch.distributed.checkpoint`` runs it (state_dict_saver.py, state_dict_loader.py): the
        coordinator unpickles every rank's local save plan (``gather_object``), plans globally and
        pickles the global plans it scatters; then the slowest target rank's own load plan (every
        rank plans for itself, at once); then the coordinator unpickles the load plans, plans globally
        and pickles what it scatters. The (de)serialization stands where Megatron-Core's all-gathered
        metadata and Awex's global ``ParameterMeta``s are charged as their builds; each rank pickling
        its own plan (at once) and unpickling its own answer is not charged, for any peer.
        ``call_peer`` runs the ranks' load plans one after another, which is no rank's cost (a
        peer-maintainer review, 2026-12-06; the serialization after a second review)."""
        import pickle

        charged = [0.0, 0.0]  # the coordinator's steps in sequence, then the slowest rank's own load plan

        def coordinator(call: Any) -> Any:
            value, cpu, wall = timed_call(call)
            charged[0] += cpu
            charged[1] += wall
            return value

        sent = [pickle.dumps(plan) for plan in problem.local_plans]  # each source rank's own, at once
        coordinator(lambda: [pickle.loads(blob) for blob in sent])
        global_plan, metadata = coordinator(lambda: self.save(problem))
        coordinator(lambda: [pickle.dumps(plan) for plan in global_plan])
        load_plans, slowest = [], (0.0, 0.0)
        for rank, state in enumerate(problem.target_states):
            plan, cpu, wall = timed_call(lambda rank=rank, state=state: self._load_plan(rank, state, metadata))
            load_plans.append(plan)
            slowest = (max(slowest[0], cpu), max(slowest[1], wall))
        charged[0] += slowest[0]
        charged[1] += slowest[1]
        sent = [pickle.dumps(plan) for plan in load_plans]
        coordinator(lambda: [pickle.loads(blob) for blob in sent])
        loaded = coordinator(lambda: self._planner.DefaultLoadPlanner().create_global_plan(load_plans))
        coordinator(lambda: [pickle.dumps(plan) for plan in loaded])
        return (global_plan, loaded), (charged[0], charged[1])

    def convert(self, problem: Any, output: tuple[list[Any], Any]) -> dict[str, Any]:
        """Every ``ReadItem`` as one strided segment from the rank DCP chose to write its chunk."""
        global_plan, load_plans = output
        writer: dict[tuple[str, tuple[int, ...]], int] = {}
        for rank, plan in enumerate(global_plan):
            for item in plan.items:
                writer[(item.index.fqn, tuple(item.index.offset))] = rank
        segments: dict[str, list[dict[str, Any]]] = {n: [] for n in problem.names}
        for t_rank, plan in enumerate(load_plans):
            for ri in plan.items:
                name = ri.dest_index.fqn
                s_rank = writer[(name, tuple(ri.storage_index.offset))]
                s_off, s_strides = problem.memory[(name, "source", s_rank)]
                t_off, t_strides = problem.memory[(name, "target", t_rank)]
                segments[name].append(_segment(
                    list(ri.lengths),
                    (s_rank, s_off + sum(a * s for a, s in zip(ri.storage_offsets, s_strides)), s_strides),
                    (t_rank, t_off + sum(a * s for a, s in zip(ri.dest_offsets, t_strides)), t_strides),
                ))
        return {n: {"logical_shape": list(problem.logical[n]), "segments": segments[n]} for n in problem.names}
