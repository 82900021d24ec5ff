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

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import mul
from typing import Any, NamedTuple

from .box import Box, volume
from .errors import InvalidMapError
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


@dataclass(frozen=True)
class TransferEndpoints:
    """Location → process, separately for the source map and the target map.

    A source location 0 has no claim to be the process that is target location 0: a trainer
    syncing into a separate engine has disjoint process sets. Values are process ranks in
    whatever rank space the executor is told (global by default).
    """

    source: Mapping[int, int]
    target: Mapping[int, int]

    def __init__(self, source: Mapping[int, int], target: Mapping[int, int]) -> None:
        object.__setattr__(self, "source", _rank_table(source, "source"))
        object.__setattr__(self, "target", _rank_table(target, "target"))

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {
            "source": {str(k): v for k, v in sorted(self.source.items())},
            "target": {str(k): v for k, v in sorted(self.target.items())},
        }

    @classmethod
    def from_dict(cls, entry: Any) -> TransferEndpoints:
        if not isinstance(entry, Mapping) or set(entry) != {"source", "target"}:
            raise InvalidMapError("endpoints: expected {\"source\": {...}, \"target\": {...}}")
        return cls(_int_map(entry["source"], "endpoints.source"), _int_map(entry["target"], "endpoints.target"))


def _rank(value: Any, what: str) -> int:
    """An integer location or process; ``TypeError`` for anything else, ``bool`` included.

    ``int(True)`` is 1, so a bool would silently bind location 1; integer-like values
    (``numpy.int64``) are accepted through ``__index__``, strings and floats are not.
    """
    if isinstance(value, bool):
        raise TypeError(f"TransferEndpoints: {what} is a bool ({value}), not an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"TransferEndpoints: {what} is a {type(value).__name__}, not an integer (TransferEndpoints.from_dict "
            "reads JSON string keys)"
        ) from None


def _rank_table(table: Mapping[int, int], side: str) -> dict[int, int]:
    if not isinstance(table, Mapping):
        raise TypeError(f"TransferEndpoints: {side} must map location -> process, got {type(table).__name__}")
    out: dict[int, int] = {}
    for key, value in table.items():
        location = _rank(key, f"a {side} location")
        out[location] = _rank(value, f"the process of {side} location {location}")
    return out


def _int_map(value: Any, where: str) -> dict[int, int]:
    """Location -> process; keys are ints or ASCII decimal strings, each location listed once."""
    if not isinstance(value, Mapping):
        raise InvalidMapError(f"{where}: expected an object of location -> process")
    out: dict[int, int] = {}
    for key, item in value.items():
        if isinstance(key, bool) or not (
            isinstance(key, int) or (isinstance(key, str) and re.fullmatch(r"-?[0-9]{1,30}", key.strip()))
        ):
            raise InvalidMapError(f"{where}: key {str(key)[:40]!r} is not an integer")
        k = int(key)
        if k in out:
            raise InvalidMapError(f"{where}: location {k} is listed twice")
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidMapError(f"{where}[{k}]: {str(item)[:40]!r} is not an integer")
        out[k] = item
    return out


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
    for x in inters:
        tgt = x.target
        box = x.box
        origin = box.origin
        extent = box.extent
        candidates = tuple(
            [ReplicaCandidate(h.location, sum(map(mul, origin, h.strides)) + h.shift, h.strides)
             for h in x.region.holders]
        )
        target_process: int | None = None
        processes: tuple[int | None, ...] = (None,) * len(candidates)
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
                    [_process_of(endpoints.source, c.source_rank, "source", parameter) for c in candidates]
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
                None if element_size is None else volume(extent) * element_size,
                nodes,
                target_node,
            )
        )
    return out
