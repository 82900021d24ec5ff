"""``plan_transfers`` and ``plan_transfer``: the pipeline of the proof, and nothing else.

For every parameter (sorted by name): validate both maps into frames (Premise A, holders),
group source regions (Premise B), check target coverage, intersect (Premise C), and build the
requests. Then the policy sees *all* requests of the batch at once, its answers are checked
exactly (Theorem 3's hypotheses), and only then are segments emitted, coalesced and measured
against the budget. Any failure raises before anything is returned: no partial plan, ever.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from functools import partial
from itertools import chain, repeat
from math import prod
from operator import add, attrgetter, contains, itemgetter, mul, sub
from typing import Any, NamedTuple

from . import limits
from ._gc import cycle_collection_paused
from .box import row_major_strides
from .check import DEFAULT_MIN_SPLIT_BYTES, ResolvedAnswer, check_answers
from .endpoints import PROCESS_NODE_NEEDS_ENDPOINTS, check_endpoints
from .errors import (
    AffineTransferError,
    InvalidMapError,
    InvalidReplicaPolicyError,
    PolicyRaisedError,
    show_ints,
    type_name,
)
from .frames import NormalizedMap, normalize, pair_budget, plain_logical
from .limits import PlanBudget, as_budget
from .maps import MapContent, ParamAffineMap, SlabFacts, SlabSpan, _Unknown, describe
from .plan import (
    TransferPlan,
    TransferSegment,
    coalesce,
    encode_segments,
    make_plan,
    make_segment,
    make_statistics,
)
from .policies import balanced, first_holder, from_selector, lpt
from .policies.simple import ROW_FORMS, HolderKey, request_load, uses_processes
from .policies.split_balanced import made_by_split_balanced
from .regions import Intersection, check_target_cover, intersections, source_regions
from .requests import (
    ReplicaAnswer,
    ReplicaPolicy,
    ReplicaRequest,
    ReplicaSelectionRequest,
    TransferEndpoints,
    _make_uniform_request,
    build_requests,
    holder_locations,
)

__all__ = ["SINGLE_PARAMETER", "collect_requests", "plan_transfer", "plan_transfers"]

SINGLE_PARAMETER = "param"
"""The parameter name ``plan_transfer`` uses for its one parameter in requests and messages."""


class _Layout:
    """One distinct (target, source) layout of a batch, validated once and reused.

    Besides what validation produced (frames, intersections, counters) it keeps the requests
    built for the first parameter of this layout (per element size: ``bytes`` depends on it),
    which later parameters share instead of rebuilding (their names travel beside them: see
    ``_for_policy`` and ``check_answers(parameters=...)``), and the plans already
    emitted for it, keyed by the answers that produced them: a plan is a pure function of the
    layout, the batch's budget and the chosen holders, so a parameter whose layout and answers
    equal an earlier one's gets that plan (immutable, shared) without emitting or coalescing again.

    Emitting reads only the logical shape, both sides' shard shapes and the number of target
    frames, kept here so that a layout settled by ``_slab_layout`` (no frames, no intersection
    objects: ``slabs`` holds what its requests are made of) is emitted by the same code.
    """

    __slots__ = ("checks", "frame_count", "inters", "logical", "plans", "regions", "rows", "slabs",
                 "source_shards", "target_shards", "templates")

    def __init__(
        self, target: NormalizedMap, source: NormalizedMap, inters: list[Intersection], regions: int, checks: int
    ) -> None:
        self.logical = target.logical_shape
        self.target_shards: Mapping[int, tuple[int, ...]] = target.shard_shapes
        self.source_shards: Mapping[int, tuple[int, ...]] = source.shard_shapes
        self.frame_count = len(target.frames)
        self.inters = inters
        self.regions = regions
        self.checks = checks
        self.slabs: list[_Slab] | None = None
        self.templates: dict[int | None, list[ReplicaRequest]] = {}
        self.rows: dict[int | None, _Rows] = {}
        self.plans: dict[tuple[Any, ...], TransferPlan] = {}


_Rows = tuple[list[HolderKey], list[int]]
"""A slab layout's requests as refplan's own policies read them (``policies.simple.ROW_FORMS``),
one row per slab in request order: its ``HolderKey`` and its load (bytes, or elements without
an element size). Made instead of request objects when the batch is planned by rows."""


class _Prepared(NamedTuple):
    """One parameter after validation: its layout, and its requests or (planned by rows) its
    rows; exactly one of the two is not ``None``."""

    name: str
    layout: _Layout
    requests: list[ReplicaRequest] | None
    shared: bool  # the layout is the batch's memoized one: its plans may be reused
    rows: _Rows | None


_new_prepared = partial(tuple.__new__, _Prepared)
"""``_Prepared`` from a 5-tuple without the named tuple's Python ``__new__`` (once per parameter)."""


def _prepare(
    name: str,
    target_map: ParamAffineMap,
    source_map: ParamAffineMap,
    budget: PlanBudget,
    endpoints: TransferEndpoints | None,
    element_size: int | None,
    process_node: Mapping[int, int] | None,
    memo: _Memo | None = None,
    bindings: _Bindings | None = None,
    by_rows: bool = False,
) -> _Prepared:
    if not isinstance(target_map, ParamAffineMap) or not isinstance(source_map, ParamAffineMap):
        raise InvalidMapError(f"parameter {name!r}: expected a (target ParamAffineMap, source ParamAffineMap) pair")
    if target_map.logical_shape != source_map.logical_shape:  # R0
        raise InvalidMapError(
            f"parameter {name!r}: the target map describes F of shape {show_ints(target_map.logical_shape)} but "
            f"the source map describes {show_ints(source_map.logical_shape)}; a reshape is not a transfer"
        )
    key = _content_key(target_map, source_map) if memo is not None else None
    layout = None if key is None or memo is None else memo.get(key)
    if layout is None:
        layout = _slab_layout(target_map, source_map, budget)
        if layout is None:
            layout = _validated(name, target_map, source_map, budget)
        if key is not None and memo is not None:
            memo[key] = layout
    # A remembered layout with requests for this element size never gets here: ``_prepare_batch``
    # hands out those shared requests itself.
    requests = None
    if layout.slabs is not None:
        if by_rows:
            rows = _slab_rows(layout.slabs, element_size, endpoints, process_node, bindings)
            if rows is not None:
                if key is not None:
                    layout.rows[element_size] = rows
                return _new_prepared((name, layout, None, key is not None, rows))
        else:
            requests = _slab_requests(name, layout.slabs, element_size, endpoints, process_node, bindings)
        if requests is None:  # a location or process without a binding: ``build_requests`` names it
            layout = _validated(name, target_map, source_map, budget)
    if requests is None:
        requests = build_requests(
            name, layout.inters, endpoints=endpoints, element_size=element_size, process_node=process_node
        )
    if key is not None:
        # Built (and so bound to endpoints without error) for this parameter: later parameters of
        # the layout share these; the policy sees copies named for each parameter (``_for_policy``).
        layout.templates[element_size] = requests
    return _new_prepared((name, layout, requests, key is not None, None))


