"""What a replica policy sees and what it answers (RFC "What the policy sees / returns").

One ``ReplicaRequest`` per intersection of a target piece with a source region, *single-holder
intersections included*, so a policy knows the load it cannot move. Requests arrive sorted by
(parameter, target location, logical origin); answers come back in the same order. A policy never
handles addresses: every candidate carries its own read offset for the request's box, and the
planner computes the addresses of split parts from the chosen holder.

"Location" always means a key of a map (``pieces_by_rank``); "process" means a rank of the process
group that moves the bytes. Only ``TransferEndpoints`` relates the two, with separate namespaces
for the source and the target side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from math import prod
from operator import attrgetter, mul
from typing import TYPE_CHECKING, Any, NamedTuple

from .box import Box, volume
from .endpoints import TransferEndpoints
from .errors import InvalidMapError

if TYPE_CHECKING:  # a type only: importing requests (for its endpoint and request types) must not
    # load the planner's validation (regions -> frames) as a side effect.
    from .regions import Intersection

__all__ = [
    "ReplicaAnswer",
    "ReplicaCandidate",
    "ReplicaPart",
    "ReplicaPolicy",
    "ReplicaRequest",
    "ReplicaSelectionRequest",
    "TransferEndpoints",
    "build_requests",
]


class ReplicaCandidate(NamedTuple):
    """A validated holder of a request's box, with its own read address for that box.

    ``source_rank`` is a source *location*; ``source_offset`` addresses the request's logical
    origin in that location's shard and ``source_strides`` are the shard's row-major strides.
    Holders store a region at different offsets, which is why each candidate carries its own.
    A named tuple, so not even ``object.__setattr__`` can change one after a policy has seen it.
    """

    source_rank: int
    source_offset: int
    source_strides: tuple[int, ...]


@dataclass(frozen=True)
class ReplicaRequest:
    """One (target piece × source region) intersection, with everything a policy may weigh."""

    parameter: str
    target_location: int
    target_process: int | None
    logical_origin: tuple[int, ...]
    shape: tuple[int, ...]
    target_offset: int
    target_strides: tuple[int, ...]
    candidates: tuple[ReplicaCandidate, ...]
    candidate_processes: tuple[int | None, ...]
    bytes: int | None
    candidate_nodes: tuple[int | None, ...] | None = None
    target_node: int | None = None

    @property
    def box(self) -> Box:
        return Box(self.logical_origin, self.shape)

    @property
    def elements(self) -> int:
        return volume(self.shape)

    @property
    def locations(self) -> tuple[int, ...]:
        return tuple(c.source_rank for c in self.candidates)


@dataclass(frozen=True)
class ReplicaSelectionRequest:
    """DeepSpeed's per-request selector input (v2), for ``from_selector`` compatibility."""

    target_rank: int
    logical_origin: tuple[int, ...]
    shape: tuple[int, ...]
    target_offset: int
    target_strides: tuple[int, ...]
    candidates: tuple[ReplicaCandidate, ...]


@dataclass(frozen=True)
class ReplicaPart:
    """A sub-box of a request served by one source location (an answer that splits)."""

    logical_origin: tuple[int, ...]
    shape: tuple[int, ...]
    source_location: int

    @property
    def box(self) -> Box:
        return Box(tuple(self.logical_origin), tuple(self.shape))


ReplicaAnswer = int | Sequence[ReplicaPart]
"""An ``int`` (the whole box from that location) or a sequence of parts that tile the box."""

ReplicaPolicy = Callable[[Sequence[ReplicaRequest]], Sequence[ReplicaAnswer]]
"""Sees every request of the batch at once and answers one ``ReplicaAnswer`` per request, in order."""


def _process_of(table: Mapping[int, int], location: int, side: str, parameter: str) -> int:
    if location not in table:
        raise InvalidMapError(
            f"parameter {parameter!r}: endpoints bind no process to {side} location {location}, which "
            "holds data of this parameter"
        )
    return table[location]


def _node_of(process_node: Mapping[int, int], process: int, parameter: str) -> int:
    if process not in process_node:
        raise InvalidMapError(f"parameter {parameter!r}: process_node names no node for process {process}")
    return process_node[process]


