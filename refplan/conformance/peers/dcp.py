"""PyTorch DCP (``torch.distributed.checkpoint``, torch 2.13.0): save-side dedup picks the replica, load
reads overlaps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...box import Box, covers, overlapping_pairs, row_major_strides, volume
from ...maps import ParamAffineMap
from ..corpus import Case
from .common import (
    Chunk,
    Inexpressible,
    PeerAdapter,
    _case_maps,
    _chunks,
    _dtype_name,
    _import,
    _no_options,
    _rebuild_map,
    _segment,
    peer_version,
)


@dataclass
class _DCPProblem:
    names: list[str]
    logical: dict[str, tuple[int, ...]]
    source_locs: list[int]
    save_plans: list[Any]
    """One ``SavePlan`` per source location, in ``source_locs`` order."""
    placements: dict[tuple[str, int, tuple[int, ...], tuple[int, ...]], tuple[int, tuple[int, ...]]]
    """(name, source location, chunk origin, chunk shape) -> (shard offset, shard strides): where a
    saved chunk sits in the saving rank's memory, which DCP does not describe (it saves a view)."""
    shard_shapes: dict[tuple[str, str], dict[int, tuple[int, ...]]]
    targets: dict[str, dict[int, list[Chunk]]]
    """Per parameter and target location: the local chunks to load (with their shard placement)."""