def _validated(name: str, target_map: ParamAffineMap, source_map: ParamAffineMap, budget: PlanBudget) -> _Layout:
    """The general path: both maps validated into frames, regions and intersections, or refused."""
    source_work = pair_budget(name, "source", budget)
    source = normalize(source_map, "source", name, budget, source_work)
    target_work = pair_budget(name, "target", budget)
    target = normalize(target_map, "target", name, budget, target_work)
    regions = source_regions(source, source_work)
    check_target_cover(target, target_work)
    joint = pair_budget(name, "target", budget)
    inters = intersections(target, regions, joint)
    return _Layout(target, source, inters, len(regions), source_work.count + target_work.count + joint.count)


_Slab = tuple[
    int, tuple[int, ...], tuple[int, ...], int, tuple[int, ...], tuple[int, tuple[int, ...]], int, tuple[int, ...]
]
"""One request of a slab layout without its parameter and bytes: (target location, logical
origin, shape, target offset, target strides, the holders' one read address (offset, strides)),
as ``build_requests`` fills them in, then the shape's volume and the holders' locations (one
tuple per source box, shared by its requests, so that ``_slab_requests`` binds each box's
holders once). Every holder of a source box holds it as its whole shard with the same strides,
so all of a request's candidates read it at one address (``requests._UniformRequest``)."""

_FIRST = itemgetter(0)
_DECLARED = itemgetter(5)  # an ``AffinePiece``'s ``locations``


def _slab_side(content: MapContent, budget: PlanBudget) -> SlabFacts | None:
    """(axis, distinct boxes) of a map in which every location holds one whole-shard piece that is
    a contiguous slab of F along one axis (every other axis whole), or ``None`` for any other map.
    The axis is ``None`` when the map has one distinct box, all of F (its span is then along
    axis 0).

    ``None`` unless the map is within ``plain_logical``'s bounds for this budget (at most
    ``limits.SLAB_MAP_PIECES`` and ``max_pieces_per_map`` pieces, at most ``max_ndim`` positive
    axes of at most 2**62, a volume of at most 2**62), and its structure is a slab map's
    (``_slab_structure``). The structure is a pure function of the content, so it is kept on the
    content (``MapContent.slabs``) once known; the builders that know it from their arguments
    fill it in as they build.
    """
    bounds = plain_logical(content, budget, limits.SLAB_MAP_PIECES)
    if bounds is None:
        return None
    facts = content.slabs
    if isinstance(facts, _Unknown):
        facts = _slab_structure(content, bounds[0], bounds[1])
        _set_attribute(content, "slabs", facts)
    return facts


def _slab_structure(content: MapContent, logical: tuple[int, ...], strides: tuple[int, ...]) -> SlabFacts | None:
    """The slab structure of a map whose F has shape ``logical`` (positive extents) and row-major
    ``strides``, worked out from its pieces, or ``None`` if it is not a slab map.

    A slab map: every location holds exactly one piece (its shard shape, naming the location
    among its holders), with F's row-major strides on the logical side and the shard's on the
    shard side, scale 1, shard offset 0; the distinct boxes are laid end to end along one axis
    from 0 to its extent (so disjoint, and covering F), every other axis whole, and each box's
    pieces name exactly the locations that hold it. Then every piece is a frame whose box is its
    slab, and nothing can be refused (``frames._small_normalize`` accepts the map and all its
    rules pass).
    """
    ndim = len(logical)
    shards = content.shard_shapes
    held = content.pieces_by_rank
    if len(shards) != len(held):
        return None
    # Per location only C-level passes: its one piece (KeyError: no pieces listed; ValueError:
    # none, or several), whose shard is the location's and whose declared holders include it.
    # Replicas repeat one piece object, so the rest is worked out once per distinct piece (by
    # identity; the content keeps every piece alive).
    locations = [*shards]
    try:
        pieces = [piece for (piece,) in map(held.__getitem__, locations)]
    except (KeyError, ValueError):
        return None
    if [*map(_FIRST, pieces)] != [*shards.values()] or not all(
        map(contains, map(_DECLARED, pieces), locations)
    ):
        return None
    axis: int | None = None
    whole = False  # a piece is all of F
    boxes: dict[tuple[int, int], tuple[frozenset[int], tuple[int, ...]]] = {}
    checked: tuple[int, ...] | None = None  # the last shape checked (TP slabs share one)
    expect = strides  # its row-major strides
    for piece in dict(zip(map(id, pieces), pieces)).values():
        shape, source_offset, source_strides, dest_offset, dest_strides, declared, scale = piece
        if source_strides != strides or dest_offset != 0 or scale != 1.0:
            return None
        if shape != checked:  # once the axis is named, a shape's checks do not change
            if len(shape) != ndim:
                return None
            if shape == logical:
                whole = True
                expect = strides
            else:
                if axis is None:  # the first slab that is not all of F names the axis
                    axis = next(a for a in range(ndim) if shape[a] != logical[a])
                if shape[:axis] != logical[:axis] or shape[axis + 1:] != logical[axis + 1:]:
                    return None
                # A slab's row-major strides are F's but on the axes before its own (no stride
                # counts the extent along axis 0), so only a slab along a later axis needs them.
                expect = row_major_strides(shape) if axis else strides
            checked = shape
        if dest_strides != expect:
            return None
        along = 0 if axis is None else axis
        first, within = divmod(source_offset, strides[along])
        size = shape[along]
        if within or first < 0 or size <= 0 or first + size > logical[along]:
            return None
        known = boxes.get((first, size))
        if known is None:
            boxes[(first, size)] = (declared, dest_strides)
        elif known[0] != declared:  # two pieces of one box must name the same holders
            return None
    if axis is not None and whole:
        return None  # all of F beside slabs: overlaps (its span was measured along another axis)
    # Each location is in its piece's declared holders, the boxes' holders are one set per box,
    # and those sets have as many members as there are locations: the locations holding a box
    # (which split the locations among the boxes) are then exactly its declared holders.
    if sum(map(len, map(_FIRST, boxes.values()))) != len(locations):
        return None
    spans: list[SlabSpan] = []
    end = 0
    for (first, size), (declared, box_strides) in sorted(boxes.items()):  # distinct keys
        if first != end:  # a gap, or two boxes that overlap
            return None
        end = first + size
        spans.append((first, size, tuple(sorted(declared)) if len(declared) > 1 else tuple(declared), box_strides))
    return (axis, tuple(spans)) if end == logical[0 if axis is None else axis] else None


