"""The simple replica policies: ``first_holder``, ``balanced`` (the default), ``lpt`` and
``from_selector``. Each answers one holder per request, never a split; see the package docstring
for the determinism contract they keep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from heapq import heapify, heapreplace
from operator import attrgetter
from typing import NamedTuple

from ..requests import ReplicaAnswer, ReplicaPolicy, ReplicaRequest, ReplicaSelectionRequest, holder_locations

__all__ = ["balanced", "first_holder", "from_selector", "lpt", "request_load", "uses_processes"]


def request_load(request: ReplicaRequest) -> int:
    """Bytes of a request, or elements when no element size was given."""
    return request.bytes if request.bytes is not None else request.elements


def first_holder(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
    """DeepSpeed's old default: the lowest holder location serves every request."""
    return [min(holder_locations(r)) for r in requests]


def uses_processes(requests: Sequence[ReplicaRequest]) -> bool:
    """Whether every request knows its target process and every candidate's: only then can load
    be counted per process (else per location). One rule for the policies and the load bound."""
    if not requests:
        return False
    for r in requests:  # noqa: SIM110 (a plain loop, not a generator: runs over every request)
        if r.target_process is None or None in r.candidate_processes:
            return False
    return True


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
    reqs = _held(requests)
    units = _Units()
    return _least_loaded_after_fixed(units.placed(reqs), units)


def balanced_rows(keys: Sequence[HolderKey], sizes: Sequence[int], by_process: bool) -> list[ReplicaAnswer]:
    """``balanced`` of requests given as rows (``_Units.place_rows``): the same answers as
    ``balanced`` on the requests those rows describe, by the same code after the rows.

    ``by_process`` is what ``uses_processes`` says of those requests (every target and candidate
    process known). The planner plans slab layouts with it and never makes their request
    objects; tests/test_policy_rows.py holds the two front doors equal on drawn batches.
    """
    return _least_loaded_after_fixed(*_rows_placed(keys, sizes, by_process))


def _rows_placed(keys: Sequence[HolderKey], sizes: Sequence[int], by_process: bool) -> tuple[list[_Placed], _Units]:
    """What ``_Units.placed`` gives for the requests the rows describe, and the units it used:
    ``by_process`` as ``uses_processes`` says it (never for no requests)."""
    units = _Units()
    units.by_process = by_process and len(keys) > 0
    return units.place_rows(keys, sizes), units


def _least_loaded_after_fixed(placed: list[_Placed], units: _Units) -> list[ReplicaAnswer]:
    """``balanced``'s rule on what it reads of each request: loads that cannot move first, then
    the movable requests by ``_assign_least_loaded``."""
    load: dict[int, int] = {}
    answers: list[ReplicaAnswer] = [0] * len(placed)
    fixed = [*map(_FIXED, placed)]
    movable = [i for i, f in enumerate(fixed) if f is None]
    if len(movable) != len(placed):
        for i, (p, f) in enumerate(zip(placed, fixed)):
            if f is not None:
                answers[i] = f[0]
                load[f[1]] = load.get(f[1], 0) + p.size
    _assign_least_loaded(placed, movable, units, load, answers)
    return answers


def _held(requests: Sequence[ReplicaRequest]) -> list[ReplicaRequest]:
    """The requests as a list of this call's own: read once (a sequence of the caller's type
    could yield new objects on every pass), and holding every object alive while ids matter."""
    return requests if type(requests) is list else list(requests)


HolderKey = tuple[tuple[int, ...], tuple[int | None, ...], int | None]
"""A request as the least-loaded rule reads it, besides its size: (candidate locations, their
processes, the target process, or ``None`` when load is counted per location)."""


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
    order: tuple[int, int]  # (coverage, -size): requests are placed in this order, then by index


