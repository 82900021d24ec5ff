"""Public hypothesis strategies for affine maps, replica answers, adversarial answers and plans.

Other projects use these to test their own planner, checker or oracle against refplan's model
of what is valid: every map drawn here is valid (it passes refplan's rules R1–R28), every
``valid_answers`` draw satisfies Theorem 3's hypotheses, every ``adversarial_answers`` draw breaks
exactly one of the RFC's answer checks, and ``corrupted_plans`` breaks a correct plan in one
place. Examples are kept small (hundreds of elements), so executing them element by element
(``refplan.simulate``) is cheap.

Typical use, in another project's tests::

    from hypothesis import given
    from refplan import strategies as rst
    from refplan.verify import verify_plan

    @given(rst.map_pairs(max_holders=3))
    def test_my_planner_is_exact(pair):
        target, source = pair
        plan = my_planner(target.to_dict(), source.to_dict())   # DeepSpeed's dict form
        assert verify_plan(target, source, plan).ok

and, for a checker of policy answers::

    import pytest
    from hypothesis import given, strategies as st
    from refplan.strategies import adversarial_answers, collect_requests, map_pairs

    @given(st.data())
    def test_my_checker_refuses(data):
        target, source = data.draw(map_pairs())
        requests = collect_requests(target, source)     # what refplan hands a policy
        bad = data.draw(adversarial_answers(requests))
        with pytest.raises(MyPolicyError):
            my_check(requests, bad.answers, min_split_bytes=1)   # bad.kind: which check

The module needs ``hypothesis`` (refplan's ``test`` extra); nothing else in refplan imports it.

What is drawn:

- ``logical_shapes()``: 1–4 axes, size-1 and uneven sizes, bounded element count.
- ``box_partitions(shape)``: exact tilings of a box by recursive guillotine cuts, with 5-box
  pinwheels (tilings that no straight cut separates) substituted at random.
- ``param_maps(shape)`` (alias ``shard_layouts``) and ``replicated_maps(shape)``: a partition of F
  into regions, each held by 1..k locations; each location's shard packs its regions in random
  order by concatenation along random axes, so a piece may be a row slab of its shard, a column
  slab (strides of the shard, not of F), or the whole shard. Holders store a region at different
  offsets. Target maps may store a replica cut at different boundaries (``replica_cuts``).
  Optional zero-extent pieces and arbitrary strides on size-1 axes (both valid) are mixed in.
- ``map_pairs()``: (target map, source map) of one F, possibly with replicas on both sides;
  ``map_batches()``: a whole sync, name → (target map, source map).
- ``endpoints(source, target)`` and ``process_nodes(endpoints)``: location → process bindings
  (local copies happen) and process → node.
- ``valid_answers(requests)``: any holder per request, or a split of its box into parts (any
  tiling, guillotine or not), each part from any holder, all parts of a split at least
  ``min_split_bytes`` (pass the planner the same value).
- ``adversarial_answers(requests)``: one mutation of a valid answer list that one check must
  refuse; ``.kind`` is one of ``ADVERSARIAL_KINDS``.
- ``corrupted_plans(plan, source_map)``: a plan with one segment dropped, duplicated, shifted,
  re-sourced to a non-holder, re-targeted, reshaped or re-strided; ``.kind`` is one of
  ``CORRUPTION_KINDS``. Every corruption changes what the plan means (never a no-op such as
  restriding an axis of extent 1), so an oracle must refuse each one drawn from a valid plan.

Helpers: ``collect_requests(target, source, ...)`` and ``collect_batch_requests(pairs, ...)``
return the requests the planner hands a policy; ``replaying(answers)`` is a policy that answers
with a fixed list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # say which extra brings it, not just that an import failed
    raise ModuleNotFoundError(
        "refplan.strategies needs hypothesis: pip install 'refplan[hypothesis]'", name="hypothesis"
    ) from exc

from .box import Box, decode_row_major, row_major_strides, volume
from .maps import AffinePiece, ParamAffineMap
from .plan import TransferPlan, TransferSegment
from .requests import (
    ReplicaAnswer,
    ReplicaPart,
    ReplicaPolicy,
    ReplicaRequest,
    TransferEndpoints,
)

__all__ = [
    "ADVERSARIAL_KINDS",
    "CORRUPTION_KINDS",
    "AdversarialAnswers",
    "CorruptedPlan",
    "adversarial_answers",
    "box_partitions",
    "collect_batch_requests",
    "collect_requests",
    "corrupted_plans",
    "endpoints",
    "logical_shapes",
    "map_batches",
    "map_pairs",
    "param_maps",
    "pinwheel",
    "process_nodes",
    "replaying",
    "replicated_maps",
    "shard_layouts",
    "valid_answers",
]

Shape = tuple[int, ...]
MapPair = tuple[ParamAffineMap, ParamAffineMap]


# ---------------------------------------------------------------------------------------------
# Shapes and tilings


def logical_shapes(
    *, min_ndim: int = 1, max_ndim: int = 4, max_side: int = 12, max_elements: int = 512
) -> st.SearchStrategy[Shape]:
    """Logical shapes of ``min_ndim..max_ndim`` axes, every side in ``1..max_side``.

    Sizes are drawn axis by axis under a shrinking element budget, so the product never exceeds
    ``max_elements``; size-1 axes and odd/prime sizes (uneven splits) come up often. Shrinks
    toward fewer axes of size 1.
    """
    if not 1 <= min_ndim <= max_ndim:
        raise ValueError(f"need 1 <= min_ndim <= max_ndim, got {min_ndim}, {max_ndim}")
    if max_side < 1 or max_elements < 1:
        raise ValueError("max_side and max_elements must be at least 1")

    @st.composite
    def draw_shape(draw: st.DrawFn) -> Shape:
        ndim = draw(st.integers(min_ndim, max_ndim))
        budget = max_elements
        sides: list[int] = []
        for _ in range(ndim):
            side = draw(st.integers(1, max(1, min(max_side, budget))))
            sides.append(side)
            budget = max(1, budget // side)
        return tuple(sides)

    return draw_shape()


def pinwheel(box: Box, axes: tuple[int, int], cuts: tuple[int, int, int, int],
             reflect: tuple[bool, bool] = (False, False)) -> list[Box]:
    """The 5-box pinwheel tiling of ``box`` on ``axes`` (a, b): no straight cut separates it.

    ``cuts = (x1, x2, y1, y2)`` are offsets from the box origin with ``0 < x1 < x2 < extent[a]``
    and ``0 < y1 < y2 < extent[b]``; four arms turn around the centre ``[x1, x2) × [y1, y2)``.
    ``reflect`` mirrors the figure on either axis. Other axes keep the box's full extent.
    """
    a, b = axes
    x1, x2, y1, y2 = cuts
    size_a, size_b = box.extent[a], box.extent[b]
    if a == b or not (0 < x1 < x2 < size_a and 0 < y1 < y2 < size_b):
        raise ValueError(f"pinwheel cuts {cuts} on axes {axes} do not fit inside {box}")
    rects = [
        (0, x2, 0, y1),
        (x2, size_a, 0, y2),
        (x1, size_a, y2, size_b),
        (0, x1, y1, size_b),
        (x1, x2, y1, y2),
    ]
    out: list[Box] = []
    for lo_a, hi_a, lo_b, hi_b in rects:
        if reflect[0]:
            lo_a, hi_a = size_a - hi_a, size_a - lo_a
        if reflect[1]:
            lo_b, hi_b = size_b - hi_b, size_b - lo_b
        origin = list(box.origin)
        extent = list(box.extent)
        origin[a] += lo_a
        extent[a] = hi_a - lo_a
        origin[b] += lo_b
        extent[b] = hi_b - lo_b
        out.append(Box(tuple(origin), tuple(extent)))
    return out


def _as_box(shape_or_box: Box | Sequence[int]) -> Box:
    if isinstance(shape_or_box, Box):
        return shape_or_box
    shape = tuple(int(s) for s in shape_or_box)
    return Box((0,) * len(shape), shape)


def box_partitions(
    shape_or_box: Box | Sequence[int], *, max_parts: int = 8, pinwheels: bool = True, shuffle: bool = True
) -> st.SearchStrategy[list[Box]]:
    """Exact tilings of a box (a logical shape means the box at the origin) into ≤ ``max_parts``.

    Each step either keeps a box, cuts it in two on an axis of extent ≥ 2 (guillotine), or, with
    ``pinwheels`` and room for 4 more parts, replaces it with a pinwheel on two axes of extent
    ≥ 3, so non-guillotine tilings are drawn too. The box must be non-empty; parts are non-empty
    and, with ``shuffle``, in random order. Shrinks toward the unsplit box.
    """
    root = _as_box(shape_or_box)
    if root.is_empty():
        raise ValueError(f"cannot partition the empty box {root}")
    if max_parts < 1:
        raise ValueError(f"max_parts must be at least 1, got {max_parts}")

    @st.composite
    def draw_partition(draw: st.DrawFn) -> list[Box]:
        done: list[Box] = []
        pending = [root]
        spare = max_parts - 1
        while pending:
            box = pending.pop()
            cut_axes = [a for a in range(box.ndim) if box.extent[a] >= 2]
            wheel_axes = [a for a in range(box.ndim) if box.extent[a] >= 3]
            options = ["keep"]
            if spare >= 1 and cut_axes:
                options.append("cut")
            if pinwheels and spare >= 4 and len(wheel_axes) >= 2:
                options.append("pinwheel")
            choice = draw(st.sampled_from(options))
            if choice == "keep":
                done.append(box)
            elif choice == "cut":
                axis = draw(st.sampled_from(cut_axes))
                lo = box.origin[axis]
                at = draw(st.integers(lo + 1, lo + box.extent[axis] - 1))
                pending.extend(box.split(axis, at))
                spare -= 1
            else:
                a = draw(st.sampled_from(wheel_axes))
                b = draw(st.sampled_from([x for x in wheel_axes if x != a]))
                x1 = draw(st.integers(1, box.extent[a] - 2))
                x2 = draw(st.integers(x1 + 1, box.extent[a] - 1))
                y1 = draw(st.integers(1, box.extent[b] - 2))
                y2 = draw(st.integers(y1 + 1, box.extent[b] - 1))
                flips = (draw(st.booleans()), draw(st.booleans()))
                pending.extend(pinwheel(box, (a, b), (x1, x2, y1, y2), flips))
                spare -= 4
        return list(draw(st.permutations(done))) if shuffle else done

    return draw_partition()


# ---------------------------------------------------------------------------------------------
# Maps


@dataclass(frozen=True)
class _Leaf:
    region: int
    box: Box  # in F
    local: tuple[int, ...]  # origin in the block (later: in the shard)


@dataclass(frozen=True)
class _Block:
    extent: tuple[int, ...]
    leaves: tuple[_Leaf, ...]


def _concat(first: _Block, second: _Block, axis: int) -> _Block:
    """``second`` stored after ``first`` along ``axis`` (they agree on every other axis)."""
    shift = first.extent[axis]
    moved = tuple(
        _Leaf(leaf.region, leaf.box, tuple(o + (shift if a == axis else 0) for a, o in enumerate(leaf.local)))
        for leaf in second.leaves
    )
    extent = tuple(e + (second.extent[a] if a == axis else 0) for a, e in enumerate(first.extent))
    return _Block(extent, first.leaves + moved)


def _joinable_axes(a: _Block, b: _Block) -> list[int]:
    """Axes along which ``a`` and ``b`` can be concatenated (equal extents on all the others)."""
    ndim = len(a.extent)
    out = []
    for axis in range(ndim):
        if all(a.extent[k] == b.extent[k] for k in range(ndim) if k != axis):
            out.append(axis)
    return out


def _stored_region(draw: st.DrawFn, region: int, box: Box, recut: bool, budget: int) -> _Block:
    """A block holding one region: whole, or (``recut``) cut and stored with halves swapped."""
    if not recut or budget < 1 or box.volume < 2 or not draw(st.booleans()):
        return _Block(box.extent, (_Leaf(region, box, (0,) * box.ndim),))
    axes = [a for a in range(box.ndim) if box.extent[a] >= 2]
    axis = draw(st.sampled_from(axes))
    lo = box.origin[axis]
    at = draw(st.integers(lo + 1, lo + box.extent[axis] - 1))
    left, right = box.split(axis, at)
    first = _stored_region(draw, region, left, recut, budget // 2)
    second = _stored_region(draw, region, right, recut, budget // 2)
    if draw(st.booleans()):
        first, second = second, first
    return _concat(first, second, axis)


def _offset(coord: Sequence[int], shape: Sequence[int]) -> int:
    return sum(c * s for c, s in zip(coord, row_major_strides(shape)))


def _strides_for(
    draw: st.DrawFn, extent: Sequence[int], strides: tuple[int, ...], free: bool, limit: int
) -> tuple[int, ...]:
    """Row-major strides, except that a size-1 axis may carry any stride (R13 ignores it)."""
    if not free or not any(e == 1 for e in extent) or not draw(st.booleans()):
        return strides
    return tuple(s if e != 1 else draw(st.integers(0, limit)) for e, s in zip(extent, strides))


def _draw_map(
    draw: st.DrawFn,
    shape: Shape,
    *,
    max_parts: int,
    max_locations: int,
    max_holders: int,
    replica_cuts: bool,
    pinwheels: bool,
    empty_pieces: bool,
    unit_strides: bool,
    sparse_locations: bool,
) -> ParamAffineMap:
    ndim = len(shape)
    full = Box((0,) * ndim, shape)
    regions = draw(box_partitions(full, max_parts=max_parts, pinwheels=pinwheels))
    bins_count = draw(st.integers(1, max_locations))
    bins: list[list[_Block]] = [[] for _ in range(bins_count)]
    for rid, region in enumerate(regions):
        copies = draw(st.integers(1, max(1, min(max_holders, bins_count))))
        chosen = draw(st.lists(st.integers(0, bins_count - 1), min_size=copies, max_size=copies, unique=True))
        for b in chosen:
            bins[b].append(_stored_region(draw, rid, region, replica_cuts, 3))
    shards: list[_Block] = []
    for blocks in bins:
        blocks = list(draw(st.permutations(blocks)))
        while len(blocks) > 1:
            joins = [(i, j, axis) for i in range(len(blocks)) for j in range(i + 1, len(blocks))
                     for axis in _joinable_axes(blocks[i], blocks[j])]
            if not joins or not draw(st.booleans()):
                break
            i, j, axis = draw(st.sampled_from(joins))
            first, second = (blocks[i], blocks[j]) if draw(st.booleans()) else (blocks[j], blocks[i])
            merged = _concat(first, second, axis)
            blocks = [b for k, b in enumerate(blocks) if k not in (i, j)] + [merged]
        shards.extend(blocks)  # a block that joined nothing becomes a location of its own
    count = len(shards)
    if sparse_locations and draw(st.booleans()):
        names = draw(st.lists(st.integers(0, 4 * count + 3), min_size=count, max_size=count, unique=True))
    else:
        names = list(draw(st.permutations(range(count))))
    holders: dict[int, set[int]] = {}
    for name, shard in zip(names, shards):
        for leaf in shard.leaves:
            holders.setdefault(leaf.region, set()).add(name)
    numel = volume(shape)
    f_strides = row_major_strides(shape)
    shard_shapes: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    for name, shard in zip(names, shards):
        s_strides = row_major_strides(shard.extent)
        out = [
            AffinePiece(
                leaf.box.extent,
                _offset(leaf.box.origin, shape),
                _strides_for(draw, leaf.box.extent, f_strides, unit_strides, numel),
                _offset(leaf.local, shard.extent),
                _strides_for(draw, leaf.box.extent, s_strides, unit_strides, volume(shard.extent)),
                sorted(holders[leaf.region]),
            )
            for leaf in shard.leaves
        ]
        out = list(draw(st.permutations(out)))
        if empty_pieces and draw(st.integers(0, 3)) == 3:
            zero_axis = draw(st.integers(0, ndim - 1))
            empty_shape = tuple(0 if a == zero_axis else 1 for a in range(ndim))
            # The builders give an empty piece a running offset that may be one past the end.
            empty = AffinePiece(empty_shape, numel, f_strides, volume(shard.extent), s_strides, [name])
            out.insert(draw(st.integers(0, len(out))), empty)
        shard_shapes[name] = shard.extent
        pieces[name] = out
    if empty_pieces and draw(st.integers(0, 5)) == 5:
        # A location whose shard is empty (a zero-width split, as sub_param_map makes): it may
        # list only empty pieces (R6) and holds nothing, so it never serves or receives data.
        name = max(pieces) + 1 + draw(st.integers(0, 2))
        zero_axis = draw(st.integers(0, ndim - 1))
        empty_shard = tuple(0 if a == zero_axis else s for a, s in enumerate(shape))
        shard_shapes[name] = empty_shard
        pieces[name] = [AffinePiece(empty_shard, 0, f_strides, 0, row_major_strides(empty_shard), [name])][
            : draw(st.integers(0, 1))
        ]
    order = list(draw(st.permutations(sorted(pieces))))
    return ParamAffineMap(shape, {n: shard_shapes[n] for n in order}, {n: pieces[n] for n in order})


def _shape_strategy(shape: Sequence[int] | st.SearchStrategy[Shape] | None) -> st.SearchStrategy[Shape]:
    """A fixed shape, a strategy of shapes, or (``None``) ``logical_shapes()``, as one strategy."""
    if shape is None:
        return logical_shapes()
    if isinstance(shape, st.SearchStrategy):
        return shape
    return st.just(tuple(int(s) for s in shape))


def param_maps(
    shape: Sequence[int] | st.SearchStrategy[Shape] | None = None,
    *,
    max_parts: int = 6,
    max_locations: int = 4,
    max_holders: int = 1,
    replica_cuts: bool = False,
    pinwheels: bool = True,
    empty_pieces: bool = True,
    unit_strides: bool = True,
    sparse_locations: bool = True,
) -> st.SearchStrategy[ParamAffineMap]:
    """Valid maps of F (``shape``, a strategy of shapes, or ``logical_shapes()`` when ``None``).

    F is tiled into ≤ ``max_parts`` regions (``box_partitions``); each region is held by
    1..``max_holders`` of ≤ ``max_locations`` location bins; a bin packs its regions, in random
    order, by concatenating two blocks that agree on every axis but one, along that axis, until
    it stops at random; every block left over becomes a location of its own. So a shard is a
    box, each piece is a box in F and in its shard with row-major strides, holders of a region
    store it at different offsets, and a single-piece shard whose shape differs from F's is the
    "strided column slab" case.

    ``replica_cuts``: a holder may store its copy cut into sub-pieces (with halves swapped), so
    replicas are cut at different boundaries; valid for *target* maps only (a source map with
    such replicas is refused by R24). ``empty_pieces``: sometimes add a zero-extent piece with a
    one-past-the-end offset, as the builders do (R12 skips it), and sometimes a location whose
    shard has a zero-size axis (holding nothing, or one empty piece). ``unit_strides``: a size-1 axis
    may carry any stride (R13 constrains axes of size > 1 only). ``sparse_locations``: location
    ids need not be ``0..n-1``.
    """
    shapes = _shape_strategy(shape)

    @st.composite
    def draw_map(draw: st.DrawFn) -> ParamAffineMap:
        return _draw_map(
            draw,
            draw(shapes),
            max_parts=max_parts,
            max_locations=max_locations,
            max_holders=max_holders,
            replica_cuts=replica_cuts,
            pinwheels=pinwheels,
            empty_pieces=empty_pieces,
            unit_strides=unit_strides,
            sparse_locations=sparse_locations,
        )

    return draw_map()


shard_layouts = param_maps
"""Alias of ``param_maps``: a map *is* the layout of every shard of one parameter."""


def replicated_maps(
    shape: Sequence[int] | st.SearchStrategy[Shape] | None = None,
    *,
    max_holders: int = 3,
    max_parts: int = 6,
    max_locations: int = 5,
    replica_cuts: bool = False,
) -> st.SearchStrategy[ParamAffineMap]:
    """``param_maps`` where each region is held by 1..``max_holders`` locations (at least 2 bins)."""
    return param_maps(
        shape,
        max_parts=max_parts,
        max_locations=max(2, max_locations),
        max_holders=max(2, max_holders),
        replica_cuts=replica_cuts,
    )


def map_pairs(
    shape: Sequence[int] | st.SearchStrategy[Shape] | None = None,
    *,
    max_parts: int = 6,
    max_locations: int = 4,
    max_holders: int = 3,
    target_replicas: bool = True,
) -> st.SearchStrategy[MapPair]:
    """(target map, source map) of one F; sources may hold replicas, targets too (cut differently).

    Target first, like ``plan_transfer``. The shape is drawn once and shared.
    """
    shapes = _shape_strategy(shape)

    @st.composite
    def draw_pair(draw: st.DrawFn) -> MapPair:
        logical = draw(shapes)
        source = draw(param_maps(logical, max_parts=max_parts, max_locations=max_locations, max_holders=max_holders))
        target = draw(
            param_maps(
                logical,
                max_parts=max_parts,
                max_locations=max_locations,
                max_holders=max_holders if target_replicas else 1,
                replica_cuts=target_replicas,
            )
        )
        return target, source

    return draw_pair()


def _locations(maps: ParamAffineMap | Sequence[ParamAffineMap]) -> list[int]:
    if isinstance(maps, ParamAffineMap):
        return list(maps.ranks)
    return sorted({r for m in maps for r in m.ranks})


def map_batches(
    *,
    max_parameters: int = 3,
    max_parts: int = 6,
    max_locations: int = 4,
    max_holders: int = 3,
) -> st.SearchStrategy[dict[str, MapPair]]:
    """A sync of 1..``max_parameters`` parameters: name → (target map, source map).

    Each parameter has its own logical shape and layouts (``map_pairs``); names are short and
    distinct. This is ``plan_transfers``'s ``pairs`` argument.
    """
    names = st.lists(st.sampled_from(["w", "b", "q", "kv", "o", "ln"]), min_size=1,
                     max_size=max(1, max_parameters), unique=True)

    @st.composite
    def draw_batch(draw: st.DrawFn) -> dict[str, MapPair]:
        return {
            name: draw(map_pairs(max_parts=max_parts, max_locations=max_locations, max_holders=max_holders))
            for name in draw(names)
        }

    return draw_batch()


def endpoints(
    source_map: ParamAffineMap | Sequence[ParamAffineMap],
    target_map: ParamAffineMap | Sequence[ParamAffineMap],
    *,
    extra_processes: int = 2,
) -> st.SearchStrategy[TransferEndpoints]:
    """Bind every location of the source map(s) and target map(s) to a process.

    Give one map per side, or every map of a batch per side (locations are batch-wide names).
    Each side is injective (one process per location of that side); both sides draw from one
    pool of ``max(#source, #target) + extra_processes`` process ranks, so local copies (a holder
    in the target's own process) occur, and so do sides with no process in common.
    """
    sources = _locations(source_map)
    targets = _locations(target_map)
    pool = max(len(sources), len(targets)) + max(0, extra_processes)

    @st.composite
    def draw_endpoints(draw: st.DrawFn) -> TransferEndpoints:
        src = draw(st.permutations(range(pool)))[: len(sources)]
        tgt = draw(st.permutations(range(pool)))[: len(targets)]
        return TransferEndpoints(dict(zip(sources, src)), dict(zip(targets, tgt)))

    return draw_endpoints()


def process_nodes(bound: TransferEndpoints, *, max_nodes: int = 3) -> st.SearchStrategy[dict[int, int]]:
    """Process → node for every process ``bound`` names (``plan_transfers(process_node=...)``)."""
    processes = sorted(set(bound.source.values()) | set(bound.target.values()))
    return st.lists(
        st.integers(0, max(0, max_nodes - 1)), min_size=len(processes), max_size=len(processes)
    ).map(lambda nodes: dict(zip(processes, nodes)))


# ---------------------------------------------------------------------------------------------
# Requests and answers


def collect_requests(
    target_map: ParamAffineMap,
    source_map: ParamAffineMap,
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: int | None = None,
    process_node: Mapping[int, int] | None = None,
) -> list[ReplicaRequest]:
    """The requests ``plan_transfer`` hands a policy for these maps (raises what planning raises)."""
    from .planner import SINGLE_PARAMETER  # the strategies must not make the planner a hard import

    return collect_batch_requests(
        {SINGLE_PARAMETER: (target_map, source_map)},
        endpoints=endpoints,
        element_size=None if element_size is None else {SINGLE_PARAMETER: element_size},
        process_node=process_node,
    )


def collect_batch_requests(
    pairs: Mapping[str, MapPair],
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: Mapping[str, int] | None = None,
    process_node: Mapping[int, int] | None = None,
) -> list[ReplicaRequest]:
    """The requests ``plan_transfers`` hands a policy for this batch, in its order."""
    from .planner import collect_requests as planner_requests

    return planner_requests(pairs, endpoints=endpoints, element_size=element_size, process_node=process_node)


def replaying(answers: Sequence[Any]) -> ReplicaPolicy:
    """A policy that ignores its requests and answers ``answers`` (a drawn answer list)."""

    def policy(_requests: Sequence[ReplicaRequest]) -> Sequence[ReplicaAnswer]:
        return answers

    return policy


def _unit(request: ReplicaRequest) -> int:
    """Bytes per element of a request (1 when it carries no byte count)."""
    if request.bytes is None or request.elements == 0:
        return 1
    return request.bytes // request.elements


def _draw_answer(
    draw: st.DrawFn, request: ReplicaRequest, min_split_bytes: int, max_parts: int
) -> ReplicaAnswer:
    locations = list(request.locations)
    if not draw(st.booleans()):
        return draw(st.sampled_from(locations))
    tiles = draw(box_partitions(request.box, max_parts=max_parts))
    unit = _unit(request)
    if len(tiles) >= 2 and any(t.volume * unit < min_split_bytes for t in tiles):
        return draw(st.sampled_from(locations))
    parts = [ReplicaPart(t.origin, t.extent, draw(st.sampled_from(locations))) for t in tiles]
    return tuple(parts) if draw(st.booleans()) else parts


def valid_answers(
    requests: Sequence[ReplicaRequest], *, min_split_bytes: int = 1, max_parts: int = 12
) -> st.SearchStrategy[list[ReplicaAnswer]]:
    """One valid answer per request: a holder's location, or a split served by any holders.

    A split is any ``box_partitions`` tiling of the request's box (guillotine or pinwheel), as a
    list or a tuple of ``ReplicaPart``; a one-part split (the whole box) is drawn too. Every part
    of a split of ≥ 2 parts has at least ``min_split_bytes`` (bytes when the request carries a
    byte count, else elements); a split that would not is answered with a location instead.
    Pass the planner the same ``min_split_bytes``. Shrinks toward whole-box int answers.
    """
    reqs = list(requests)

    @st.composite
    def draw_answers(draw: st.DrawFn) -> list[ReplicaAnswer]:
        return [_draw_answer(draw, r, min_split_bytes, max_parts) for r in reqs]

    return draw_answers()


ADVERSARIAL_KINDS: tuple[str, ...] = (
    "wrong_location",  # an int that no request names as a candidate
    "other_request_location",  # a candidate of another request, not of this one
    "bool_location",  # True/False equal to a candidate (type(x) is int fails, nothing else)
    "float_location",  # 1.0 for candidate 1
    "numpy_location",  # numpy.int64 of a candidate
    "part_bool_location",  # a split whose part names a candidate as a bool
    "part_not_candidate",  # a split whose part names a non-candidate
    "gap",  # a split missing one part of a tiling (inside, disjoint, volume short)
    "overlap",  # a tiling with one part moved elsewhere inside the box (volume equal, overlapping)
    "outside",  # a tiling with one part moved wholly outside the box (volume equal, still disjoint)
    "zero_extent",  # a tiling plus a zero-extent part inside the box
    "wrong_ndim",  # a part with one axis too many or too few
    "not_a_part",  # a part given as a plain tuple
    "empty_split",  # an empty sequence of parts
    "too_few",  # one answer fewer than requests
    "too_many",  # one answer more than requests
    "not_a_sequence",  # the answers as an iterator
)
"""Every kind ``adversarial_answers`` draws; each breaks exactly one check of ``check_answers``."""


@dataclass(frozen=True)
class AdversarialAnswers:
    """A full answer list that one check must refuse.

    ``answers`` is what the policy returns (usually a list; an iterator for ``not_a_sequence``),
    ``kind`` one of ``ADVERSARIAL_KINDS``, ``index`` the request whose answer is broken (``None``
    when the list itself is), ``note`` a human-readable description.
    """

    answers: Any
    kind: str
    index: int | None
    note: str


def _tiling(draw: st.DrawFn, box: Box, min_parts: int) -> list[Box] | None:
    """A tiling of ``box`` with at least ``min_parts`` parts, or ``None`` if the box is too small."""
    if box.volume < min_parts:
        return None
    for _ in range(3):
        tiles = draw(box_partitions(box, max_parts=max(min_parts, 12)))
        if len(tiles) >= min_parts:
            return tiles
    # Fall back to cutting unit slabs off the largest axis until there are enough parts.
    tiles = [box]
    while len(tiles) < min_parts:
        big = max(tiles, key=lambda t: t.volume)
        axis = max(range(big.ndim), key=lambda a: big.extent[a])
        tiles.remove(big)
        tiles.extend(big.split(axis, big.origin[axis] + 1))
    return tiles


def _parts(tiles: Sequence[Box], location: int) -> list[ReplicaPart]:
    return [ReplicaPart(t.origin, t.extent, location) for t in tiles]


def _break_one(
    draw: st.DrawFn, kind: str, requests: Sequence[ReplicaRequest], base: list[Any], index: int
) -> AdversarialAnswers | None:
    """``base`` with request ``index``'s answer broken as ``kind``, or ``None`` if it cannot be."""
    request = requests[index]
    box = request.box
    cands = list(request.locations)
    everyone = {loc for r in requests for loc in r.locations}
    ok = draw(st.sampled_from(cands))
    answers = list(base)

    def done(answer: Any, note: str) -> AdversarialAnswers:
        answers[index] = answer
        return AdversarialAnswers(answers, kind, index, note)

    if kind == "wrong_location":
        bad = draw(st.sampled_from([max(everyone) + 1 + draw(st.integers(0, 3)), min(min(everyone), 0) - 1]))
        return done(bad, f"location {bad} is no request's candidate")
    if kind == "other_request_location":
        others = sorted(everyone - set(cands))
        if not others:
            return None
        bad = draw(st.sampled_from(others))
        return done(bad, f"location {bad} holds another request's region, not this one")
    if kind in ("bool_location", "part_bool_location"):
        flags = [c for c in cands if c in (0, 1)]
        if not flags:
            return None
        flag = bool(draw(st.sampled_from(flags)))
        if kind == "bool_location":
            return done(flag, f"{flag!r} in place of candidate {int(flag)}")
        return done([ReplicaPart(box.origin, box.extent, flag)], f"whole-box part from {flag!r}")
    if kind == "float_location":
        return done(float(ok), f"{float(ok)!r} in place of candidate {ok}")
    if kind == "numpy_location":
        return done(np.int64(ok), f"numpy.int64({ok}) in place of candidate {ok}")
    if kind == "part_not_candidate":
        bad = max(everyone) + 1
        tiles = draw(box_partitions(box, max_parts=12))
        parts = _parts(tiles, ok)
        k = draw(st.integers(0, len(parts) - 1))
        parts[k] = ReplicaPart(parts[k].logical_origin, parts[k].shape, bad)
        return done(parts, f"part {k} served by non-candidate {bad}")
    if kind in ("gap", "overlap"):
        tiling = _tiling(draw, box, 2)
        if tiling is None:
            return None
        tiles = tiling
        k = draw(st.integers(0, len(tiles) - 1))
        if kind == "gap":
            removed = tiles.pop(k)
            return done(_parts(tiles, ok), f"part {removed} missing: a gap of {removed.volume}")
        moved = tiles[k]
        axes = [a for a in range(box.ndim) if moved.extent[a] < box.extent[a]]
        axis = draw(st.sampled_from(axes))
        lo = box.origin[axis]
        hi = box.origin[axis] + box.extent[axis] - moved.extent[axis]
        to = draw(st.integers(lo, hi).filter(lambda x: x != moved.origin[axis]))
        origin = tuple(to if a == axis else o for a, o in enumerate(moved.origin))
        tiles[k] = Box(origin, moved.extent)
        return done(_parts(tiles, ok), f"part {k} moved from {moved} to {tiles[k]}: equal volume, overlapping")
    if kind == "outside":
        tiles = draw(box_partitions(box, max_parts=12))
        k = draw(st.integers(0, len(tiles) - 1))
        moved = tiles[k]
        # Wholly outside, so it overlaps no other part and the volumes still add up: only the
        # containment check can see it (a part half outside would also overlap a neighbour).
        axis = draw(st.integers(0, box.ndim - 1))
        gap = draw(st.integers(0, 2))
        if draw(st.booleans()):
            to = box.origin[axis] - moved.extent[axis] - gap  # below the box
        else:
            to = box.origin[axis] + box.extent[axis] + gap  # above it
        origin = tuple(to if a == axis else o for a, o in enumerate(moved.origin))
        tiles[k] = Box(origin, moved.extent)
        return done(_parts(tiles, ok), f"part {k} moved to {tiles[k]}, outside {box}")
    if kind == "zero_extent":
        tiles = draw(box_partitions(box, max_parts=12))
        axis = draw(st.integers(0, box.ndim - 1))
        empty = Box(box.origin, tuple(0 if a == axis else e for a, e in enumerate(box.extent)))
        parts = _parts(tiles, ok)
        parts.insert(draw(st.integers(0, len(parts))), ReplicaPart(empty.origin, empty.extent, ok))
        return done(parts, f"an extra zero-extent part {empty}")
    if kind == "wrong_ndim":
        tiles = draw(box_partitions(box, max_parts=12))
        parts = _parts(tiles, ok)
        k = draw(st.integers(0, len(parts) - 1))
        p = parts[k]
        if box.ndim >= 2 and draw(st.booleans()):
            wrong = ReplicaPart(p.logical_origin[:-1], p.shape[:-1], ok)
        else:
            wrong = ReplicaPart((*p.logical_origin, 0), (*p.shape, 1), ok)
        parts[k] = wrong
        return done(parts, f"part {k} has {len(wrong.shape)} axes, the box {box.ndim}")
    if kind == "not_a_part":
        return done([(box.origin, box.extent, ok)], "a plain tuple instead of a ReplicaPart")
    if kind == "empty_split":
        return done(draw(st.sampled_from([[], ()])), "a split with no parts")
    raise AssertionError(f"unknown adversarial kind {kind!r}")


def adversarial_answers(
    requests: Sequence[ReplicaRequest],
    *,
    kinds: Sequence[str] = ADVERSARIAL_KINDS,
    min_split_bytes: int = 1,
) -> st.SearchStrategy[AdversarialAnswers]:
    """A valid answer list with exactly one thing broken (see ``ADVERSARIAL_KINDS``).

    Every other answer is drawn by ``valid_answers`` with ``min_split_bytes``. The broken answer
    of a split-based kind may have parts of one element, so run the checker with
    ``min_split_bytes=1`` (or 0): otherwise the split floor would be a second broken check. Kinds
    that need something the batch lacks (a bool needs candidate 0 or 1, another request's
    location needs one that is not this request's, a gap or overlap needs a box of ≥ 2 elements)
    are drawn at a request where possible, else the draw falls back to ``wrong_location`` (check
    ``.kind``); ``requests`` must be non-empty.
    """
    reqs = list(requests)
    if not reqs:
        raise ValueError("adversarial_answers needs at least one request")
    unknown = [k for k in kinds if k not in ADVERSARIAL_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown or no adversarial kinds: {unknown}")

    @st.composite
    def draw_bad(draw: st.DrawFn) -> AdversarialAnswers:
        base: list[Any] = list(draw(valid_answers(reqs, min_split_bytes=min_split_bytes)))
        kind = draw(st.sampled_from(list(kinds)))
        if kind == "too_few":
            return AdversarialAnswers(base[:-1], kind, None, f"{len(reqs) - 1} answers for {len(reqs)} requests")
        if kind == "too_many":
            extra = draw(st.sampled_from(list(reqs[-1].locations)))
            return AdversarialAnswers([*base, extra], kind, None, f"{len(reqs) + 1} answers for {len(reqs)} requests")
        if kind == "not_a_sequence":
            return AdversarialAnswers(iter(base), kind, None, "an iterator, not a sequence")
        start = draw(st.integers(0, len(reqs) - 1))
        for step in range(len(reqs)):
            found = _break_one(draw, kind, reqs, base, (start + step) % len(reqs))
            if found is not None:
                return found
        # No request admits this kind: every batch admits a wrong location.
        found = _break_one(draw, "wrong_location", reqs, base, start)
        assert found is not None
        return found

    return draw_bad()


# ---------------------------------------------------------------------------------------------
# Plans

CORRUPTION_KINDS: tuple[str, ...] = (
    "dropped",  # one segment removed
    "duplicated",  # one segment copied (a double write)
    "shifted_source",  # source offset moved by one stride of some axis (or one element)
    "shifted_target",  # target offset moved likewise
    "resourced",  # read from a source location that holds none of the segment's data
    "retargeted",  # written to another target location
    "reshaped",  # one extent one larger or one smaller (possibly zero)
    "restrided",  # one stride changed (the segment may no longer be a box)
)
"""Every kind ``corrupted_plans`` draws."""


@dataclass(frozen=True)
class CorruptedPlan:
    """``plan`` with one segment corrupted as ``kind`` (``index`` is the segment touched)."""

    plan: TransferPlan
    kind: str
    index: int
    note: str


def _non_holders(seg: TransferSegment, source_map: ParamAffineMap) -> list[int]:
    """Source locations holding none of the logical elements ``seg`` reads (empty if unknown)."""
    shard = source_map.shard_shapes.get(seg.source_rank)
    if shard is None or tuple(seg.source_strides) != row_major_strides(shard):
        return []
    coord = decode_row_major(seg.source_offset, shard)
    if coord is None:
        return []
    read = Box(coord, seg.shape)
    holding: set[int] = set()
    for p in source_map.pieces_by_rank.get(seg.source_rank, ()):
        if p.numel == 0:
            continue
        local = decode_row_major(p.dest_offset, shard)
        if local is not None and read.overlaps(Box(local, p.shape)):
            holding |= p.locations
    return [r for r in source_map.shard_shapes if r not in holding]


def _rebuilt(plan: TransferPlan, segments: Sequence[TransferSegment]) -> TransferPlan:
    return TransferPlan(tuple(segments), plan.logical_shape, sum(s.numel for s in segments))


def _corrupt(
    draw: st.DrawFn, kind: str, plan: TransferPlan, source_map: ParamAffineMap | None,
    target_locations: Sequence[int], index: int,
) -> CorruptedPlan | None:
    segs = list(plan.segments)
    seg = segs[index]

    def done(new: Sequence[TransferSegment], note: str) -> CorruptedPlan:
        return CorruptedPlan(_rebuilt(plan, new), kind, index, note)

    if kind == "dropped":
        del segs[index]
        return done(segs, f"segment {index} dropped")
    if kind == "duplicated":
        segs.insert(draw(st.integers(0, len(segs))), seg)
        return done(segs, f"segment {index} duplicated")
    if kind in ("shifted_source", "shifted_target"):
        strides = seg.source_strides if kind == "shifted_source" else seg.target_strides
        step = draw(st.sampled_from(sorted({1, *(abs(s) for s in strides if s != 0)})))
        delta = step if draw(st.booleans()) else -step
        if kind == "shifted_source":
            segs[index] = TransferSegment(seg.source_rank, seg.source_offset + delta, seg.source_strides,
                                          seg.target_rank, seg.target_offset, seg.target_strides, seg.shape)
        else:
            segs[index] = TransferSegment(seg.source_rank, seg.source_offset, seg.source_strides,
                                          seg.target_rank, seg.target_offset + delta, seg.target_strides, seg.shape)
        return done(segs, f"segment {index}: {kind.split('_')[1]} offset {delta:+d}")
    if kind == "resourced":
        if source_map is None:
            return None
        others = [r for r in _non_holders(seg, source_map) if r != seg.source_rank]
        if not others:
            return None
        new_rank = draw(st.sampled_from(sorted(others)))
        segs[index] = TransferSegment(new_rank, seg.source_offset, seg.source_strides,
                                      seg.target_rank, seg.target_offset, seg.target_strides, seg.shape)
        return done(segs, f"segment {index} reads location {new_rank}, which holds none of its elements")
    if kind == "retargeted":
        others = [r for r in target_locations if r != seg.target_rank]
        if not others:
            return None
        new_rank = draw(st.sampled_from(others))
        segs[index] = TransferSegment(seg.source_rank, seg.source_offset, seg.source_strides,
                                      new_rank, seg.target_offset, seg.target_strides, seg.shape)
        return done(segs, f"segment {index} written to target location {new_rank}")
    if kind == "reshaped":
        axis = draw(st.integers(0, len(seg.shape) - 1))
        delta = 1 if draw(st.booleans()) else -1
        shape = tuple(e + delta if a == axis else e for a, e in enumerate(seg.shape))
        segs[index] = TransferSegment(seg.source_rank, seg.source_offset, seg.source_strides,
                                      seg.target_rank, seg.target_offset, seg.target_strides, shape)
        return done(segs, f"segment {index} shape {seg.shape} -> {shape}")
    if kind == "restrided":
        # Only an axis of extent > 1 ever multiplies its stride: restriding an axis of extent 1
        # would give a plan that means exactly what the original meant.
        axes = [a for a, e in enumerate(seg.shape) if e > 1]
        if not axes:
            return None
        axis = draw(st.sampled_from(axes))
        on_source = draw(st.booleans())
        new_strides = list(seg.source_strides if on_source else seg.target_strides)
        old = new_strides[axis]
        new_strides[axis] = draw(st.integers(0, 2 * max(1, old) + 1).filter(lambda s: s != old))
        if on_source:
            segs[index] = TransferSegment(seg.source_rank, seg.source_offset, tuple(new_strides),
                                          seg.target_rank, seg.target_offset, seg.target_strides, seg.shape)
        else:
            segs[index] = TransferSegment(seg.source_rank, seg.source_offset, seg.source_strides,
                                          seg.target_rank, seg.target_offset, tuple(new_strides), seg.shape)
        side = "source" if on_source else "target"
        return done(segs, f"segment {index}: {side} stride {axis} {old} -> {new_strides[axis]}")
    raise AssertionError(f"unknown corruption kind {kind!r}")


def corrupted_plans(
    plan: TransferPlan,
    source_map: ParamAffineMap | None = None,
    target_map: ParamAffineMap | None = None,
    *,
    kinds: Sequence[str] = CORRUPTION_KINDS,
) -> st.SearchStrategy[CorruptedPlan]:
    """``plan`` with one segment corrupted (see ``CORRUPTION_KINDS``); ``plan`` must move something.

    Every draw changes what the plan means (which element is read from where, or which address
    is written): only segments that move elements are corrupted, and ``restrided`` only changes
    the stride of an axis of extent > 1. For a plan the oracle accepts, every draw is one the
    oracle refuses (a property test checks this over thousands of draws).

    ``resourced`` needs ``source_map`` (to find a location that holds none of the segment's
    elements); ``retargeted`` uses ``target_map``'s locations, or the plan's own target
    locations. A kind impossible for the drawn segment falls back to ``duplicated``. The result
    is a new ``TransferPlan`` with ``moved_elements`` recomputed.
    """
    nonempty = [i for i, s in enumerate(plan.segments) if s.numel > 0]
    if not nonempty:
        raise ValueError("corrupted_plans needs a plan with at least one segment that moves an element")
    unknown = [k for k in kinds if k not in CORRUPTION_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown or no corruption kinds: {unknown}")
    targets = sorted(target_map.ranks) if target_map is not None else sorted({s.target_rank for s in plan.segments})

    @st.composite
    def draw_corrupted(draw: st.DrawFn) -> CorruptedPlan:
        kind = draw(st.sampled_from(list(kinds)))
        index = draw(st.sampled_from(nonempty))  # an empty segment's corruption would change nothing
        found = _corrupt(draw, kind, plan, source_map, targets, index)
        if found is None:
            found = _corrupt(draw, "duplicated", plan, source_map, targets, index)
        assert found is not None
        return found

    return draw_corrupted()