_SECOND = itemgetter(1)
_THIRD = itemgetter(2)


def _slab_layout(target_map: ParamAffineMap, source_map: ParamAffineMap, budget: PlanBudget) -> _Layout | None:
    """The layout of two slab maps (``_slab_side``) split along the same axis (or one of them
    all of F), settled without frames, regions or intersection objects; ``None`` for anything
    else (then the general path decides).

    Why: with every parameter's shape distinct the batch memo never hits, and the usual layouts
    (TP splits of a weight, replicated by DP; norms and biases replicated whole on both sides)
    paid for frames, regions and intersections that a sorted merge of index ranges along one
    axis decides. Under these conditions the general path (``_small_normalize``, the separation
    shortcuts of ``regions``, then ``intersections``) accepts both maps and charges, per counter
    (``F`` frames, one per location, ``G`` distinct boxes; a ``2·G`` or ``G`` term only if
    ``G > 1``): source ``F_s + 2·G_s``, target ``F_t + G_t`` plus ``G_t`` (``_small_normalize``'s
    look per frame and per distinct box, ``check_target_cover``'s per distinct box), and joint:

    - unreplicated target boxes (``G_t = F_t``): ``_small_intersections``'s slab join finds the
      axis and charges ``F_t + G_s + overlaps``; taken only if ``F_t + G_s`` is below
      ``limits.ARRAY_MIN_PIECES`` (the general path's own condition for that join);
    - a replicated target box (``G_t < F_t``): two equal boxes meet on every axis, so neither
      the slab join nor ``box._interval_join`` applies (nothing charged) and the k-d walk of
      ``box._partition_pairs`` runs on the ``n = F_t + G_s`` boxes: its root cell charges ``n``,
      is not settled by its shortcut (both sides present, no axis separates), and with
      ``n <= limits.LEAF`` is not cut, so it is one leaf charging ``n(n-1)/2``; taken only then.

    Taken only if each counter stays within ``max_pair_checks``, so refusals, statistics and
    requests (``_slab_requests``) are the general path's. tests/test_small_fast_path.py and
    tests/test_replicated_fast_path.py hold both equal.
    """
    if type(target_map) is not ParamAffineMap or type(source_map) is not ParamAffineMap:
        return None
    target, source = target_map._content, source_map._content
    if type(target) is not MapContent or type(source) is not MapContent:
        return None
    target_side = _slab_side(target, budget)
    if target_side is None:
        return None
    target_axis, target_spans = target_side
    distinct = len(target_spans)
    frames = target.pieces  # one whole-shard piece per location (``_slab_side``)
    replicated = distinct != frames
    if replicated and frames + 1 > limits.LEAF:  # more boxes than one leaf, whatever the source
        return None
    source_side = _slab_side(source, budget)
    if source_side is None:
        return None
    source_axis, source_spans = source_side
    if source_axis is not None and target_axis is not None and source_axis != target_axis:
        return None  # the parts would not be slabs along one axis
    regions = len(source_spans)
    boxes = frames + regions
    if replicated:
        if boxes > limits.LEAF:  # the k-d walk would cut the root cell
            return None
        joint = boxes + boxes * (boxes - 1) // 2
    elif boxes >= limits.ARRAY_MIN_PIECES:
        return None
    else:
        joint = boxes  # plus one per overlap, counted below
    source_work = source.pieces + (2 * regions if regions > 1 else 0)
    target_work = frames + (2 * distinct if distinct > 1 else 1)
    logical = target.logical_shape
    axis = target_axis if target_axis is not None else source_axis if source_axis is not None else 0
    # All of F, as a span along the other side's axis (its strides are F's either way).
    if target_axis is None:
        target_spans = ((0, logical[axis], target_spans[0][2], target_spans[0][3]),)
    if source_axis is None:
        source_spans = ((0, logical[axis], source_spans[0][2], source_spans[0][3]),)
    starts = [*map(_FIRST, source_spans)]
    ends = [*map(add, starts, map(_SECOND, source_spans))]
    # Every holder of a box has it as its whole shard: the shard strides of a box are those of
    # its shape (F's with the box's extent on the axis), as ``_slab_side`` checked them.
    before, after = logical[:axis], logical[axis + 1:]
    zeros_before, zeros_after = (0,) * axis, (0,) * len(after)
    # Each distinct target box's parts, in origin order, as slabs of its first holder; a box's
    # other holders (replicas) repeat them under their own location. Then request order: target
    # location (each holds one box), then origin: a stable sort by location, which leaves each
    # location's slabs in origin order (and is one pass when the locations already come in order).
    rest = prod(before) * prod(after)  # a part's volume is its extent along the axis times this
    slabs: list[_Slab] = []
    append = slabs.append
    for first, size, locations, target_strides in target_spans:
        stop = first + size
        step = target_strides[axis]
        owner = locations[0]
        others = locations[1:]
        for k in range(bisect_right(ends, first), bisect_left(starts, stop)):
            region_first, region_size, holders, strides = source_spans[k]
            lo = first if first > region_first else region_first
            end = region_first + region_size
            extent = (stop if stop < end else end) - lo
            slab = (
                owner, (*zeros_before, lo, *zeros_after), (*before, extent, *after), (lo - first) * step,
                target_strides, ((lo - region_first) * strides[axis], strides), extent * rest, holders,
            )
            append(slab)
            for location in others:
                append((location, *slab[1:]))
    slabs.sort(key=_FIRST)
    if not replicated:
        joint += len(slabs)
    if max(source_work, target_work, joint) > budget.max_pair_checks:
        return None
    layout = _new_object(_Layout)
    layout.logical = logical
    layout.target_shards = target.shard_shapes
    layout.source_shards = source.shard_shapes
    layout.frame_count = frames
    layout.inters = []
    layout.regions = regions
    layout.checks = source_work + target_work + joint
    layout.slabs = slabs
    layout.templates = {}
    layout.rows = {}
    layout.plans = {}
    return layout