class _Units:
    """Per candidate of a request: (the unit its load counts on, its location).

    The unit is the candidate's process when every request knows its processes, else its
    location. What the rule reads of a request is worked out once per request object
    (``placed``), and its holders once per distinct (candidates, processes) content.
    """

    def __init__(self) -> None:
        self.by_process = False
        self._known: dict[tuple[object, object], _Holders] = {}

    @property
    def holders(self) -> list[_Holders]:
        """Every distinct holder set met so far."""
        return list(self._known.values())

    def placed(self, requests: list[ReplicaRequest]) -> list[_Placed]:
        """What the rule reads of each request, worked out once per request *object*: the planner
        hands refplan's own policies its layouts' shared requests, so twins repeat one object.
        Objects are told apart by ``id`` while ``requests`` (a list the caller holds for the whole
        call, ``_held``) keeps every one of them alive, so no id can be reused meanwhile."""
        ids = list(map(id, requests))
        by_id = dict(zip(ids, requests))
        if len(by_id) == len(ids):  # no object repeats: nothing to share
            self.by_process = uses_processes(requests)
            return self._place_all(requests)
        distinct = list(by_id.values())
        self.by_process = uses_processes(distinct)  # a property of the distinct objects
        of_id = dict(zip(by_id, self._place_all(distinct)))
        return list(map(of_id.__getitem__, ids))

    def _place_all(self, requests: list[ReplicaRequest]) -> list[_Placed]:
        """What the rule reads of each request: its row (``place_rows``)."""
        by_process = self.by_process
        keys = [(holder_locations(r), r.candidate_processes, r.target_process if by_process else None)
                for r in requests]
        return self.place_rows(keys, [*map(request_load, requests)])

    def place_rows(self, keys: Sequence[HolderKey], sizes: Sequence[int]) -> list[_Placed]:
        """What the rule reads of each request, given as a row: its ``HolderKey`` (candidate
        locations, their processes, the target process or ``None`` when load is not counted per
        process) and its ``request_load``. Everything but the size depends only on the key, so
        it is worked out once per distinct key (a distinct model's requests have a handful).

        The planner calls this directly for slab layouts (``balanced_rows``): their requests are
        then never made as objects, and the rule is this one code either way."""
        seen: dict[HolderKey, tuple[_Holders, tuple[int, int] | None]] = {}
        # Keys repeat as objects (the planner makes one per holders and target process in a
        # batch, and twins share their layout's rows): a key object met before is found by its
        # id, without hashing its tuples again, and with the size it last had gives that same
        # (immutable) ``_Placed``. The entry holds the key, so no other object can take its id
        # while the entry lives.
        by_object: dict[int, list[object]] = {}
        out: list[_Placed] = []
        append = out.append
        for key, size in zip(keys, sizes):
            entry = by_object.get(id(key))
            if entry is None:
                got = seen.get(key)
                if got is None:
                    got = seen[key] = self._settle(key[0], key[1], key[2])
                entry = by_object[id(key)] = [key, got[0], got[1], None, None]
            elif entry[3] == size:
                append(entry[4])  # type: ignore[arg-type]
                continue
            holders: _Holders = entry[1]  # type: ignore[assignment]
            placed = _new_placed((holders, size, entry[2], (holders.coverage, -size)))
            entry[3] = size
            entry[4] = placed
            append(placed)
        return out

    def _settle(
        self, ranks: tuple[int, ...], processes: tuple[int | None, ...], here: int | None
    ) -> tuple[_Holders, tuple[int, int] | None]:
        """The holders of a request with candidate locations ``ranks`` in ``processes`` and target
        process ``here``, and whether it cannot move: a local copy (with processes: the lowest
        location in the target's own process) or a single holder, as (location, unit)."""
        holders = self._of(ranks, processes)
        fixed: tuple[int, int] | None = None
        if self.by_process and here in processes:
            choice = min([rank for rank, p in zip(ranks, processes) if p == here])
            fixed = (choice, next(u for u, rank in holders.pairs if rank == choice))
        elif len(holders.pairs) == 1:
            fixed = holders.pairs[0][1], holders.pairs[0][0]
        return holders, fixed

    def _of(self, ranks: tuple[int, ...], processes: tuple[int | None, ...]) -> _Holders:
        """The holders of candidates at ``ranks`` in ``processes``, worked out once per distinct
        pair: that is all they depend on, and a model's requests have a few dozen of those, where
        the candidates themselves (with their read offsets) are mostly distinct."""
        key = (ranks, processes)
        known = self._known.get(key)
        if known is None:
            pairs = tuple(
                [(p if self.by_process and p is not None else rank, rank) for rank, p in zip(ranks, processes)]
            )
            order = sorted(range(len(pairs)), key=lambda k: (pairs[k][1], k))
            known = self._known[key] = _Holders(
                pairs, len({u for u, _ in pairs}), tuple(pairs[k][0] for k in order), tuple(pairs[k][1] for k in order)
            )
        return known


