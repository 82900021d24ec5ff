"""Awex's weight-sync planner (``awex.transfer.transfer_plan``, awex 0.9.0)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...box import row_major_strides, volume
from ...maps import ParamAffineMap
from ..corpus import Case
from .common import (
    Inexpressible,
    PeerAdapter,
    _case_maps,
    _dense,
    _dense_offset,
    _dtype_name,
    _import,
    _no_options,
    _rebuild_map,
    _replicas,
    _segment,
    _slices,
    merge_dense,
    one_source_floor,
    peer_version,
    timed_call,
)


class AwexAdapter(PeerAdapter):
    """Awex's weight-sync planner: inference replica ``i`` reads from training replica ``i mod T``."""

    def __init__(self) -> None:
        self._plan = _import("awex.transfer.transfer_plan")
        self._meta = _import("awex.meta.weight_meta")
        self._common = _import("awex.util.common")
        self._torch = _import("torch")
        version = peer_version("awex")
        self.name = f"awex {version}" if version else "awex"

    merges_boxes = True

    def _param_meta(self, name: str, m: ParamAffineMap, what: str, dtype: Any, world: int) -> Any:
        """One ``ParameterMeta`` as Awex's meta resolver builds it from the ranks' local tensors
        (``MetaResolver._build_params_meta``, awex/meta/meta_resolver.py:93-228): replica ``c`` the
        ``c``-th holder of every box, shards of a replica ordered along the one sharding axis, each
        shard's offset the end of the previous one, and the global shape the first replica's sizes
        summed along that axis. A side the resolver cannot have produced is ``Inexpressible``."""
        wm = self._meta
        empty = sorted(loc for loc, shard in m.shard_shapes.items() if not volume(shard))
        if empty and len(m.shard_shapes) > len(empty):
            # Awex's resolver lists every rank's local tensor, empty ones included, as a shard of
            # its replica (meta_resolver.py:110-142); dropped here, the replica read as one TP rank
            # short (a 4-rank FSDP side as "TP 3"), and Awex was judged on a layout it was never
            # given. Its training front door (Megatron) splits evenly and never holds one.
            raise Inexpressible(f"{what}: location {empty[0]} holds an empty shard, which Awex's resolver would "
                                "list as a shard of its replica (meta_resolver.py:110-142); not translated")
        boxes = _dense(m, what)
        if not boxes:
            raise Inexpressible(f"{what}: no rank holds data; Awex's resolver lists a parameter from the ranks "
                                "that hold it, and its front door never builds a ParameterMeta with replicas=[]")
        replicas = _replicas(boxes, what)
        first = [boxes[loc] for loc in replicas[0]]
        axes = sorted({d for origin, _ in first for d, o in enumerate(origin) if o != first[0][0][d]})
        if len(axes) > 1:
            raise Inexpressible(f"{what}: shards along axes {axes}; Awex's resolver shards along one axis")
        axis = axes[0] if axes else 0
        ndim = len(m.logical_shape)
        shards_of: dict[int, Any] = {}
        for rep in replicas:
            ordered = sorted(rep, key=lambda loc: boxes[loc][0])
            at = [0] * ndim
            for tp_rank, loc in enumerate(ordered):
                origin, shape = boxes[loc]
                if tuple(at) != tuple(origin):
                    raise Inexpressible(
                        f"{what}: location {loc} holds the box at {tuple(origin)}, where Awex's resolver places "
                        f"its shard {tp_rank} at {tuple(at)} (each shard after the previous one along axis {axis}, "
                        "meta_resolver.py:206-214)")
                shards_of[loc] = wm.ParameterShardMeta(
                    tp_rank=tp_rank, attn_tp_rank=0, pp_rank=0, ep_rank=0, ep_tp_rank=0, global_rank=loc,
                    world_size=world, engine_rank=0, name=name, shape=tuple(shape), numel=volume(shape), dtype=dtype,
                    global_offset=tuple(origin),
                )
                at[axis] += shape[axis]
        global_shape = tuple(sum(boxes[loc][1][d] for loc in replicas[0]) if d == axis else boxes[replicas[0][0]][1][d]
                             for d in range(ndim))
        reps = [wm.ParameterReplicaMeta(shards=[shards_of[loc] for loc in rep]) for rep in replicas]
        return wm.ParameterMeta(name=name, global_numel=sum(volume(boxes[loc][1]) for loc in replicas[0]),
                                global_shape=global_shape, dtype=dtype, shards=[s for r in reps for s in r.shards],
                                replicas=reps)

    def translate(self, case: Case) -> dict[str, Any]:
        _no_options(case)
        names = sorted(case.parameters)
        maps = _case_maps(case, None)  # Awex takes both shapes as they come; its own check compares them
        train_world = max((loc for _, s in maps.values() for loc in s.shard_shapes), default=-1) + 1
        infer_world = max((loc for t, _ in maps.values() for loc in t.shard_shapes), default=-1) + 1
        infer, train = [], []
        for name in names:
            t, s = maps[name]
            dtype = getattr(self._torch, _dtype_name(case, name))
            infer.append(self._param_meta(name, merge_dense(t), f"parameter {name!r}, target", dtype, infer_world))
            train.append(self._param_meta(name, merge_dense(s), f"parameter {name!r}, source", dtype, train_world))
        problem = {"names": names, "infer": infer, "train": train, "infer_world": infer_world,
                   "train_world": train_world, "logical": {n: (maps[n][0].logical_shape, maps[n][1].logical_shape)
                                                           for n in names}}
        self._gate(maps, problem)
        return problem

    def contract(self, case: Case, problem: Mapping[str, Any]) -> list[tuple[str, ...]]:
        """Awex syncs between TP sizes that divide each other only: its metadata check refuses any
        other pair on purpose (awex/util/common.py:247-261), before planning."""
        for i, t in zip(problem["infer"], problem["train"]):
            a, b = len(i.replicas[0].shards), len(t.replicas[0].shards)
            if max(a, b) % min(a, b):
                return [("refuse", f"awex {peer_version('awex')}: inference TP {a} and training TP {b} do not divide "
                                   f"each other (parameter {i.name!r}); check_train_infer_params_meta refuses such a "
                                   "pair on purpose before planning (awex/util/common.py:247-261)",
                         r"has wrong tp_size: infer \d+ train \d+")]
        # Awex chooses per inference replica: every rank of one reads the same training replica.
        receivers = {i.name: {shard.global_rank: index for index, replica in enumerate(i.replicas)
                              for shard in replica.shards} for i in problem["infer"]}
        floor = one_source_floor(case, receivers=receivers)
        bound = case.expect.max_sender_load
        if floor is not None and bound is not None and floor.bytes > bound:
            return [("quality", f"awex {peer_version('awex')}: each inference replica receives a parameter from one "
                                "assigned training replica (awex/transfer/transfer_plan.py:288, 320-323), so target "
                                f"location {floor.target_location} reads all {floor.bytes} it needs of parameter "
                                f"{floor.parameter!r} held by {list(floor.holders)} ({floor.regions} region(s)) "
                                f"from one of them: no assignment of replicas meets the bound {bound}")]
        return []

    def design(self, problem: Mapping[str, Any], ops: list[Any]) -> str:
        """Awex 0.9.0's documented choice: inference replica ``i`` of a parameter reads from training
        replica ``i mod T`` (transfer_plan.py:320-323; each inference replica from one assigned
        training replica, 284-288). ``""`` unless every operation's sender is in that replica, or
        for another release."""
        if not self.name.endswith(" 0.9.0"):
            return ""
        infer = {m.name: {shard.global_rank: index for index, replica in enumerate(m.replicas)
                          for shard in replica.shards} for m in problem["infer"]}
        train = {m.name: ({shard.global_rank: index for index, replica in enumerate(m.replicas)
                           for shard in replica.shards}, len(m.replicas)) for m in problem["train"]}
        for op in ops:
            name = op.send_shard_meta.name
            replica_of, count = train[name]
            sender = op.send_rank - problem["infer_world"]
            if replica_of.get(sender) != infer[name][op.recv_rank] % count:
                return ""
        return ("every inference replica i reads each parameter from training replica i mod T "
                "(awex/transfer/transfer_plan.py:320-323), the same for every parameter, as Awex documents")

    @staticmethod
    def _side_map(meta: Any, logical: tuple[int, ...]) -> ParamAffineMap:
        entries = []
        for shard in meta.shards:
            shape = tuple(shard.shape)
            entries.append((shard.global_rank, tuple(shard.global_offset), shape, shape, 0,
                            row_major_strides(shape)))
        return _rebuild_map(logical, entries)

    def rebuild(self, problem: Mapping[str, Any]) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        """The shards' boxes within the case's logical shapes. Awex's own global shape is the
        resolver's (a side holding only part of the tensor reads as a smaller tensor), which
        ``check_train_infer_params_meta`` then compares across the sides, as Awex does."""
        logical = problem["logical"]
        return {i.name: (self._side_map(i, logical[i.name][0]), self._side_map(t, logical[i.name][1]))
                for i, t in zip(problem["infer"], problem["train"])}

    def call_peer(self, problem: Mapping[str, Any]) -> list[Any]:
        """Awex's metadata check, which its reader and writer run before any plan (raising outside
        debug mode: awex/reader/weights_reader.py:216, awex/writer/weights_writer.py:208), then the
        planner."""
        self._common.check_train_infer_params_meta(problem["train"], problem["infer"], raise_exception=True)
        builder = self._plan.TransferPlanBuilder(problem["infer_world"], problem["train_world"], num_infer_engines=1)
        ops: list[Any] = builder.build_weights_mapping_operations(problem["infer"], problem["train"])
        return ops

    def rank_seconds(self, problem: Mapping[str, Any]) -> tuple[float, float]:
        """(CPU, wall) seconds of what one rank of an Awex sync pays to plan, the slower of two
        representative ranks: each rank runs the metadata check and ``build_local_transfer_plan`` for
        itself, all ranks at once (awex/reader/nccl_reader.py:58-66; above 10 000 shards it plans
        only that rank's operations, transfer_plan.py:611-620). ``call_peer``'s one global call,
        which the conversion reads, is no rank's cost: above that size it is about twice one rank's
        (a peer-maintainer review, 2026-12-06). The ranks: the first inference rank and the first
        training rank (the layouts the bench times are symmetric within each side)."""
        _, *check = timed_call(lambda: self._common.check_train_infer_params_meta(
            problem["train"], problem["infer"], raise_exception=True))
        worst = (0.0, 0.0)
        for rank in sorted({0, problem["infer_world"]}):
            def local(rank: int = rank) -> Any:
                builder = self._plan.TransferPlanBuilder(problem["infer_world"], problem["train_world"],
                                                         num_infer_engines=1)
                return builder.build_local_transfer_plan(problem["infer"], problem["train"], rank)

            _, cpu, wall = timed_call(local)
            worst = (max(worst[0], check[0] + cpu), max(worst[1], check[1] + wall))
        return worst

    def convert(self, problem: Mapping[str, Any], ops: list[Any]) -> dict[str, Any]:
        shapes = {n: problem["logical"][n][1] for n in problem["names"]}
        segments: dict[str, list[dict[str, Any]]] = {n: [] for n in problem["names"]}
        for op in ops:
            name = op.send_shard_meta.name
            s_start, s_len = _slices(op.train_slices, tuple(op.send_shard_meta.shape))
            d_start, d_len = _slices(op.inf_slices, tuple(op.recv_shard_meta.shape))
            s_off, s_str = _dense_offset(s_start, tuple(op.send_shard_meta.shape))
            d_off, d_str = _dense_offset(d_start, tuple(op.recv_shard_meta.shape))
            segments[name].append(_segment(tuple(op.overlap_shape),
                                           (op.send_rank - problem["infer_world"], s_off, s_str),
                                           (op.recv_rank, d_off, d_str)))
            if s_len != d_len or s_len != tuple(op.overlap_shape):
                raise ValueError(f"{name}: slices {s_len} / {d_len} disagree with the overlap {op.overlap_shape}")
        return {n: {"logical_shape": list(shapes[n]), "segments": segments[n]} for n in problem["names"]}