_Bindings = dict[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...] | None, dict[int, HolderKey]]]
"""Source holder locations -> (their processes, those processes' nodes or ``None`` without a node
binding, and the rows' keys made with them so far by target process: ``_slab_rows``), for one
batch's endpoints and node binding."""


def _slab_requests(
    name: str,
    slabs: list[_Slab],
    element_size: int | None,
    endpoints: TransferEndpoints | None = None,
    process_node: Mapping[int, int] | None = None,
    bindings: _Bindings | None = None,
) -> list[ReplicaRequest] | None:
    """The requests of a ``_slab_layout`` for parameter ``name``: ``build_requests``'s, field for
    field, or ``None`` if ``endpoints`` or ``process_node`` leave a location or process of the
    layout unbound (then ``build_requests`` refuses, naming the first one in its own order).
    ``bindings`` as for ``_slab_rows``, whose rows these requests are made of."""
    bound: _Bindings = {} if bindings is None else bindings
    rows = _slab_rows(slabs, element_size, endpoints, process_node, bound)
    if rows is None:
        return None
    keys, loads = rows
    nodes = [None] * len(slabs) if process_node is None else [*map(process_node.__getitem__, map(_THIRD, keys))]
    unbound = (None, None)  # no endpoints: no holder tuple is bound
    return [
        _make_uniform_request(
            name, loc, process, origin, shape, offset, strides, ranks, read, processes,
            None if element_size is None else load, bound.get(ranks, unbound)[1], node,
        )
        for (loc, origin, shape, offset, strides, read, _numel, ranks), (_, processes, process), load, node
        in zip(slabs, keys, loads, nodes)
    ]


def _slab_rows(
    slabs: list[_Slab],
    element_size: int | None,
    endpoints: TransferEndpoints | None,
    process_node: Mapping[int, int] | None,
    bindings: _Bindings | None,
) -> _Rows | None:
    """The rows of a ``_slab_layout``'s requests (``_Rows``: what ``_slab_requests`` would put in
    each request's holders, candidate processes, target process and load), or ``None`` if
    ``endpoints`` or ``process_node`` leave a location or process of the layout unbound.

    ``bindings``: the processes and nodes of holder tuples already bound in this batch (the
    caller keeps it for one batch: they depend only on the locations, the endpoints and the node
    binding). Distinct parameters of a model name the same few holder tuples, so each is bound
    once per batch instead of once per parameter."""
    sizes = [*map(_NUMEL, slabs)] if element_size is None else [numel * element_size for numel in map(_NUMEL, slabs)]
    if endpoints is None:
        return [(ranks, (None,) * len(ranks), None) for ranks in map(_RANKS, slabs)], sizes
    targets, sources = endpoints.target, endpoints.source
    # Processes and nodes of candidates depend only on their locations: bound once per holder
    # tuple (by value) in the batch, which every request that reads its box repeats.
    bound: _Bindings = {} if bindings is None else bindings
    keys: list[HolderKey] = []
    append = keys.append
    for loc, ranks in zip(map(_FIRST, slabs), map(_RANKS, slabs)):
        if loc not in targets:
            return None
        process = targets[loc]
        known = bound.get(ranks)
        if known is None:
            if not all(map(sources.__contains__, ranks)):
                return None
            processes = tuple(map(sources.__getitem__, ranks))
            if process_node is not None:
                if not all(map(process_node.__contains__, processes)):
                    return None
                known = bound[ranks] = (processes, tuple(map(process_node.__getitem__, processes)), {})
            else:
                known = bound[ranks] = (processes, None, {})
        if process_node is not None and process not in process_node:
            return None
        # One key object per (holders, target process) in the batch: the policies' row forms
        # recognise a key they met before by its identity (``_Units.place_rows``), and distinct
        # parameters of a model repeat a handful of these keys.
        key = known[2].get(process)
        if key is None:
            key = known[2][process] = (ranks, known[0], process)
        append(key)
    return keys, sizes


_NUMEL = itemgetter(6)  # a ``_Slab``'s volume
_RANKS = itemgetter(7)  # a ``_Slab``'s holder locations


def _renamed(request: ReplicaRequest, name: str) -> ReplicaRequest:
    """``dataclasses.replace(request, parameter=name)`` without the frozen ``__init__``'s cost: a
    plain ``ReplicaRequest`` (a uniform one's candidates made), holding nothing else."""
    clone = _new_object(ReplicaRequest)
    if type(request) is ReplicaRequest:
        values = request.__dict__.copy()
    else:
        values = dict(zip(_REQUEST_FIELDS, _ALL_FIELDS(request)))
    values["parameter"] = name
    _set_attribute(clone, "__dict__", values)
    return clone


_REQUEST_FIELDS = tuple(f.name for f in fields(ReplicaRequest))
_ALL_FIELDS = attrgetter(*_REQUEST_FIELDS)


_new_object = object.__new__
_set_attribute = object.__setattr__

_SHAPE = attrgetter("shape")

_Memo = dict[tuple[MapContent, MapContent], _Layout]


def _content_key(target_map: ParamAffineMap, source_map: ParamAffineMap) -> tuple[MapContent, MapContent] | None:
    """The pair of shared contents a layout is remembered under, or ``None`` if not memoizable.

    Models repeat layouts: every layer of a transformer has the same maps, and an MoE model has
    tens of thousands of expert weights over a few dozen layouts. So a batch validates each
    distinct (target, source) layout once and reuses its frames, regions and intersections — and
    its requests and plans (see ``_Layout``) — for every parameter with exactly the same content.
    Maps are hash-consed as they are built (``maps.MapContent``): equal content is the same
    immutable object, so the layout is recognized by identity, in C, without touching the
    parameter's pieces. Validation is a pure function of that content and of the batch's budget,
    so the reuse changes nothing: a layout is remembered only after it passed.

    Only exact ``ParamAffineMap`` instances whose content is a shared ``MapContent`` (every piece
    exactly an ``AffinePiece``; a content forced onto a map must be one too) with at most
    ``limits.MEMO_MAX_PIECES`` pieces are remembered; anything else is validated afresh.
    """
    if type(target_map) is not ParamAffineMap or type(source_map) is not ParamAffineMap:
        return None
    target, source = target_map.content, source_map.content
    if type(target) is not MapContent or type(source) is not MapContent:
        return None
    if max(target.pieces, source.pieces) > limits.MEMO_MAX_PIECES:
        return None
    return target, source


