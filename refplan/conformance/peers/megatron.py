"""Megatron-Core's refit planner (``megatron.core.resharding``, megatron-core 0.16.1)."""

from __future__ import annotations

import builtins
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...box import volume
from ...errors import AffineTransferError
from ...maps import ParamAffineMap
from ..corpus import Case
from .common import (
    Chunk,
    Inexpressible,
    PeerAdapter,
    _case_maps,
    _chunks,
    _dense_offset,
    _dtype_name,
    _import,
    _no_options,
    _relabel,
    _segment,
    _slices,
    merge_dense,
    one_source_floor,
    peer_version,
)


@dataclass(frozen=True)
class _MegatronSide:
    """One side of one parameter in Megatron's terms."""

    is_tp: bool
    dim: int
    stride: int
    tp_groups: tuple[tuple[int, ...], ...]
    """Locations per TP group, in TP-rank order (one group per replica)."""


class MegatronAdapter(PeerAdapter):
    """Megatron-Core's refit planner: one source replica per destination rank and parameter.

    Endpoints are Megatron's own world: a refit runs the trainer and the engine on the same global
    ranks, so a case's processes are the ranks (one shard per rank and parameter and side).

    A case is a layout, not a model, so the ``ParameterMetadata`` are built field for field, as
    Megatron's own metadata path reports them for the layers that make that layout:
    ``tests/test_megatron_front_door.py`` builds real ``ColumnParallelLinear``/``RowParallelLinear``
    models (and replicated LayerNorm-like parameters) on CPU for both releases, reads them with
    0.16.1's ``extract_param_metadata`` and 0.19.2's ``_extract_module_metadata``, and requires every
    field equal. An expert (``_expert_index``: a whole parameter named ``...experts.<index>...``, as
    the corpus, ``explore`` and ``refplan bench`` name them) is given as Megatron reports a Transformer
    Engine grouped expert weight: TE's ``GroupedLinear.reset_parameters`` TP-marks every ``weightK``
    (partition_dim 0 when ``TEGroupedLinear`` clears ``parallel_mode`` under EP, stride 1;
    transformer_engine/pytorch/module/grouped_linear.py:730-738 at TE 8ebb47e5, moved to
    ``set_tensor_parallel_attributes``, :1986-2006, in later TE) and
    ``TEGroupedLinear`` sets ``allreduce=False`` under EP (transformer_engine.py:1551 in 0.16.1), so both
    releases' extractors report ``is_ep``, the EP group, the expert-TP group (one rank here: ETP=1) and
    the model's DP group, with the global expert index. A plain replicated parameter instead would be
    routed over the model's DP group, to ranks that do not hold the expert: input no MoE model
    produces (the front-door test builds such a model on CPU and compares)."""

    features = frozenset({"multi_parameter", "element_size", "endpoints"})
    merges_boxes = True
    collocate = True
    """Without endpoints, the k-th target location runs on the k-th source rank (a refit inside one
    world); off (0.19.2), target locations take the ranks after the source's."""
    one_world = True
    """Whether a case with targets on ranks outside the source world is ``Inexpressible`` (0.16.1
    cannot build it). ``refplan bench`` turns it off: it times the planning loop on a scenario's own
    ranks (trainer -> engine on other ranks), which the loop computes whether or not the front door
    could have set them up, and says so."""

    def __init__(self, target: str | None = None) -> None:
        """The 0.16.1 in the virtual environment, called in-process; with ``target`` (a ``pip install
        --target`` folder holding megatron-core 0.19.2), 0.19.2's ``build_plan_from_rosters`` in a
        worker subprocess (``megatron_worker.py``) whose ``sys.path`` starts with that folder. The
        metadata are built with the 0.16.1 classes either way (the fields both releases share)."""
        self._utils = _import("megatron.core.resharding.utils")
        self._planner = _import("megatron.core.resharding.planner")
        self._torch = _import("torch")
        self._worker: Any = None
        if target is None:
            version = peer_version("megatron-core")
            self.name = f"megatron-core {version}" if version else "megatron-core"
            return
        self._worker = _Worker(target)
        self.name = f"megatron-core {self._worker.version}"
        # 0.19.2 builds a plan for destination ranks apart from the trainer's (RL refit): without
        # endpoints, target locations follow the source ranks, as before 0.16.1's world rule.
        self.one_world = False
        self.collocate = False

    @staticmethod
    def _side(m: ParamAffineMap, what: str, other_split: int | None, expert: bool = False) -> _MegatronSide:
        logical = m.logical_shape
        by_loc: dict[int, list[Chunk]] = {}
        for c in _chunks(m, what):
            by_loc.setdefault(c.location, []).append(c)
        if not by_loc:
            raise Inexpressible(f"{what}: no location holds data")
        locals_: dict[int, tuple[int, ...]] = {}
        for loc in by_loc:
            shard = m.shard_shapes.get(loc)
            if shard is None:
                raise Inexpressible(f"{what}: location {loc} declares no shard shape")
            locals_[loc] = tuple(shard)
        dims = {d for shard in locals_.values() for d, (a, b) in enumerate(zip(shard, logical)) if a != b}
        if len(dims) > 1:
            raise Inexpressible(f"{what}: shards differ from the tensor on several axes {sorted(dims)}")
        if not dims:
            if any(len(chunks) != 1 for chunks in by_loc.values()):
                raise Inexpressible(f"{what}: more than one box on a location holding the whole tensor")
            holders = tuple(sorted(by_loc))
            if other_split is None and expert:
                # a TE grouped expert weight: TP-marked on axis 0 in one-rank expert-TP groups
                return _MegatronSide(True, 0, 1, tuple((h,) for h in holders))
            if other_split is None:
                return _MegatronSide(False, 0, 1, (holders,))
            # a linear layer's weight at TP=1: marked tensor-parallel with one-rank TP groups
            return _MegatronSide(True, other_split, 1, tuple((h,) for h in holders))
        dim = dims.pop()
        local = {shard[dim] for shard in locals_.values()}
        if len(local) != 1:
            raise Inexpressible(f"{what}: uneven TP split (local sizes {sorted(local)} on axis {dim})")
        size = local.pop()
        if size == 0 or logical[dim] % size:
            raise Inexpressible(f"{what}: uneven TP split ({logical[dim]} is not a multiple of {size})")
        world = logical[dim] // size
        strides = {len(chunks) for chunks in by_loc.values()}
        if len(strides) != 1:
            raise Inexpressible(f"{what}: locations hold different numbers of blocks")
        stride = strides.pop()
        if size % stride:
            raise Inexpressible(f"{what}: {stride} blocks do not divide a local size of {size}")
        unit = size // stride
        # TP rank of each location: the position of its first block in the interleave
        rank_of: dict[int, int] = {}
        for loc, chunks in by_loc.items():
            first = min(c.origin[dim] for c in chunks)
            if first % unit:
                raise Inexpressible(f"{what}: location {loc} starts a block off the {unit}-element grid")
            rank_of[loc] = (first // unit) % world
        by_rank: dict[int, list[int]] = {}
        for loc in sorted(rank_of):
            by_rank.setdefault(rank_of[loc], []).append(loc)
        if sorted(by_rank) != list(range(world)) or len({len(v) for v in by_rank.values()}) != 1:
            raise Inexpressible(f"{what}: TP ranks are not each held by the same number of replicas")
        copies = len(by_rank[0])
        groups = tuple(tuple(by_rank[j][c] for j in range(world)) for c in range(copies))
        return _MegatronSide(True, dim, stride, groups)

    def translate(self, case: Case) -> dict[str, Any]:
        _no_options(case, allowed=("endpoints",))
        names = sorted(case.parameters)
        cased = _case_maps(case, "the planner matches parameters by name and local shape only")
        maps = {n: (merge_dense(t), merge_dense(s)) for n, (t, s) in cased.items()}  # one box per rank
        # Global ranks. megatron-core 0.16.1 refits inside one world: build_centralized_reshard_plan
        # (planner.py:219-220, 296) gathers both models' metadata from every rank of the world and
        # plans for dst_rank in range(world_size), and the source model's parallel groups span that
        # world. So every target rank is a source rank: with endpoints, the processes (a target
        # process outside the source's cannot be built); without, the k-th target location (in
        # order) runs on the k-th source rank, collocated as a refit is.
        ends = case.raw.get("endpoints")
        src_locs = sorted({loc for _, s in maps.values() for loc in s.shard_shapes})
        tgt_locs = sorted({loc for t, _ in maps.values() for loc in t.shard_shapes})
        rank_of: dict[str, dict[int, int]] = {"source": {}, "target": {}}
        for side_name, locs in (("source", src_locs), ("target", tgt_locs)):
            for k, loc in enumerate(locs):
                if ends is not None:
                    proc = ends.get(side_name, {}).get(str(loc))
                    if not isinstance(proc, int):
                        raise Inexpressible(f"{side_name} location {loc} has no process (a rank holds each shard)")
                    rank_of[side_name][loc] = proc
                elif side_name == "source":
                    rank_of[side_name][loc] = loc
                elif self.collocate and k < len(src_locs):
                    rank_of[side_name][loc] = src_locs[k]
                else:  # outside the source world (refused below unless one_world is off)
                    rank_of[side_name][loc] = max(src_locs, default=-1) + 1 + (k if self.collocate else loc)
        world = set(rank_of["source"].values())
        outside = sorted(loc for loc in tgt_locs if rank_of["target"].get(loc) not in world)
        if outside and self.one_world:
            raise Inexpressible(
                f"targets on ranks outside the source world (target location(s) {outside}, source ranks "
                f"{sorted(world)}): megatron-core 0.16.1 "
                "refits inside one world where every rank holds both models (planner.py:219-220, 296), so "
                "destination ranks apart from the trainer's cannot be built")
        # Inputs no Megatron front door builds (a maintainer-style review, 2026-12-06: each was
        # published as a finding). (1) 0.16.1 builds the destination model on every rank of its one
        # world (build_centralized_reshard_plan takes a dst_module with a pg_collection on each
        # rank, planner.py:223-230), so a refit's targets cover every rank: a property of the whole
        # engine. Each destination rank's own plan reads only its own metadata and the sources', so
        # the copies are judged; the loads are not (``Outcome.unjudged_loads``: a pass with a note;
        # a `contract` until 2026-12-07, whose reason contradicted that verdict's definition). (2)
        # Each rank of a Megatron model (no pipeline stages here) holds every dense parameter,
        # TP-split or replicated over DP, never an empty shard: a property of one parameter, so the
        # case is unsupported (excusing the case's loads would excuse another parameter's finding).
        contract: list[tuple[str, ...]] = []
        idle = sorted(world - set(rank_of["target"].values()))
        unjudged = ""
        if idle and self.one_world:
            unjudged = (f"loads not judged: source ranks {idle} hold no target shard, but {self.name} takes the "
                        "destination model on every rank of its one world (planner.py:223-230), so its front door "
                        "never plans this engine; each destination rank's copies are judged")
        for side_name, which in (("source", 1), ("target", 0)):
            spans = set(rank_of[side_name].values())
            for name in names:
                if _expert_index(name) is not None:
                    continue  # experts live on their EP ranks only
                holding = {rank_of[side_name][loc] for loc, shape in maps[name][which].shard_shapes.items()
                           if volume(tuple(shape))}  # an empty shard holds nothing: no Megatron rank has one
                if holding != spans:
                    # The whole case, not a contract on its loads: one would excuse a real finding
                    # of another parameter of the same case (a second review).
                    where = ("resharding/utils.py:229, each rank's module.named_parameters" if self._worker is not None
                             else "planner.py:229-230, each rank's module.named_parameters")
                    raise Inexpressible(
                        f"{side_name} parameter {name!r} is on ranks {sorted(holding)} of a model on ranks "
                        f"{sorted(spans)}, but every rank of a Megatron model holds each dense parameter (no empty "
                        f"shard), and the planner reads the metadata each rank's model reports ({where}): no "
                        "model's metadata describes this input")
        utils, torch = self._utils, self._torch
        meta: dict[str, dict[str, dict[int, Any]]] = {"source": {}, "target": {}}
        loc_of: dict[str, dict[str, dict[int, int]]] = {"source": {}, "target": {}}
        sides_of: dict[str, dict[str, _MegatronSide]] = {}
        for name in names:
            t, s = maps[name]
            # the axes the other side splits, over the locations that hold data (as _side reads them)
            t_dims = {d for loc, ps in t.pieces_by_rank.items() if ps for d, (a, b) in
                      enumerate(zip(t.shard_shapes.get(loc) or t.logical_shape, t.logical_shape)) if a != b}
            s_dims = {d for loc, ps in s.pieces_by_rank.items() if ps for d, (a, b) in
                      enumerate(zip(s.shard_shapes.get(loc) or s.logical_shape, s.logical_shape)) if a != b}
            expert = _expert_index(name) is not None
            sides = {
                "target": self._side(t, f"parameter {name!r}, target", min(s_dims) if s_dims else None,
                                     expert),
                "source": self._side(s, f"parameter {name!r}, source", min(t_dims) if t_dims else None,
                                     expert),
            }
            sides_of[name] = sides
            if sides["target"].is_tp and sides["source"].is_tp and sides["target"].dim != sides["source"].dim:
                contract.append(("refuse", (
                    f"{self.name}: partition_dim {sides['source'].dim} -> "
                    f"{sides['target'].dim} (parameter {name!r}); a refit moves weights between two instances of "
                    "one model, whose layer classes fix partition_dim (ColumnParallelLinear 0, RowParallelLinear "
                    "1); _build_descriptors_for_param's size check refuses it, naming an inconsistent "
                    "partition_dim as the likely cause "
                    f"(planner.py:{'56-62' if self._worker is not None else '49-55'})"),
                    r"Cannot build TP descriptor for .* dim\d+: src_world\*src_local="))
        # Experts: whole on each of their holders (EP x expert-DP, ETP=1). Holder c of every expert (in rank
        # order) is in expert-DP replica c, so a rank's EP group is the holders of its replica position.
        experts: dict[str, dict[str, int]] = {"source": {}, "target": {}}
        ep_group: dict[str, dict[int, list[int]]] = {"source": {}, "target": {}}
        for side_name in ("source", "target"):
            rank = rank_of[side_name]
            position: dict[int, int] = {}
            members: dict[int, set[int]] = {}
            for name in names:
                index, side = _expert_index(name), sides_of[name][side_name]
                if index is None or not side.is_tp or any(len(g) != 1 for g in side.tp_groups):
                    continue
                experts[side_name][name] = index
                for c, r in enumerate(sorted(rank[g[0]] for g in side.tp_groups)):
                    if position.setdefault(r, c) != c:
                        raise Inexpressible(f"parameter {name!r}, {side_name}: rank {r} holds experts as expert-DP "
                                            f"replica {position[r]} and {c} (no EP x DP grid places it so)")
                    members.setdefault(c, set()).add(r)
            ep_group[side_name] = {r: sorted(members[c]) for r, c in position.items()}
        # build_centralized_reshard_plan(num_experts=...) / build_local_reshard_plan stamp it on every parameter
        num_experts = max((i + 1 for side in experts.values() for i in side.values()), default=None)
        # The model's own groups, per side and rank, as its tensor-parallel layers carry them: a parameter
        # that no layer splits (a LayerNorm's weight) reports the model's DP group (both releases) and TP
        # group (0.19.2 always fills it, utils.py:398-407), not its holders. A side whose parameters are
        # all replicated is a TP=1 model: every holder in one DP group.
        groups: dict[str, dict[int, tuple[list[int], list[int]]]] = {"source": {}, "target": {}}
        for side_name in ("source", "target"):
            rank = rank_of[side_name]
            for name in names:
                side = sides_of[name][side_name]
                if not side.is_tp or name in experts[side_name]:
                    continue
                for j in range(len(side.tp_groups[0])):
                    dp = sorted(rank[g[j]] for g in side.tp_groups)
                    for g in side.tp_groups:
                        groups[side_name].setdefault(rank[g[j]], ([rank[loc] for loc in g], dp))
        # Megatron's pipeline group without PP: the world's ranks (utils.py:294-297 in 0.16.1; 0.19.2 offsets
        # them for an engine in a cluster of its own, utils.py:409-416): one world when the sides share
        # ranks (a refit), else each side's own cluster.
        ranks_of = {side_name: set(rank_of[side_name].values()) for side_name in ("source", "target")}
        shared = bool(ranks_of["source"] & ranks_of["target"])
        pipeline: dict[str, list[int]] = {}
        for side_name, side_ranks in ranks_of.items():
            span = ranks_of["source"] | ranks_of["target"] if shared else side_ranks
            pipeline[side_name] = list(range(0 if shared else min(span, default=0), max(span, default=-1) + 1))
        for name in names:
            t, s = maps[name]
            dtype = getattr(torch, _dtype_name(case, name))
            for side_name, side in sides_of[name].items():
                m = t if side_name == "target" else s
                rank = rank_of[side_name]
                held = [loc for group in side.tp_groups for loc in group]
                by_rank: dict[int, int] = {}
                for loc in held:
                    if rank[loc] in by_rank:
                        raise Inexpressible(f"parameter {name!r}, {side_name}: locations {by_rank[rank[loc]]} and "
                                            f"{loc} on one process (Megatron: one shard per rank and parameter)")
                    by_rank[rank[loc]] = loc
                loc_of[side_name][name] = by_rank
                holders = sorted(by_rank)
                per_rank: dict[int, Any] = {}
                for group in side.tp_groups:
                    ranks = [rank[loc] for loc in group]
                    for loc in group:
                        r = rank[loc]
                        model_tp, model_dp = groups[side_name].get(r, ([r], holders))
                        ep: dict[str, Any] = {}
                        tp_ranks: list[int] | None
                        if name in experts[side_name]:
                            # extract_param_metadata for allreduce=False (0.16.1 utils.py:270-283, 0.19.2
                            # utils.py:371-388): expert-TP group, the model's DP group (pg_collection.dp;
                            # TP=1: the side's world), the EP group; the global expert index as
                            # assign_ep_resolved_name_inplace sets it for a per-expert weightK
                            tp_ranks = [r]
                            dp_ranks = list(groups[side_name].get(r, ([r], sorted(ranks_of[side_name])))[1])
                            ep = {"is_ep": True, "expert_parallel_group_ranks": list(ep_group[side_name][r]),
                                  "global_expert_index": experts[side_name][name]}
                        elif side.is_tp:
                            tp_ranks = list(ranks)
                            dp_ranks = sorted(rank[g[group.index(loc)]] for g in side.tp_groups)
                        else:
                            tp_ranks = list(model_tp) if self._worker is not None else None
                            dp_ranks = list(model_dp)
                        per_rank[r] = utils.ParameterMetadata(
                            name=name, shape=tuple(m.shard_shapes[loc]), dtype=dtype,
                            element_size=torch.empty(0, dtype=dtype).element_size(), is_tp=side.is_tp,
                            partition_dim=side.dim, partition_stride=side.stride, owner_rank=r,
                            tensor_parallel_group_ranks=tp_ranks, data_parallel_group_ranks=dp_ranks,
                            pipeline_parallel_group_ranks=list(pipeline[side_name]), resolved_name=name,
                            num_experts=num_experts, **ep,
                        )
                meta[side_name][name] = per_rank
        # What build_centralized_reshard_plan has gathered before its planning loop: per destination
        # rank the parameters it holds, per parameter the source metadata in rank order.
        dst_by_rank: dict[int, list[tuple[str, Any]]] = {}
        for name in names:
            for r, m in meta["target"][name].items():
                dst_by_rank.setdefault(r, []).append((name, m))
        # The parameters with a choice of source: some region of the source held more than once.
        chosen = [n for n in names if any(len(p.locations) > 1 for ps in maps[n][1].pieces_by_rank.values()
                                          for p in ps)]
        buckets = {n: {tuple(m.data_parallel_group_ranks or []) for m in meta["source"][n].values()} for n in chosen}
        if self._worker is None and chosen and all(len(b) == 1 for b in buckets.values()):
            # One DP group for every parameter with a choice (pure DP; experts of EP 1 in a model
            # whose DP group is the world): 0.16.1's select_src_metadata_balanced buckets the
            # source metadata by DP group, finds one, and its docstring says it then returns the
            # first entry (resharding/utils.py:330, 345-347): documented behaviour for every choice
            # in the case, no finding (a parameter with one holder per region has no choice to
            # make). Read from the metadata as the peer buckets it, not from the layout, so that
            # experts (a TP group of one, the model's DP group of their rank) are judged as the peer sees them.
            contract.append(("quality", f"{self.name}: every source parameter with replicas is held by one DP group, "
                                        "and select_src_metadata_balanced's docstring documents its one-bucket "
                                        "fast path, returning the first entry (resharding/utils.py:330)"))
        first: dict[str, tuple[str, ...]] = {}
        for entry in contract:  # one reason per kind (the first: a partition_dim change, say, of one parameter)
            first.setdefault(entry[0], entry)
        problem = {"names": names, "meta": meta, "loc_of": loc_of, "contract": list(first.values()),
                   "unjudged": unjudged,
                   "placement": rank_of if ends is None and self.collocate else None,
                   "logical": {n: maps[n][1].logical_shape for n in names},
                   "dst_by_rank": sorted(dst_by_rank.items()),
                   "src_lists": {n: [meta["source"][n][r] for r in sorted(meta["source"][n])] for n in names}}
        self._gate(cased, problem)
        return problem

    def unjudged_loads(self, problem: Mapping[str, Any]) -> str:
        return str(problem["unjudged"])

    def contract(self, case: Case, problem: Mapping[str, Any]) -> list[tuple[str, ...]]:
        found: list[tuple[str, ...]] = list(problem["contract"])
        floor = one_source_floor(case, problem.get("placement"))
        bound = case.expect.max_sender_load
        if floor is not None and bound is not None and floor.bytes > bound:
            where = ("planner.py:349 picks one source metadata per destination rank and parameter, and 279 or "
                     "_determine_source_ranks_for_dst_param reads every slice from its owner"
                     if self._worker is not None else
                     "planner.py:306 picks one source metadata per destination rank and parameter, and "
                     "_determine_source_ranks_for_dst_param reads every slice from its TP group")
            found.append(("quality", f"{self.name}: {where}, so target location {floor.target_location} reads all "
                                     f"{floor.bytes} it needs of parameter {floor.parameter!r} held by "
                                     f"{list(floor.holders)} ({floor.regions} region(s)) from one of them: no choice "
                                     f"of source meets the bound {bound}"))
        return found

    def design(self, problem: Mapping[str, Any], output: list[tuple[str, int, Any, list[Any]]]) -> str:
        """Whether every read sits in the source replica the release's *documented* rule picks for its
        destination rank and parameter (``Outcome.design``): then a load over the case's bound is that
        design's, an enhancement to ask for. Written from the docstrings, not by calling the peer's
        selection (which would agree with itself by construction), so that a choice against its own
        docstring stays ``quality``: 0.19.2's one-DP-group fast path returns the first entry where
        ``_round_robin_dp``'s docstring cycles by destination rank (``findings.py``), and this rule
        cycles there. The replica is what is checked, not the slices (those follow from it: the
        picked replica's TP group, or for a replicated parameter the member the docstring names).
        ``""`` for a release whose rule was not read, or any read elsewhere."""
        if self._worker is None and self.name == "megatron-core 0.16.1":
            pick, rule = _pick_016, _RULE_016
        elif self._worker is not None and self.name == "megatron-core 0.19.2":
            pick, rule = _pick_019, _RULE_019
        else:
            return ""
        return rule if _reads_follow(problem, output, pick, self._worker is not None) else ""

    def defect(self, problem: Mapping[str, Any], output: list[tuple[str, int, Any, list[Any]]]) -> str:
        """0.19.2's published defect, recognised in an answer that ``design`` found off its
        docstring: every read sits where the code's one-DP-group fast path (utils.py:514-516) puts
        it, which differs from the docstring's cycle for some destination rank (else ``design``
        would have held). ``""`` otherwise: a read neither rule explains is left unexplained."""
        if not (self._worker is not None and self.name == "megatron-core 0.19.2"):
            return ""
        if not _reads_follow(problem, output, lambda c, d, r: _pick_019(c, d, r, fast_path=True), True):
            return ""
        from .findings import FINDINGS

        for finding in FINDINGS:
            if finding.version == "megatron-core 0.19.2" and finding.verdict == "quality":
                return finding.note()
        return ""

    def placement(self, case: Case, problem: Mapping[str, Any]) -> Mapping[str, Mapping[int, int]] | None:
        """Without endpoints, 0.16.1 runs the k-th target location on the k-th source rank (``collocate``):
        its loads are judged on those ranks, where a copy between a rank's two models is local."""
        found: Mapping[str, Mapping[int, int]] | None = problem.get("placement")
        return found

    def planner_metadata(self, problem: Mapping[str, Any]) -> dict[str, dict[int, dict[str, dict[str, Any]]]]:
        """Every field of the ``ParameterMetadata`` the planner is given, ``{side: {rank: {name: fields}}}``:
        for 0.19.2 as its worker rebuilds them with 0.19.2's own class. What
        ``tests/test_megatron_front_door.py`` compares with Megatron's own ``extract_param_metadata``."""
        import dataclasses

        out: dict[str, dict[int, dict[str, dict[str, Any]]]] = {"source": {}, "target": {}}
        if self._worker is not None:
            full = self._worker.rosters(problem)
            for side_name, by_name in (("target", full["dst"]), ("source", full["src"])):
                for metas in by_name.values():
                    for fields in metas:
                        out[side_name].setdefault(fields["owner_rank"], {})[fields["resolved_name"]] = fields
            return out
        for side_name in ("source", "target"):
            for name, per_rank in problem["meta"][side_name].items():
                for rank, m in per_rank.items():
                    fields = dataclasses.asdict(m)
                    fields["shape"] = list(fields["shape"])
                    fields["dtype"] = str(fields["dtype"]).removeprefix("torch.")
                    out[side_name].setdefault(rank, {})[name] = fields
        return out

    def rebuild(self, problem: Mapping[str, Any]) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        """Both sides read back by ``interop.from_megatron`` from the ``ParameterMetadata`` alone
        (global ranks mapped back to the case's locations), so every translated case also tests it."""
        from ...interop import from_megatron

        sides: dict[str, dict[str, ParamAffineMap]] = {}
        for side_name in ("target", "source"):
            by_rank: dict[int, list[Any]] = {}
            for name in problem["names"]:
                for rank, meta in problem["meta"][side_name][name].items():
                    by_rank.setdefault(rank, []).append(meta)
            try:
                maps = from_megatron(by_rank)
            except (AffineTransferError, TypeError, ValueError) as exc:
                raise Inexpressible(f"{side_name}: interop.from_megatron refuses the metadata: {exc}") from None
            sides[side_name] = {n: _relabel(m, problem["loc_of"][side_name][n]) for n, m in maps.items()}
        return {name: (sides["target"][name], sides["source"][name]) for name in problem["names"]}

    def call_peer(self, problem: Mapping[str, Any]) -> list[tuple[str, int, Any, list[Any]]]:
        """Rank 0's loop of ``build_centralized_reshard_plan``: (parameter, destination rank,
        destination metadata, routed ops) for every destination rank and parameter."""
        if self._worker is not None:
            planned: list[tuple[str, int, Any, list[Any]]] = self._worker.plan(problem)
            return planned
        select = self._utils.select_src_metadata_balanced
        determine = self._planner._determine_source_ranks_for_dst_param
        src_lists = problem["src_lists"]
        out: list[tuple[str, int, Any, list[Any]]] = []
        for dst_rank, params in problem["dst_by_rank"]:
            for name, dst in params:
                chosen = select(src_lists[name], dst, dst_rank)
                out.append((name, dst_rank, dst, determine(name, chosen, dst, dst_rank)))
        return out

    def convert(self, problem: Mapping[str, Any], output: list[tuple[str, int, Any, list[Any]]]) -> dict[str, Any]:
        loc_of = problem["loc_of"]
        src_meta = problem["meta"]["source"]
        segments: dict[str, list[dict[str, Any]]] = {n: [] for n in problem["names"]}
        for name, dst_rank, dst, ops in output:
            for src_rank, src_slice, dst_slice in ops:
                src_local = tuple(src_meta[name][src_rank].shape)
                s_start, s_len = _slices(src_slice, src_local)
                d_start, d_len = _slices(dst_slice, tuple(dst.shape))
                if s_len != d_len:
                    raise ValueError(f"{name}: source slice {s_len} and destination slice {d_len} differ")
                s_off, s_str = _dense_offset(s_start, src_local)
                d_off, d_str = _dense_offset(d_start, tuple(dst.shape))
                segments[name].append(_segment(d_len, (loc_of["source"][name][src_rank], s_off, s_str),
                                               (loc_of["target"][name][dst_rank], d_off, d_str)))
        return {n: {"logical_shape": list(problem["logical"][n]), "segments": segments[n]} for n in problem["names"]}



_META_FIELDS = ("name", "element_size", "is_tp", "partition_dim", "partition_stride", "owner_rank",
                "tensor_parallel_group_ranks", "data_parallel_group_ranks", "pipeline_parallel_group_ranks",
                "resolved_name", "is_ep", "num_experts", "expert_parallel_group_ranks", "global_expert_index")


def _expert_index(name: str) -> int | None:
    """The global expert index of an expert's parameter, from how the corpus (``experts.3.w1``),
    ``explore`` and ``refplan bench`` (``layers.000.experts.003.w1``) name one: the integer after an
    ``experts`` component; ``None`` for any other parameter (a fused ``experts`` tensor included).
    Megatron itself tells experts by ``allreduce=False``; a case has no attributes, only names."""
    parts = name.split(".")
    for part, after in itertools.pairwise(parts):
        if part == "experts" and after.isdigit():
            return int(after)
    return None


_RULE_016 = ("each destination rank reads a parameter from the source replica its docstring names: the first "
             "entry of the DP bucket dst_rank % buckets, one bucket its first entry "
             "(megatron/core/resharding/utils.py:322-333), a replicated parameter from DP member dst_rank % size "
             "or a local copy (planner.py:160-168), the same rule for every parameter, as Megatron-Core 0.16.1 "
             "documents")
_RULE_019 = ("each destination rank reads a parameter from the source replica its docstrings name: a local copy "
             "first, else DP group dst_rank % groups and within it entry (dst_rank // groups) % entries "
             "(megatron/core/resharding/utils.py:498-507, 532-542), keyed by the destination rank alone, the "
             "same for every parameter, as Megatron-Core 0.19.2 documents")


def _by_dp_group(candidates: list[Any]) -> dict[tuple[int, ...], list[Any]]:
    grouped: dict[tuple[int, ...], list[Any]] = {}
    for meta in candidates:
        grouped.setdefault(tuple(meta.data_parallel_group_ranks or ()), []).append(meta)
    return grouped


def _pick_016(candidates: list[Any], dst: Any, dst_rank: int) -> Any:
    """0.16.1's docstring (utils.py:325-333): bucket by DP group; one bucket, its first entry; else
    the bucket ``dst_rank % buckets`` in sorted order, its first entry."""
    grouped = _by_dp_group(candidates)
    if len(grouped) == 1:
        return candidates[0]
    return grouped[sorted(grouped)[dst_rank % len(grouped)]][0]


def _pick_019(candidates: list[Any], dst: Any, dst_rank: int, fast_path: bool = False) -> Any | None:
    """0.19.2's docstrings: same-EP-size candidates filtered to the destination's EP local rank
    (utils.py:445-449), a local copy first (535-541), else DP group ``dst_rank % groups`` and within
    it entry ``(dst_rank // groups) % entries`` (498-507). With one DP group this cycles, as the
    docstring says; the code's fast path (514-516, ``fast_path``: its first entry) does not, the
    published defect."""
    ep = dst.expert_parallel_group_ranks
    if ep is not None:
        first = candidates[0].expert_parallel_group_ranks
        if first and len(first) == len(ep):
            local = ep.index(dst_rank)
            candidates = [m for m in candidates if m.expert_parallel_group_ranks
                          and m.expert_parallel_group_ranks.index(m.owner_rank) == local]
            if not candidates:  # 0.19.2 raises here (utils.py:471-495): no answer to check
                return None
    for meta in candidates:
        if meta.owner_rank == dst_rank:
            return meta
    grouped = _by_dp_group(candidates)
    if fast_path and len(grouped) == 1:
        return candidates[0]
    keys = sorted(grouped)
    entries = grouped[keys[dst_rank % len(keys)]]
    return entries[(dst_rank // len(keys)) % len(entries)]


def _reads_follow(problem: Mapping[str, Any], output: list[tuple[str, int, Any, list[Any]]],
                  pick: Callable[[list[Any], Any, int], Any | None], release_019: bool) -> bool:
    """Whether every receive op of ``output`` reads from the replica ``pick`` chooses for its
    destination rank and parameter: the chosen metadata's TP group, or for a parameter with no TP
    descriptor the rank ``_replicated_source`` names."""
    src_lists = problem["src_lists"]
    for name, dst_rank, dst, ops in output:
        candidates = src_lists.get(name)
        if not candidates:  # 0.19.2's tied-embedding fallback (planner.py:332-342): not read here
            return False
        chosen = pick(candidates, dst, dst_rank)
        if chosen is None:
            return False
        allowed = set(chosen.tensor_parallel_group_ranks or ())
        allowed |= _replicated_source(chosen, dst, dst_rank, release_019)
        if any(src_rank not in allowed for src_rank, _, _ in ops):
            return False
    return True


def _replicated_source(chosen: Any, dst: Any, dst_rank: int, release_019: bool) -> set[int]:
    """Where a parameter with no TP descriptor is read from, by the docstring of
    ``_finalize_dp_transfers``: a local copy when both DP groups match (0.19.2: and the rank holds
    the source), else 0.16.1's DP member ``dst_rank % size``, 0.19.2's picked owner."""
    src_dp, dst_dp = list(chosen.data_parallel_group_ranks or ()), list(dst.data_parallel_group_ranks or ())
    if src_dp == dst_dp and (dst_rank in src_dp or not release_019):
        return {dst_rank}
    if release_019:
        return {chosen.owner_rank}
    return {src_dp[dst_rank % len(src_dp)]} if src_dp else set()


def _meta_doc(meta: Any) -> dict[str, Any]:
    doc = {f: getattr(meta, f) for f in _META_FIELDS}
    doc["shape"] = list(meta.shape)
    doc["dtype"] = str(meta.dtype).removeprefix("torch.")
    return doc


class _Worker:
    """megatron-core 0.19.2 in a subprocess (``megatron_worker.py``): one JSON request per problem."""

    def __init__(self, target: str) -> None:
        import subprocess
        import sys
        from pathlib import Path

        script = Path(__file__).with_name("megatron_worker.py")
        self._proc = subprocess.Popen([sys.executable, "-P", str(script), target], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = json.loads(self._read())
        self.seconds = (0.0, 0.0)
        """CPU and wall seconds of the last request's planning calls, timed inside the worker."""
        self.version = str(ready["ready"])
        self.torch = str(ready["torch"])

    def _read(self) -> str:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise ImportError("the megatron-core 0.19.2 worker exited (is its folder complete? `make peers`)")
        return line

    @staticmethod
    def _request(problem: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "dst": {str(rank): [_meta_doc(m) for _, m in params] for rank, params in problem["dst_by_rank"]},
            "src": {name: [_meta_doc(m) for m in metas] for name, metas in problem["src_lists"].items()},
        }

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self._read())
        return answer

    def rosters(self, problem: Mapping[str, Any]) -> dict[str, Any]:
        """Every field of the 0.19.2 ``ParameterMetadata`` the worker builds for ``problem``."""
        answer = self._ask({"rosters": self._request(problem)})
        if "error" in answer:
            raise RuntimeError(f"megatron-core 0.19.2 worker: {answer['error']}: {answer['message']}")
        return answer

    def plan(self, problem: Mapping[str, Any]) -> list[tuple[str, int, Any, list[Any]]]:
        answer = self._ask(self._request(problem))
        self.seconds = (float(answer.get("seconds", 0.0)), float(answer.get("wall_seconds", 0.0)))
        if "error" in answer:
            cls = getattr(builtins, answer["error"], None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = type(answer["error"], (Exception,), {})
            raise cls(answer["message"])
        dst_meta = problem["meta"]["target"]
        grouped: dict[tuple[str, int], list[Any]] = {}
        for name, dst_rank, src_rank, src_slices, dst_slices in answer["ops"]:
            grouped.setdefault((name, dst_rank), []).append(
                (src_rank, tuple(slice(*s) for s in src_slices), tuple(slice(*s) for s in dst_slices)))
        return [(name, rank, dst_meta[name][rank], ops) for (name, rank), ops in grouped.items()]