_FIXED = attrgetter("fixed")
_ORDER = attrgetter("order")
_new_placed = partial(tuple.__new__, _Placed)
"""``_Placed`` from a 4-tuple without the named tuple's Python ``__new__`` (once per request)."""


def _assign_least_loaded(
    placed: list[_Placed],
    movable: list[int],
    units: _Units,
    load: dict[int, int],
    answers: list[ReplicaAnswer],
) -> None:
    """Megatron's rule on the requests ``movable`` (indices, ascending): fewest units first, then
    largest first, then request order; each request goes whole to the candidate whose unit has
    the least load so far, ties to the lowest location, then to the first such candidate.

    The order is one stable sort by (coverage, -size) (``_Placed.order``): ties keep the
    ascending request order. The holders are kept sorted by (location, request order), so the
    choice is the first holder with the least load: the top of a heap per holder set, so a
    choice costs a ``heapreplace`` instead of reading every holder's load.
    """
    order = [*map(_ORDER, placed)]
    movable.sort(key=order.__getitem__)
    # One heap of (load, position) per distinct unit tuple; every unit starts in ``load`` (at 0 if
    # nothing is counted on it yet). Loads only grow, and a unit's load may grow through another
    # holder set's requests, so an entry may be stale (too low): the top is checked against
    # ``load`` and refreshed until it is current. A current top is then exactly the least load
    # and, among equal loads, the first position (every other entry's true load is at least its
    # recorded one).
    # Each holder set finds its heap, units and locations by identity, in one lookup (``units``
    # keeps every holder set alive), so a request does not hash its unit tuple again.
    heaps: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    of: dict[int, tuple[list[tuple[int, int]], tuple[int, ...], tuple[int, ...]]] = {}
    for h in units.holders:
        heap = heaps.get(h.units)
        if heap is None:
            heap = heaps[h.units] = [(load.setdefault(u, 0), k) for k, u in enumerate(h.units)]
            heapify(heap)
        of[id(h)] = (heap, h.units, h.ranks)
    for i in movable:
        p = placed[i]
        heap, group, ranks = of[id(p[0])]  # p.holders
        least, k = heap[0]
        unit = group[k]
        while load[unit] != least:
            heapreplace(heap, (load[unit], k))
            least, k = heap[0]
            unit = group[k]
        answers[i] = ranks[k]
        least += p[1]  # p.size
        load[unit] = least
        heapreplace(heap, (least, k))


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
    reqs = _held(requests)
    units = _Units()
    return _least_loaded(units.placed(reqs), units)


def lpt_rows(keys: Sequence[HolderKey], sizes: Sequence[int], by_process: bool) -> list[ReplicaAnswer]:
    """``lpt`` of requests given as rows, as ``balanced_rows`` is ``balanced``'s."""
    return _least_loaded(*_rows_placed(keys, sizes, by_process))


def _least_loaded(placed: list[_Placed], units: _Units) -> list[ReplicaAnswer]:
    answers: list[ReplicaAnswer] = [0] * len(placed)
    _assign_least_loaded(placed, list(range(len(placed))), units, {}, answers)
    return answers


def first_holder_rows(keys: Sequence[HolderKey], sizes: Sequence[int], by_process: bool) -> list[ReplicaAnswer]:
    """``first_holder`` of requests given as rows."""
    return [min(key[0]) for key in keys]


ROW_FORMS: dict[Callable[..., object], Callable[[Sequence[HolderKey], Sequence[int], bool], list[ReplicaAnswer]]] = {
    balanced: balanced_rows, lpt: lpt_rows, first_holder: first_holder_rows,
}
"""refplan's own read-only policies and their row forms, looked up by the planner by identity."""