def _emit(prepared: _Prepared, answers: Sequence[ResolvedAnswer]) -> list[TransferSegment]:
    """One segment per part; addresses come from the chosen holder, never from the policy."""
    out: list[TransferSegment] = []
    append = out.append
    for request, parts in zip(prepared.requests or (), answers):
        origin = request.logical_origin
        if len(parts) == 1 and parts[0][0].origin == origin:  # the whole request: no shift
            pbox, cand = parts[0]
            append(make_segment(cand.source_rank, cand.source_offset, cand.source_strides, request.target_location,
                                request.target_offset, request.target_strides, pbox.extent))
            continue
        for pbox, cand in parts:
            delta = list(map(sub, pbox.origin, origin)) if pbox.origin != origin else None
            out.append(
                make_segment(
                    cand.source_rank,
                    cand.source_offset + (int(sum(map(mul, delta, cand.source_strides))) if delta else 0),
                    cand.source_strides,
                    request.target_location,
                    request.target_offset + (int(sum(map(mul, delta, request.target_strides))) if delta else 0),
                    request.target_strides,
                    pbox.extent,
                )
            )
    return out


def _finish_all(
    prepared: list[_Prepared], resolved: Sequence[Any], budget: PlanBudget
) -> dict[str, TransferPlan]:
    """Every parameter's plan: emitted, coalesced and measured, or reused from its layout.
    ``resolved``: the checked answers (``ResolvedAnswer``) of parameters with requests, the
    chosen locations of those planned by rows (``_row_answers``).

    Reuse is keyed on everything the plan depends on besides the layout and the budget (both the
    same for the whole layout): the holder chosen for each request, and for a split every part's
    box and holder. Only plans that passed the budget checks are remembered, so a
    refusal is always raised (and named) for the parameter that causes it.
    """
    plans: dict[str, TransferPlan] = {}
    # Layouts belong to one batch, so only one that several parameters share can ever return a
    # remembered plan: the others (every layout of a distinct batch) skip the memo key.
    sharing = Counter(map(id, map(_LAYOUT, prepared)))
    start = 0
    for p in prepared:
        by_rows = p.requests is None  # then ``resolved`` holds the chosen locations (``_row_answers``)
        stop = start + (len(p.layout.slabs or ()) if by_rows else len(p.requests or ()))
        answers = resolved[start:stop]
        if p.shared and sharing[id(p.layout)] > 1:
            # What each answer contributes to its plan's memo key: the holder of a whole
            # request, else every part (box and holder) of its split.
            choice = tuple(answers) if by_rows else tuple([a[0][1].source_rank if len(a) == 1 else a for a in answers])
            plan = p.layout.plans.get(choice)
            if plan is None:
                plan = p.layout.plans[choice] = _emit_rows(p, answers, budget) if by_rows else _emit_plan(
                    p, answers, budget)
        else:
            plan = _emit_rows(p, answers, budget) if by_rows else _emit_plan(p, answers, budget)
        plans[p.name] = plan
        start = stop
    return plans


def _emit_rows(prepared: _Prepared, chosen: Sequence[int], budget: PlanBudget) -> TransferPlan:
    """The plan of a parameter planned by rows: one segment per slab, read from the chosen holder
    at the slab's one read address (``_emit``'s segment for that whole answer)."""
    layout = prepared.layout
    slabs = layout.slabs or []
    raw = _row_segments(chosen, slabs)
    return _measured_plan(prepared.name, layout, raw, _lone_merge_checks(layout, len(raw), budget), 0, len(slabs),
                          budget)


def _row_segments(chosen: Sequence[int], slabs: Sequence[_Slab]) -> list[TransferSegment]:
    """One segment per slab, read from its chosen holder: ``_emit``'s segment for a whole answer
    with the candidate (chosen, *read) (proofs/differential.py holds both to the emit model)."""
    return [
        make_segment(rank, read[0], read[1], loc, offset, strides, shape)
        for rank, (loc, _origin, shape, offset, strides, read, _numel, _ranks) in zip(chosen, slabs)
    ]


def _emit_plan(prepared: _Prepared, answers: Sequence[ResolvedAnswer], budget: PlanBudget) -> TransferPlan:
    raw = _emit(prepared, answers)
    parts = [*map(len, answers)]
    splits = len(parts) - parts.count(1) - parts.count(0)  # answers of more than one part
    lone = _lone_checks(prepared.layout, answers, len(raw), budget)
    return _measured_plan(prepared.name, prepared.layout, raw, lone, splits, len(answers), budget)


def _measured_plan(
    name: str, layout: _Layout, raw: list[TransferSegment], lone: int | None, splits: int, requests: int,
    budget: PlanBudget,
) -> TransferPlan:
    """A parameter's plan from its emitted segments: coalesced (unless ``lone`` gives what
    ``coalesce`` would charge for segments it would keep as they are), then refused if over
    ``max_segments`` or ``max_plan_bytes`` (the policy's error if it split ``splits``
    requests), measured and counted."""
    if lone is not None:
        # Already in ``TransferSegment.sort_key`` order, which ``coalesce`` would produce: a slab
        # layout's requests go by target location, each location's by origin along the axis, so
        # whole answers give segments by (target rank, strictly rising target offset).
        segments, merge_checks = raw, lone
    else:
        segments, merge_checks = coalesce(raw, layout.source_shards, layout.target_shards, budget, name)
    # A budget exhausted only because the policy split requests is the policy's failure (RFC: the
    # extra segments from splits must stay within max_segments and max_plan_bytes); otherwise it
    # is the layout's, refused as a plain budget error.
    over: type[AffineTransferError] = InvalidReplicaPolicyError if splits else AffineTransferError
    blame = f" after the policy split {splits} request(s)" if splits else ""
    if len(segments) > budget.max_segments:  # R31
        raise over(
            f"parameter {name!r}: {len(segments)} segments{blame} exceed max_segments={budget.max_segments}; "
            "the plan is refused, not truncated"
        )
    logical = layout.logical
    segments_t = tuple(segments)
    plan_bytes = len(encode_segments(segments_t, logical))
    if plan_bytes > budget.max_plan_bytes:  # R32
        raise over(
            f"parameter {name!r}: the plan{blame} encodes to {plan_bytes} bytes, above max_plan_bytes="
            f"{budget.max_plan_bytes}; the plan is refused, not truncated"
        )
    stats = make_statistics(
        layout.regions, layout.frame_count, layout.checks, len(raw), len(segments), plan_bytes,
        requests, splits, merge_checks,
    )
    return make_plan(segments_t, logical, sum(map(prod, map(_SHAPE, segments))), stats)  # moved = Σ numel