def _make_request(
    parameter: str,
    target_location: int,
    target_process: int | None,
    logical_origin: tuple[int, ...],
    shape: tuple[int, ...],
    target_offset: int,
    target_strides: tuple[int, ...],
    candidates: tuple[ReplicaCandidate, ...],
    candidate_processes: tuple[int | None, ...],
    bytes_: int | None,
    candidate_nodes: tuple[int | None, ...] | None,
    target_node: int | None,
) -> ReplicaRequest:
    """``ReplicaRequest(...)`` with the instance dictionary filled in one step.

    The frozen dataclass's ``__init__`` sets its twelve fields one ``object.__setattr__`` at a
    time, which is most of the cost of a request; a batch builds one per intersection.
    """
    request = _new_object(ReplicaRequest)
    _set_attribute(request, "__dict__", {
        "parameter": parameter, "target_location": target_location, "target_process": target_process,
        "logical_origin": logical_origin, "shape": shape, "target_offset": target_offset,
        "target_strides": target_strides, "candidates": candidates, "candidate_processes": candidate_processes,
        "bytes": bytes_, "candidate_nodes": candidate_nodes, "target_node": target_node,
    })
    return request


_new_object = object.__new__
_set_attribute = object.__setattr__
_PLACEMENT = attrgetter("strides", "shift")
_new_candidate = partial(tuple.__new__, ReplicaCandidate)
"""``ReplicaCandidate`` from a 3-tuple without the named tuple's Python ``__new__`` (once per holder)."""


class _CandidatesOnDemand:
    """A uniform request's ``candidates``, made from its holders and its one read address the
    first time they are read, and kept in the instance (a non-data descriptor: once the instance
    dictionary has them, it answers)."""

    def __get__(self, request: Any, owner: Any = None) -> Any:
        if request is None:
            return self
        values = request.__dict__
        offset, strides = values["_read"]
        made = values["candidates"] = tuple([_new_candidate((rank, offset, strides)) for rank in values["_holders"]])
        return made


_FIELDS = attrgetter(*(f.name for f in fields(ReplicaRequest)))


class _UniformRequest(ReplicaRequest):
    """A ``ReplicaRequest`` whose holders all read its box at one (offset, strides): the slab
    path's requests (every holder of a slab holds it as its whole shard, laid out alike), and the
    general path's wherever a region's holders hold it alike (``build_requests``).

    Why: a request has a candidate per holder, and most holders are DP replicas; with every
    parameter's shape its own, making those candidates (8 per request for a ZeRO source) was a
    sixth of planning, while refplan's own policies read only the holders' locations and the
    checker needs only the chosen one. So the request keeps its holders' locations
    (``_holders``, shared by every request that reads the same source box) and the read address
    (``_read``); ``candidates`` are made when something reads them, and equal what
    ``_make_request`` would have stored. Equal to, and hashed as, the ``ReplicaRequest`` of the
    same fields; ``holder_locations`` and ``check_answers`` read the two private fields.
    """

    candidates = _CandidatesOnDemand()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReplicaRequest):
            return bool(_FIELDS(self) == _FIELDS(other))
        return NotImplemented

    __hash__ = ReplicaRequest.__hash__

    def __repr__(self) -> str:
        return "ReplicaRequest" + ReplicaRequest.__repr__(self)[len(type(self).__qualname__):]


def _make_uniform_request(
    parameter: str,
    target_location: int,
    target_process: int | None,
    logical_origin: tuple[int, ...],
    shape: tuple[int, ...],
    target_offset: int,
    target_strides: tuple[int, ...],
    holders: tuple[int, ...],
    read: tuple[int, tuple[int, ...]],
    candidate_processes: tuple[int | None, ...],
    bytes_: int | None,
    candidate_nodes: tuple[int | None, ...] | None,
    target_node: int | None,
) -> ReplicaRequest:
    """``_make_request`` of the candidates ``(rank, *read) for rank in holders``, made on demand
    (``_UniformRequest``)."""
    request = _new_object(_UniformRequest)
    _set_attribute(request, "__dict__", {
        "parameter": parameter, "target_location": target_location, "target_process": target_process,
        "logical_origin": logical_origin, "shape": shape, "target_offset": target_offset,
        "target_strides": target_strides, "_holders": holders, "_read": read,
        "candidate_processes": candidate_processes, "bytes": bytes_, "candidate_nodes": candidate_nodes,
        "target_node": target_node,
    })
    return request


_RANK = attrgetter("source_rank")


def holder_locations(request: ReplicaRequest) -> tuple[int, ...]:
    """The locations of ``request``'s candidates, in their order, without making a uniform
    request's candidates."""
    uniform = uniform_read(request)
    return uniform[0] if uniform is not None else tuple(map(_RANK, request.candidates))