class DCPAdapter(PeerAdapter):
    """torch.distributed.checkpoint: save-side dedup chooses the replica, load reads overlaps."""

    def __init__(self, lowest_rank: bool = False) -> None:
        self.lowest_rank = lowest_rank
        self._planner = _import("torch.distributed.checkpoint.default_planner")
        self._helpers = _import("torch.distributed.checkpoint.planner_helpers")
        self._md = _import("torch.distributed.checkpoint.metadata")
        self._pl = _import("torch.distributed.checkpoint.planner")
        self._torch = _import("torch")
        version = peer_version("torch")
        self.name = f"dcp{'-lowest' if lowest_rank else ''} (torch {version})"

    def translate(self, case: Case) -> _DCPProblem:
        _no_options(case)
        torch, md, pl = self._torch, self._md, self._pl
        names = sorted(case.parameters)
        logical: dict[str, tuple[int, ...]] = {}
        items: dict[int, list[Any]] = {}
        placements: dict[tuple[str, int, tuple[int, ...], tuple[int, ...]], tuple[int, tuple[int, ...]]] = {}
        shard_shapes: dict[tuple[str, str], dict[int, tuple[int, ...]]] = {}
        targets: dict[str, dict[int, list[Chunk]]] = {}
        src_locs: set[int] = set()
        pairs = _case_maps(case, "one tensor per fqn")
        for name in names:
            tmap, smap = pairs[name]
            logical[name] = smap.logical_shape
            dtype = getattr(torch, _dtype_name(case, name))
            for side, m in (("source", smap), ("target", tmap)):
                if any(m.shard_shapes.get(loc) is None for loc in m.pieces_by_rank):
                    raise Inexpressible(f"parameter {name!r}, {side}: a location without a shard shape")
                shard_shapes[(name, side)] = dict(m.shard_shapes)
            size = torch.Size(smap.logical_shape)
            seen: set[tuple[int, tuple[int, ...]]] = set()
            for c in _chunks(smap, f"parameter {name!r}, source", keep_empty=True):
                if volume(c.shape) == 0 and all(o < n for o, n in zip(c.origin, smap.logical_shape)):
                    raise Inexpressible(
                        f"parameter {name!r}, source location {c.location}: a zero-size write item at the interior "
                        f"offset {c.origin}, which DCP's front door never writes (DTensor places an empty shard at "
                        "global_shape[dim], torch/distributed/tensor/_utils.py:266, so that its (fqn, offset) key "
                        "cannot collide with a real chunk's)")
                if (c.location, c.origin) in seen:
                    raise Inexpressible(f"parameter {name!r}, source location {c.location}: two chunks at offset "
                                        f"{c.origin} (one write item per offset and rank)")
                seen.add((c.location, c.origin))
                src_locs.add(c.location)
                chunk = md.ChunkStorageMetadata(offsets=torch.Size(c.origin), sizes=torch.Size(c.shape))
                items.setdefault(c.location, []).append(pl.WriteItem(
                    index=md.MetadataIndex(name, torch.Size(c.origin)),
                    type=pl.WriteItemType.SHARD,
                    tensor_data=pl.TensorWriteData(chunk=chunk, properties=md.TensorProperties(dtype=dtype),
                                                   size=size),
                ))
                placements[(name, c.location, c.origin, c.shape)] = (c.dest_offset, c.dest_strides)
            by_loc: dict[int, list[Chunk]] = {}
            for c in _chunks(tmap, f"parameter {name!r}, target"):
                by_loc.setdefault(c.location, []).append(c)
            targets[name] = by_loc
        locs = sorted(src_locs)
        problem = _DCPProblem(names, logical, locs, [pl.SavePlan(items.get(loc, [])) for loc in locs], placements,
                              shard_shapes, targets)
        self._gate(pairs, problem)
        return problem

    def contract(self, case: Case, problem: _DCPProblem) -> list[tuple[str, str]]:
        """What DCP's save/load contract allows here and refplan's rules forbid (see ``PeerAdapter``)."""
        torch = peer_version("torch") or "?"
        out: list[tuple[str, str]] = []
        whole = {n: Box((0,) * len(s), s) for n, s in problem.logical.items()}
        for name in problem.names:
            located = [(loc, Box(c.origin, c.shape)) for loc, cs in problem.targets[name].items() for c in cs]
            for loc in problem.targets[name]:
                boxes = [b for at, b in located if at == loc]
                if len(boxes) > 1 and len(boxes) <= 4096 and overlapping_pairs(boxes):
                    out.append(("accept", f"torch {torch}: a rank loads every local chunk it asks for, each filled "
                                        "from the checkpoint on its own (planner_helpers.py:254 "
                                        "create_read_items_for_chunk_list), so overlapping local chunks are both "
                                        "filled with the same values; refplan's R20 forbids the overlap"))
                    break
            if covers(whole[name], [b for _, b in located]) is not None:
                out.append(("accept", f"torch {torch}: a load reads what each rank asks for (default_planner.py:477 "
                                    "create_default_local_load_plan); nothing requires the ranks' chunks to cover the "
                                    "tensor, so a partial load is a valid load; refplan's R26 refuses a target that "
                                    "drops part of F"))
        if len(problem.save_plans) == 1:
            for name in problem.names:
                saved = [Box(tuple(i.tensor_data.chunk.offsets), tuple(i.tensor_data.chunk.sizes))
                         for i in problem.save_plans[0].items if i.index.fqn == name]
                if covers(whole[name], saved) is not None:
                    out.append(("accept", f"torch {torch}: _validate_global_plan checks that the saved chunks fill "
                                        "the tensor only when more than one rank saves (default_planner.py:703, "
                                        "`len(global_plan) > 1`): a single-rank save may hold rank-local state, "
                                        "deliberately; refplan's R25 refuses a source that holds part of F"))
                    break
        if self.lowest_rank:
            out.append(("quality", f"torch {torch}: DefaultSavePlanner(dedup_save_to_lowest_rank=True) "
                                   "(default_planner.py:78, _dedup_save_plans.py:44) writes every duplicate from its "
                                   "lowest rank, as the user asked"))
        bound = case.expect.max_sender_load
        if bound is not None:
            sizes = case.raw.get("element_size") or {}
            largest = max((volume(tuple(i.tensor_data.chunk.sizes)) * int(sizes.get(i.index.fqn, 1))
                           for p in problem.save_plans for i in p.items), default=0)
            if largest > bound:
                out.append(("quality", f"torch {torch}: DCP writes each saved chunk whole from one rank "
                                       f"(_dedup_save_plans.py:44-53); a chunk of {largest} exceeds the bound "
                                       f"{bound}, which no item-granular save can meet"))
            else:
                read = self._most_read_chunk(case, problem)
                if read is not None and read[0] > bound:
                    out.append(("quality", f"torch {torch}: a checkpoint holds one copy of each chunk "
                                           "(_dedup_save_plans.py:44-53 keeps one writer per chunk) and every load "
                                           "reads it from that copy (planner_helpers.py:254); the chunk at "
                                           f"{read[1]} is read {read[0]} in all, more than the bound {bound}"))
        return out

    @staticmethod
    def _most_read_chunk(case: Case, problem: _DCPProblem) -> tuple[int, tuple[int, ...]] | None:
        """(bytes, origin) of the saved chunk the target locations read most in all: whichever rank DCP
        keeps as its one writer sends all of it, so no DCP save meets a bound below it. ``None`` when
        there are too many chunk pairs to count."""
        sizes = case.raw.get("element_size") or {}
        boxes: dict[tuple[str, tuple[int, ...], tuple[int, ...]], None] = {}
        for plan in problem.save_plans:
            for item in plan.items:
                chunk = item.tensor_data.chunk
                boxes[(item.index.fqn, tuple(chunk.offsets), tuple(chunk.sizes))] = None
        best: tuple[int, tuple[int, ...]] | None = None
        pairs = 0
        for name, origin, shape in boxes:
            reads = [c for cs in problem.targets.get(name, {}).values() for c in cs]
            pairs += len(reads)
            if pairs > 1 << 20:
                return None
            total = 0
            for c in reads:
                overlap = 1
                for o, e, to, te in zip(origin, shape, c.origin, c.shape):
                    overlap *= max(0, min(o + e, to + te) - max(o, to))
                total += overlap
            total *= int(sizes.get(name, 1))
            if best is None or total > best[0]:
                best = (total, origin)
        return best

    def rebuild(self, problem: _DCPProblem) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        out: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
        items_of: dict[str, list[tuple[int, Any]]] = {}  # one pass over the plans, not one per parameter
        for loc, plan in zip(problem.source_locs, problem.save_plans):
            for item in plan.items:
                items_of.setdefault(item.index.fqn, []).append((loc, item))
        for name in problem.names:
            src: list[Any] = []
            for loc, item in items_of.get(name, ()):
                origin = tuple(item.tensor_data.chunk.offsets)
                shape = tuple(item.tensor_data.chunk.sizes)
                off, strides = problem.placements[(name, loc, origin, shape)]
                src.append((loc, origin, shape, problem.shard_shapes[(name, "source")][loc], off, strides))
            for loc, shard in problem.shard_shapes[(name, "source")].items():
                if all(e[0] != loc for e in src):
                    src.append((loc, (0,) * len(problem.logical[name]), (0,) * len(problem.logical[name]), shard, 0,
                                row_major_strides(shard)))
            tgt = [(c.location, c.origin, c.shape, problem.shard_shapes[(name, "target")][c.location], c.dest_offset,
                    c.dest_strides) for chunks in problem.targets[name].values() for c in chunks]
            out[name] = (_rebuild_map(problem.logical[name], tgt), _rebuild_map(problem.logical[name], src))
        return out

    def save(self, problem: _DCPProblem) -> tuple[list[Any], Any]:
        """DCP's global save planning: (deduplicated plans, ``Metadata``)."""
        planner = self._planner.DefaultSavePlanner(flatten_state_dict=False,
                                                   dedup_save_to_lowest_rank=self.lowest_rank)
        global_plan, metadata = planner.create_global_plan(problem.save_plans)
        return list(global_plan), metadata

    def call_peer(self, problem: _DCPProblem) -> tuple[list[Any], dict[tuple[str, int], list[Any]]]:
        """DCP's save-side global planning, then each target location's read items."""
        global_plan, metadata = self.save(problem)
        reads: dict[tuple[str, int], list[Any]] = {}
        for name in problem.names:
            stored = metadata.state_dict_metadata.get(name)
            for t_loc, chunks in sorted(problem.targets[name].items()):
                local = [self._md.ChunkStorageMetadata(offsets=self._torch.Size(c.origin),
                                                       sizes=self._torch.Size(c.shape)) for c in chunks]
                if stored is None:
                    raise ValueError(f"{name!r} is not in the checkpoint metadata")
                reads[(name, t_loc)] = self._helpers.create_read_items_for_chunk_list(name, stored, local)
        return global_plan, reads

    def convert(self, problem: _DCPProblem, output: tuple[list[Any], dict[tuple[str, int], list[Any]]]
                ) -> dict[str, Any]:
        global_plan, reads = output
        owners: dict[str, list[tuple[int, tuple[int, ...], tuple[int, ...]]]] = {}
        for loc, plan in zip(problem.source_locs, global_plan):
            for item in plan.items:
                chunk = item.tensor_data.chunk
                owners.setdefault(item.index.fqn, []).append((loc, tuple(chunk.offsets), tuple(chunk.sizes)))
        plans: dict[str, Any] = {}
        for name in problem.names:
            segments: list[dict[str, Any]] = []
            for t_loc, chunks in sorted(problem.targets[name].items()):
                for ri in reads.get((name, t_loc), ()):
                    s_loc, s_origin, s_shape = owners[name][ri.storage_index.index]
                    s_off, s_strides = problem.placements[(name, s_loc, s_origin, s_shape)]
                    dest = chunks[ri.dest_index.index]
                    segments.append(_segment(
                        list(ri.lengths),
                        (s_loc, s_off + sum(a * s for a, s in zip(ri.storage_offsets, s_strides)), s_strides),
                        (t_loc, dest.dest_offset + sum(a * s for a, s in zip(ri.dest_offsets, dest.dest_strides)),
                         dest.dest_strides),
                    ))
            plans[name] = {"logical_shape": list(problem.logical[name]), "segments": segments}
        return plans