def _lone_checks(layout: _Layout, answers: Sequence[ResolvedAnswer], segments: int, budget: PlanBudget) -> int | None:
    """``_lone_merge_checks`` when ``layout`` is a slab layout and no answer split its request,
    else ``None`` (``coalesce`` must run)."""
    if layout.slabs is None or [*map(len, answers)].count(1) != len(answers):
        return None
    return _lone_merge_checks(layout, segments, budget)


def _lone_merge_checks(layout: _Layout, segments: int, budget: PlanBudget) -> int | None:
    """What ``coalesce`` charges on a slab layout's ``segments`` when no request was split (the
    caller knows both), or ``None`` when ``coalesce`` must run (a merge budget it refuses).

    Why it is known without coalescing: every source location of a ``_slab_layout`` holds one
    region and every target location one frame, so a whole answer gives at most one segment per
    (source location, target location) pair: every group of ``coalesce`` is a lone segment, whose
    offsets decode (each lies inside its whole-slab shard, whose strides are row-major), so it is
    kept as it is after one check per axis if merging runs at all; the output is the segments in
    ``TransferSegment.sort_key`` order (distinct keys: one segment per pair).
    """
    checks = len(layout.logical) * segments if budget.max_merge_passes > 0 else 0
    return checks if checks <= budget.max_merge_checks else None


def _for_policy(
    policy: ReplicaPolicy, requests: list[ReplicaRequest], names: list[str]
) -> Sequence[ReplicaRequest]:
    """What the policy sees: one request per intersection of every parameter, named for it.

    A policy gets copies (``_renamed``: a new instance with its own attribute dictionary), so
    even one that forces a frozen field with ``object.__setattr__`` cannot change the requests
    its answers are checked against. refplan's own ``balanced``, ``lpt`` and ``first_holder``
    read the requests and nothing else, and none of them reads a parameter name: they get the
    requests themselves, twins sharing their layout's objects, and answer exactly as they would
    on the copies (tested), without a copy per request. So does every ``split_balanced_policy``
    (``made_by_split_balanced``): a copy of a uniform request makes a candidate per holder, k²
    for a region held by k locations and read by k pieces.
    """
    # identity: a policy's __eq__ is its own
    if any(policy is known for known in _READ_ONLY_POLICIES) or made_by_split_balanced(policy):
        return tuple(requests)
    return tuple(map(_renamed, requests, names))


_READ_ONLY_POLICIES = (balanced, lpt, first_holder)
_INT = frozenset([int])
_STR = frozenset([str])
_NAME = attrgetter("name")
_LAYOUT = attrgetter("layout")
_REQUESTS = attrgetter("requests")


def _exception_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a policy's exception may not even print
        text = ""
    return f"{type_name(exc)}: {text}" if text else type_name(exc)


def _prepare_batch(
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]],
    budget: PlanBudget,
    endpoints: TransferEndpoints | None,
    element_size: Mapping[str, int] | int | None,
    process_node: Mapping[int, int] | None,
    min_split_bytes: int | None,
    by_rows: bool = False,
) -> tuple[list[_Prepared], dict[str, int] | None, int]:
    """Validate the whole batch and build its requests, in the order ``plan_transfers`` checks.

    ``by_rows``: the policy has a row form (``policies.simple.ROW_FORMS``), so slab layouts get
    rows instead of request objects; the other parameters get their requests, and the row form
    reads those as rows too (``_row_answers``), so one policy call still sees the whole batch."""
    if not isinstance(pairs, Mapping):
        raise InvalidMapError("pairs must map parameter name -> (target map, source map)")
    names = list(pairs)
    if not {*map(type, names)} <= _STR and any(not isinstance(n, str) for n in names):
        raise InvalidMapError("parameter names must be strings")  # before sorting: 1 < "a" raises TypeError
    names.sort()
    if process_node is not None and endpoints is None:
        raise InvalidMapError(PROCESS_NODE_NEEDS_ENDPOINTS)
    if process_node is not None:
        # An argument, not an answer: checked here like ``endpoints``, so a wrong one is the
        # caller's TypeError, never a bare one from deep inside nor a policy blamed for it. Read
        # once, so a mapping that changes while the batch is built cannot give two answers.
        if not isinstance(process_node, Mapping):
            raise TypeError(f"process_node must map process -> node (ints), got {type(process_node).__name__}")
        process_node = dict(process_node.items())
        bad = next(((k, v) for k, v in process_node.items() if type(k) is not int or type(v) is not int), None)
        if bad is not None:
            raise TypeError(
                f"process_node must map process -> node, both ints (not bool), got {describe(bad[0])} -> "
                f"{describe(bad[1])} ({type(bad[0]).__name__} -> {type(bad[1]).__name__})"
            )
    sizes = limits.element_sizes(names, element_size)
    split_floor = DEFAULT_MIN_SPLIT_BYTES if min_split_bytes is None else min_split_bytes
    if type(split_floor) is not int:  # bool included: True is not a byte count
        raise TypeError(f"min_split_bytes must be an int, got {type(split_floor).__name__}")
    if split_floor < 0:
        raise ValueError(f"min_split_bytes must be non-negative, got {split_floor}")
    prepared: list[_Prepared] = []
    memo: _Memo = {}
    bindings: _Bindings = {}
    # A parameter whose two maps have the contents of a remembered layout gets that layout, and
    # the requests built for it at this element size, by one lookup keyed on the contents'
    # identities (``_content_key``: equal shared contents are the same immutable object; only
    # such keys are ever stored). The layout's own requests are shared: nothing downstream reads
    # their parameter name (the policy gets named copies, the checks get the names beside them,
    # emitting reads geometry). Everything else goes through ``_prepare``, which validates and
    # builds them. Equal maps have equal logical shapes, so R0 held for the parameter as it did
    # for its twin.
    for name in names:
        pair = pairs[name]
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidMapError(f"parameter {name!r}: expected a (target map, source map) pair")
        size = None if sizes is None else sizes[name]
        target_map, source_map = pair
        if type(target_map) is ParamAffineMap and type(source_map) is ParamAffineMap and (
            type(target := target_map._content) is MapContent and type(source := source_map._content) is MapContent
        ):
            layout = memo.get((target, source))
            if layout is not None:
                if by_rows and (rows := layout.rows.get(size)) is not None:
                    prepared.append(_new_prepared((name, layout, None, True, rows)))
                    continue
                if (templates := layout.templates.get(size)) is not None:
                    prepared.append(_new_prepared((name, layout, templates, True, None)))
                    continue
        try:
            prepared.append(
                _prepare(name, target_map, source_map, budget, endpoints, size, process_node, memo, bindings, by_rows)
            )
        except AffineTransferError:
            raise
        except Exception as exc:
            if _plain_map(target_map) and _plain_map(source_map):
                raise  # plain values cannot raise while read: refplan's own failure, as it is
            raise _unreadable(name, target_map, source_map, exc) from exc
    return prepared, sizes, split_floor