def uniform_read(request: ReplicaRequest) -> tuple[tuple[int, ...], tuple[int, tuple[int, ...]]] | None:
    """(holder locations, the one read address) of a uniform request, else ``None``."""
    if type(request) is _UniformRequest:
        values = request.__dict__
        holders = values.get("_holders")
        if holders is not None:
            return holders, values["_read"]
    return None


def build_requests(
    parameter: str,
    inters: Sequence[Intersection],
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: int | None = None,
    process_node: Mapping[int, int] | None = None,
) -> list[ReplicaRequest]:
    """One request per (target frame × source region) intersection, in the RFC's fixed order.

    Single-holder intersections are included (the policy must see load it cannot move). Each
    candidate is a validated holder of the region with its *own* read address for the box:
    holders store a region at different shard offsets, so the address cannot be shared.
    """
    out: list[ReplicaRequest] = []
    # Processes and nodes depend only on locations: each is looked up once per region or target
    # location, in the same order as before (target process, candidate processes, target node,
    # candidate nodes), so the first binding error is the same one.
    target_processes: dict[int, int] = {}
    target_nodes: dict[int, int] = {}
    region_processes: dict[int, tuple[int | None, ...]] = {}
    region_nodes: dict[int, tuple[int | None, ...]] = {}
    # Per region's holders (by identity: ``inters`` holds them alive): their shared (strides,
    # shift), or () when they differ.
    uniform: dict[int, tuple[tuple[int, ...], int] | tuple[()]] = {}
    holder_locs: dict[int, tuple[int, ...]] = {}  # per region's holders (by identity): their locations
    for x in inters:
        tgt = x.target
        box = x.box
        origin = box.origin
        extent = box.extent
        # Replicas of a piece usually share the shard's strides and the shift (the same piece in
        # the same shard shape): then every holder reads the box at one offset, worked out once.
        holders = x.region.holders
        alike = uniform.get(id(holders))
        if alike is None:
            kinds = set(map(_PLACEMENT, holders))
            alike = uniform[id(holders)] = kinds.pop() if len(kinds) == 1 else ()
        read: tuple[int, tuple[int, ...]] | None = None
        if alike:
            # Every holder reads the box at one address: the request keeps the region's holder
            # locations (one tuple per region) and that address, and makes its candidates only if
            # something reads them (``_UniformRequest``, as the slab path's requests do). Before,
            # each request made a candidate per holder: a region held by k locations read by k
            # target frames cost k² candidates (4 096 holders and frames: 16.7 M, 5 s).
            strides, shift = alike
            read = (sum(map(mul, origin, strides)) + shift, strides)
            locations = holder_locs.get(id(holders))
            if locations is None:
                locations = holder_locs[id(holders)] = tuple([h.location for h in holders])
        else:
            candidates = tuple(
                [_new_candidate((h.location, sum(map(mul, origin, h.strides)) + h.shift, h.strides)) for h in holders]
            )
            locations = tuple(map(_RANK, candidates))
        target_process: int | None = None
        processes: tuple[int | None, ...] = (None,) * len(locations)
        nodes: tuple[int | None, ...] | None = None
        target_node: int | None = None
        if endpoints is not None:
            found = target_processes.get(tgt.location)
            if found is None:
                found = target_processes[tgt.location] = _process_of(
                    endpoints.target, tgt.location, "target", parameter
                )
            target_process = found
            region = id(x.region)
            known = region_processes.get(region)
            if known is None:
                known = region_processes[region] = tuple(
                    [_process_of(endpoints.source, loc, "source", parameter) for loc in locations]
                )
            processes = known
            if process_node is not None:
                node = target_nodes.get(found)
                if node is None:
                    node = target_nodes[found] = _node_of(process_node, found, parameter)
                target_node = node
                near = region_nodes.get(region)
                if near is None:
                    near = region_nodes[region] = tuple(
                        [_node_of(process_node, p, parameter) for p in processes if p is not None]
                    )
                nodes = near
        if read is not None:
            out.append(_make_uniform_request(
                parameter, tgt.location, target_process, origin, extent,
                sum(map(mul, origin, tgt.strides)) + tgt.shift, tgt.strides, locations, read, processes,
                None if element_size is None else prod(extent) * element_size, nodes, target_node,
            ))
            continue
        out.append(
            _make_request(
                parameter,
                tgt.location,
                target_process,
                origin,
                extent,
                sum(map(mul, origin, tgt.strides)) + tgt.shift,
                tgt.strides,
                candidates,
                processes,
                None if element_size is None else prod(extent) * element_size,
                nodes,
                target_node,
            )
        )
    return out
