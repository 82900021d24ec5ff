"""The simple replica policies: ``first_holder``, ``balanced`` (the default), ``lpt`` and
``from_selector``. Each answers one holder per request, never a split; see the package docstring
for the determinism contract they keep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import NamedTuple

from ..requests import ReplicaAnswer, ReplicaPolicy, ReplicaRequest, ReplicaSelectionRequest

__all__ = ["balanced", "first_holder", "from_selector", "lpt", "request_load", "uses_processes"]


def request_load(request: ReplicaRequest) -> int:
    """Bytes of a request, or elements when no element size was given."""
    return request.bytes if request.bytes is not None else request.elements


def first_holder(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
    """DeepSpeed's old default: the lowest holder location serves every request."""
    return [min(c.source_rank for c in r.candidates) for r in requests]


def uses_processes(requests: Sequence[ReplicaRequest]) -> bool:
    """Whether every request knows its target process and every candidate's: only then can load
    be counted per process (else per location). One rule for the policies and the load bound."""
    return bool(requests) and all(
        r.target_process is not None and None not in r.candidate_processes for r in requests
    )


def balanced(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
    """The default (RFC "Default policy"): local copy first, then the least-loaded holder.

    With endpoints (requests carry processes): a candidate in the target's own process wins
    (lowest such location), because a local copy uses no link. Otherwise the candidate whose
    process has the fewest bytes assigned so far in this batch wins, ties to the lowest location.
    Without endpoints the same rule runs per source location (nothing is known to be local).

    "So far" is made order-independent: loads that cannot move (local copies and single-holder
    requests) are counted first, then the movable requests are assigned in ``lpt``'s order:
    fewest distinct holder units first (a request with few choices must not find them all taken
    by requests that had many), then largest first, then request order. No constant-factor bound
    is claimed: with holders restricted per region, largest-first alone sent 15 where 8 is
    optimal (F=(23,), regions [0,8) held by {0,1,2}, [8,16) by {2}, [16,23) by {0,2}); the
    tests pin that case and that ``balanced`` is never worse than ``lpt`` on the conformance
    batches and the bench scenarios. Counts elements when no element size was given, which
    equals bytes only for one dtype.
    """
    units = _Units(requests)
    load: dict[int, int] = {}
    answers: list[ReplicaAnswer | None] = [None] * len(requests)
    movable: list[int] = []
    for i, r in enumerate(requests):
        placed = units.place(r)
        if placed.fixed is None:
            movable.append(i)
            continue
        choice, unit = placed.fixed
        answers[i] = choice
        load[unit] = load.get(unit, 0) + placed.size
    _assign_least_loaded(requests, movable, units, load, answers)
    return [a for a in answers if a is not None]


class _Holders(NamedTuple):
    """What the least-loaded rule needs of one distinct (candidates, processes) content."""

    pairs: tuple[tuple[int, int], ...]  # per candidate, in request order: (its unit, its location)
    coverage: int  # distinct units among them: the fewer, the earlier the request is placed
    units: tuple[int, ...]  # the candidates' units sorted by (location, request order) ...
    ranks: tuple[int, ...]  # ... and their locations in the same order


class _Placed(NamedTuple):
    """Everything the least-loaded rule reads of one request."""

    holders: _Holders
    size: int  # ``request_load``
    fixed: tuple[int, int] | None  # (location, unit) of a request that cannot move, else None


class _Units:
    """Per candidate of a request: (the unit its load counts on, its location).

    The unit is the candidate's process when every request knows its processes, else its
    location. What the rule reads of a request is worked out once per request object
    (``place``), and its holders once per distinct (candidates, processes) content.
    """

    def __init__(self, requests: Sequence[ReplicaRequest]) -> None:
        self.by_process = uses_processes(requests)
        self._known: dict[tuple[object, object], _Holders] = {}
        self._placed: dict[int, tuple[ReplicaRequest, _Placed]] = {}

    def place(self, r: ReplicaRequest) -> _Placed:
        """What the rule reads of ``r``, once per request object: the planner hands refplan's own
        policies its layouts' shared requests, so twins repeat one object (held in the entry, so
        its id stays its own). A request that cannot move is a local copy (with processes: the
        lowest location in the target's own process) or has a single holder."""
        entry = self._placed.get(id(r))
        if entry is not None and entry[0] is r:
            return entry[1]
        holders = self.of(r)
        here = r.target_process
        fixed: tuple[int, int] | None = None
        if self.by_process and here in r.candidate_processes:
            choice = min([c.source_rank for c, p in zip(r.candidates, r.candidate_processes) if p == here])
            fixed = (choice, next(u for u, rank in holders.pairs if rank == choice))
        elif len(r.candidates) == 1:
            fixed = (r.candidates[0].source_rank, holders.pairs[0][0])
        placed = _Placed(holders, request_load(r), fixed)
        self._placed[id(r)] = (r, placed)
        return placed

    def of(self, r: ReplicaRequest) -> _Holders:
        """The holders of ``r``, worked out once per distinct candidate content."""
        candidates, processes = r.candidates, r.candidate_processes
        key = (candidates, processes)
        known = self._known.get(key)
        if known is None:
            pairs = tuple(
                [(p if self.by_process and p is not None else c.source_rank, c.source_rank)
                 for c, p in zip(candidates, processes)]
            )
            order = sorted(range(len(pairs)), key=lambda k: (pairs[k][1], k))
            known = self._known[key] = _Holders(
                pairs, len({u for u, _ in pairs}), tuple(pairs[k][0] for k in order), tuple(pairs[k][1] for k in order)
            )
        return known


def _assign_least_loaded(
    requests: Sequence[ReplicaRequest],
    order: list[int],
    units: _Units,
    load: dict[int, int],
    answers: list[ReplicaAnswer | None] | list[ReplicaAnswer],
) -> None:
    """Megatron's rule on ``order``: fewest units first, then largest first, then request order;
    each request goes whole to the candidate whose unit has the least load so far, ties to the
    lowest location, then to the first such candidate.

    The holders are kept sorted by (location, request order), so that choice is the first
    holder with the least load: found by ``min`` and ``index`` over the loads, in C.
    """
    queue = []
    for i in order:
        placed = units.place(requests[i])
        size = placed.size
        queue.append((placed.holders.coverage, -size, i, size, placed.holders))  # i unique: holders never compared
    queue.sort()
    get = load.get
    for _, _, i, size, holders in queue:
        loads = list(map(get, holders.units, repeat(0)))
        k = loads.index(min(loads))
        answers[i] = holders.ranks[k]
        unit = holders.units[k]
        load[unit] = loads[k] + size


def from_selector(selector: Callable[[ReplicaSelectionRequest], int]) -> ReplicaPolicy:
    """Wrap DeepSpeed's per-request ``replica_selector`` as a batch policy.

    As there, the selector is called only for requests with more than one holder, once each, in
    request order; single-holder requests are answered with their holder. Its results are checked
    like any other answer (``type(x) is int``, a validated candidate).
    """

    def policy(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
        answers: list[ReplicaAnswer] = []
        for r in requests:
            if len(r.candidates) == 1:
                answers.append(r.candidates[0].source_rank)
                continue
            answers.append(
                selector(
                    ReplicaSelectionRequest(
                        target_rank=r.target_location,
                        logical_origin=r.logical_origin,
                        shape=r.shape,
                        target_offset=r.target_offset,
                        target_strides=r.target_strides,
                        candidates=r.candidates,
                    )
                )
            )
        return answers

    return policy


def lpt(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
    """Megatron's distributed-checkpoint rule: largest first, each to the least-loaded holder.

    Requests are taken by (fewest candidate senders first, largest first, request order) and
    each goes whole to the candidate whose process (location without endpoints) has the fewest
    bytes so far, ties to the lowest location. No locality preference and no splits: this is the
    rule Megatron-Core uses to spread replicated shards over their holders, kept as a peer for
    ``balanced`` (which serves local copies first) and ``split_balanced``.
    """
    answers: list[ReplicaAnswer] = [0] * len(requests)
    _assign_least_loaded(requests, list(range(len(requests))), _Units(requests), {}, answers)
    return answers