def _plain_map(value: object) -> bool:
    """An exact ``ParamAffineMap`` of a shared ``MapContent``: plain values all the way down, so
    reading it runs only refplan's code (``oracle.judge._plain_map`` says the same for the oracle)."""
    return type(value) is ParamAffineMap and type(value._content) is MapContent


def _unreadable(name: str, target_map: object, source_map: object, exc: Exception) -> InvalidMapError:
    """What an exception raised while a parameter's maps were read becomes when a map is not plain
    (a subclass of the map or of a piece: its properties are the caller's code, which may raise
    anything): a map that cannot be read, ``InvalidMapError`` naming the parameter and the side
    (the caller chains the original as ``__cause__``), as a policy's own exception becomes
    ``PolicyRaisedError``."""
    odd = [side for side, m in (("target", target_map), ("source", source_map)) if not _plain_map(m)]
    which = f"the {odd[0]} map" if len(odd) == 1 else "the target or the source map"
    return InvalidMapError(f"parameter {name!r}: {which} cannot be read: {_exception_text(exc)}")


def _as_requests(
    p: _Prepared, element_size: int | None, endpoints: TransferEndpoints | None,
    process_node: Mapping[int, int] | None, bindings: _Bindings,
) -> _Prepared:
    """A parameter prepared by rows, with its requests instead (shared through its layout's
    templates as ``_prepare`` shares them). Its rows bound every location and process, so its
    requests do too."""
    layout = p.layout
    requests = layout.templates.get(element_size) if p.shared else None
    if requests is None:
        requests = _slab_requests(p.name, layout.slabs or [], element_size, endpoints, process_node, bindings)
        assert requests is not None  # the same bindings bound its rows
        if p.shared:
            layout.templates[element_size] = requests
    return _new_prepared((p.name, layout, requests, p.shared, None))


def collect_requests(
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]],
    limits: PlanBudget | None = None,
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: Mapping[str, int] | int | None = None,
    process_node: Mapping[int, int] | None = None,
) -> list[ReplicaRequest]:
    """The requests ``plan_transfers`` would hand its policy, without planning.

    Same arguments, same validation and the same errors as ``plan_transfers`` (both maps of every
    parameter, endpoints, element sizes, node bindings, ``limits``), and the same fixed order
    (parameter, target location, origin). For analysis (``analysis.load_lower_bound``) and for
    testing policies on their own.
    """
    with cycle_collection_paused():
        prepared, _sizes, _floor = _prepare_batch(
            pairs, as_budget(limits), endpoints, element_size, process_node, None
        )
        return [r if r.parameter == p.name else _renamed(r, p.name) for p in prepared for r in p.requests or ()]


def plan_transfers(
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]],
    limits: PlanBudget | None = None,
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: Mapping[str, int] | int | None = None,
    replica_policy: ReplicaPolicy | None = None,
    min_split_bytes: int | None = None,
    process_node: Mapping[int, int] | None = None,
) -> dict[str, TransferPlan]:
    """Plan a whole sync: ``pairs`` maps parameter name → (target map, source map).

    ``replica_policy`` sees every request of every parameter at once (default ``balanced``) and
    may split requests; its answers are checked exactly before any segment exists.
    ``endpoints`` binds map locations to processes (so "local" is knowable), ``process_node``
    binds processes to nodes (it needs ``endpoints``), ``element_size`` gives bytes per element
    per parameter (``{name: bytes}``, or one ``int`` for every parameter), ``min_split_bytes``
    bounds split parts (default 8 MiB, the executor's staging budget). ``limits`` applies per
    parameter. Returns plans keyed and ordered by name; raises
    (``InvalidMapError``, ``UnsupportedLayoutError``, ``InvalidReplicaPolicyError`` — its
    subclass ``PolicyRaisedError`` when the policy itself raised — ``AffineTransferError`` for
    budgets) without returning any plan when anything is wrong. Bad arguments (a non-positive or
    missing ``element_size``, a negative or non-int ``min_split_bytes``, ``limits`` that is not a
    ``PlanBudget``, ``endpoints`` that is not a ``TransferEndpoints``) are ``ValueError`` /
    ``TypeError``: no map or policy is at fault.

    Work is done once per distinct (target, source) layout of the batch and reused for every
    parameter with the same content (see ``_Layout``): two parameters whose layouts and answers
    are equal get the same plan object (plans are immutable).
    """
    check_endpoints(endpoints)
    with cycle_collection_paused():
        # The work happens in a function so that its intermediates (frames, intersections,
        # requests and their copies, answers) are freed when it returns, while collection is still
        # paused: the collection that follows then sees only the plans, not everything built.
        return _plan_batch(pairs, as_budget(limits), endpoints, element_size, replica_policy,
                           min_split_bytes, process_node)


def _plan_batch(
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]],
    budget: PlanBudget,
    endpoints: TransferEndpoints | None,
    element_size: Mapping[str, int] | int | None,
    replica_policy: ReplicaPolicy | None,
    min_split_bytes: int | None,
    process_node: Mapping[int, int] | None,
) -> dict[str, TransferPlan]:
    if replica_policy is not None and not callable(replica_policy):  # before, "policy raised TypeError"
        raise TypeError(f"replica_policy must be callable (requests -> answers), got {type(replica_policy).__name__}")
    policy = replica_policy if replica_policy is not None else balanced
    by_rows = next((form for known, form in _ROW_FORMS if policy is known), None)  # identity, as in _for_policy
    prepared, sizes, split_floor = _prepare_batch(
        pairs, budget, endpoints, element_size, process_node, min_split_bytes, by_rows is not None
    )
    row_answers = None
    if by_rows is not None and any(p.rows is not None for p in prepared):
        row_answers, accepted = _row_answers(prepared, by_rows, endpoints is not None)
        if accepted:
            return _finish_all(prepared, _merged_answers(prepared, row_answers, sizes, split_floor, budget), budget)
        # Refused: the requests' own check names the first bad answer, as for any policy.
        prepared = [p if p.rows is None else _as_requests(p, None if sizes is None else sizes[p.name], endpoints,
                                                          process_node, {}) for p in prepared]
    requests = [*chain.from_iterable(map(_REQUESTS, prepared))]
    names = [*chain.from_iterable(map(repeat, map(_NAME, prepared), map(len, map(_REQUESTS, prepared))))]
    try:
        answers: Any = policy(_for_policy(policy, requests, names)) if row_answers is None else row_answers
    except Exception as exc:
        # A policy bug must surface as a policy error, never as a partial plan, and never as one
        # of our other classes: an InvalidMapError from a policy would tell the caller "corrupt
        # checkpoint, do not fall back" about a bug in the policy. The original is __cause__.
        raise PolicyRaisedError(f"replica policy raised {_exception_text(exc)}") from exc
    resolved = check_answers(
        requests, answers, element_size=sizes, min_split_bytes=split_floor, budget=budget, parameters=names
    )
    return _finish_all(prepared, resolved, budget)


def _row_answers(prepared: list[_Prepared], form: _RowForm, bound: bool) -> tuple[Any, bool]:
    """The answers of one of refplan's own read-only policies to a batch given as rows (its row
    form: the same rule, ``policies.simple``), and whether they pass the rows' check.

    A parameter planned by rows gives its slabs' rows; any other gives its requests read as
    ``_Units._place_all`` reads them, so the form sees exactly the rows of the requests the
    policy would see, in the same order, and answers as the policy would. ``bound``: the batch
    has endpoints, so every row is bound to processes; with the requests' candidate and target
    processes all known too, that is what ``uses_processes`` says of the whole batch.

    The check is ``check_answers``'s for whole answers: every answer is an ``int`` naming one of
    its request's holders. A slab request's holders all read its box at one address (the slab's
    ``read``: ``requests._UniformRequest``), so each request's box is then tiled by one part
    served by a validated holder (Theorem 3's hypotheses), and its segment is the one ``_emit``
    makes from that candidate (``_emit_rows``); the other parameters' answers still go through
    ``check_answers`` (``_merged_answers``). tests/test_policy_rows.py holds the plans and the
    refusals equal to the requests' path, policy by policy.
    """
    others = [*chain.from_iterable(p.requests for p in prepared if p.rows is None and p.requests)]
    by_process = bound and (not others or uses_processes(others))
    keys: list[HolderKey] = []
    loads: list[int] = []
    for p in prepared:
        if p.rows is not None:
            keys += p.rows[0]
            loads += p.rows[1]
        elif p.requests:
            keys += [(holder_locations(r), r.candidate_processes, r.target_process if by_process else None)
                     for r in p.requests]
            loads += map(request_load, p.requests)
    try:
        answers: Any = form(keys, loads, by_process)
    except Exception as exc:  # as ``_plan_batch``: a policy's failure is the policy's error
        raise PolicyRaisedError(f"replica policy raised {_exception_text(exc)}") from exc
    accepted = type(answers) is list and len(answers) == len(keys) and (
        {*map(type, answers)} <= _INT and all(map(contains, map(_FIRST, keys), answers))
    )
    return answers, accepted


def _merged_answers(
    prepared: list[_Prepared], answers: list[int], sizes: dict[str, int] | None, split_floor: int,
    budget: PlanBudget,
) -> list[Any]:
    """What ``_finish_all`` reads of accepted row answers: the chosen location of each request
    of a parameter planned by rows, and for every other parameter its answers as
    ``check_answers`` resolves them (each one of its request's holders: ``_row_answers``)."""
    if all(p.rows is not None for p in prepared):
        return answers
    merged: list[Any] = []
    start = 0
    for p in prepared:
        if p.rows is not None:
            stop = start + len(p.rows[0])
            merged += answers[start:stop]
        else:
            requests = p.requests or []
            stop = start + len(requests)
            merged += check_answers(requests, answers[start:stop], element_size=sizes, min_split_bytes=split_floor,
                                    budget=budget, parameters=[p.name] * len(requests))
        start = stop
    return merged


_RowForm = Callable[[Sequence[HolderKey], Sequence[int], bool], list[ReplicaAnswer]]
_ROW_FORMS: tuple[tuple[Callable[..., object], _RowForm], ...] = tuple(ROW_FORMS.items())
"""refplan's own read-only policies and their row forms (``policies.simple.ROW_FORMS``)."""


def plan_transfer(
    target_map: ParamAffineMap,
    source_map: ParamAffineMap,
    limits: PlanBudget | None = None,
    *,
    replica_selector: Callable[[ReplicaSelectionRequest], int] | None = None,
    replica_policy: ReplicaPolicy | None = None,
    endpoints: TransferEndpoints | None = None,
    element_size: int | None = None,
    min_split_bytes: int | None = None,
    process_node: Mapping[int, int] | None = None,
) -> TransferPlan:
    """The one-parameter case of ``plan_transfers`` (parameter name ``"param"``).

    ``replica_selector`` is DeepSpeed's per-request form and is wrapped with ``from_selector``;
    give it or ``replica_policy``, not both.
    """
    if replica_selector is not None and replica_policy is not None:
        raise InvalidReplicaPolicyError("give replica_selector or replica_policy, not both")
    policy = from_selector(replica_selector) if replica_selector is not None else replica_policy
    plans = plan_transfers(
        {SINGLE_PARAMETER: (target_map, source_map)},
        limits,
        endpoints=endpoints,
        element_size=None if element_size is None else {SINGLE_PARAMETER: element_size},
        replica_policy=policy,
        min_split_bytes=min_split_bytes,
        process_node=process_node,
    )
    return plans[SINGLE_PARAMETER]
