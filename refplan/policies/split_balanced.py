"""``split_balanced``: the cost-aware policy that may split a region across its holders.

It prices every candidate path with the α-β model (``policies.cost``), places single-holder
load first, then assigns and levels the movable requests by estimated sync time, splitting a
request along one axis only where each part keeps at least ``min_split_bytes``.

Requests that share their holders (and processes, nodes and target) share one priced candidate
list (``_Group``): a region held by k locations and read by k target pieces is priced k times, not
k² (4 096 x 4 096: 17.5 s before, most of it making, scanning and indexing 16.7 M candidates).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from heapq import heapify, heappop, heappush
from itertools import pairwise

from ..check import DEFAULT_MIN_SPLIT_BYTES
from ..requests import ReplicaAnswer, ReplicaPart, ReplicaPolicy, ReplicaRequest, holder_locations
from .cost import DEFAULT_ALPHA, DEFAULT_BETA, CostModel, LinkCost
from .simple import request_load, uses_processes

__all__ = ["split_balanced", "split_balanced_policy"]


_PATH_RANK = {"process": 0, "node": 1, "network": 2}

_LEVEL_WORK = 1 << 22
"""Candidate moves ``split_balanced`` examines while levelling before it stops: a deterministic
bound on its time, whatever the batch."""


class _Candidate:
    """One candidate of a movable request, as the split policy prices it."""

    __slots__ = ("link", "location", "rank", "unit")

    def __init__(self, unit: int, location: int, link: LinkCost, rank: int) -> None:
        self.unit = unit
        self.location = location
        self.link = link
        self.rank = rank


_HEAP_FROM = 64
"""Step 2 finds the cheapest candidate of a group with at least this many candidates through
``_Cheapest`` (kept ordered by sender time across requests) instead of pricing every candidate
for each request: the same choice either way (tests hold the two equal), O(log k) per request
instead of O(k)."""


_SHARE_GROUPS = True
"""Requests with the same holders (and processes, nodes, target) share one ``_Group``. Tests turn
it off to hold the shared groups to one group per request: the levelling's edges read through
a group are then each request's own, as they were listed before groups."""


class _Group:
    """The priced candidates that every request with the same holders, candidate processes and
    nodes, and target process and node shares, and what the levelling reads of them.

    Worked out once per group: its candidates, its local copy (the lowest location in the
    target's own process), the nearest candidate on each unit (lowest path rank, then location:
    where a part that moves to that unit goes) and the set of its units."""

    __slots__ = ("cands", "cheapest", "local", "nearest", "units")

    def __init__(self, cands: list[_Candidate]) -> None:
        self.cands = cands
        local = [c.location for c in cands if c.rank == 0]
        self.local = min(local) if local else None
        nearest: dict[int, int] = {}
        for k, c in enumerate(cands):
            b = nearest.get(c.unit)
            if b is None or (c.rank, c.location) < (cands[b].rank, cands[b].location):
                nearest[c.unit] = k
        self.nearest = nearest
        self.units = sorted(nearest)
        self.cheapest: list[tuple[int, LinkCost, _Cheapest]] | None = None  # per path rank, made on first use


def _priced(
    holders: tuple[int, ...], processes: tuple[int | None, ...], nodes: tuple[int | None, ...] | None,
    target_process: int | None, target_node: int | None, by_process: bool, links: dict[str, LinkCost],
) -> list[_Candidate]:
    """A request's candidates as the policy prices them: per holder, its unit (process, or its
    location when load is counted per location), its location and its path's cost and rank."""
    if not by_process:
        network = links["network"]
        return [_Candidate(loc, loc, network, 2) for loc in holders]
    out: list[_Candidate] = []
    for k, loc in enumerate(holders):
        proc = processes[k]
        assert proc is not None  # by_process: every candidate's process is known (``uses_processes``)
        if proc == target_process:
            kind = "process"
        elif nodes is not None and target_node is not None and nodes[k] == target_node:
            kind = "node"
        else:
            kind = "network"
        out.append(_Candidate(proc, loc, links[kind], _PATH_RANK[kind]))
    return out


class _Cheapest:
    """The candidates of one path kind of a group, kept in order of their sender's time.

    Why: step 2 places requests one by one on the candidate after which its sender's time is
    least; with thousands of candidates shared by thousands of requests, pricing all of them for
    each request is k². Here candidates wait in buckets by the sender time they had when last
    seen (each bucket a heap by location), and the bucket values in a heap. Sender times only
    grow in step 2, so a candidate whose sender has taken load since is found stale when its
    bucket comes up, and moved to its current time's bucket: lazily, as in a priority queue with
    decrease-key done by re-insertion.

    ``best(s)`` is exact: the least ``(time + s, location)`` over the kind's candidates, where
    ``time + s`` is the float the scan computes. Two sender times an ulp apart can round to the
    same sum, so after the least time it also looks at the next ones while their sum is equal.
    """

    __slots__ = ("buckets", "egress", "values")

    def __init__(self, cands: list[_Candidate], ks: list[int], egress: dict[int, float]) -> None:
        self.egress = egress
        buckets: dict[float, list[tuple[int, int, int]]] = {}
        for k in ks:
            c = cands[k]
            buckets.setdefault(egress.get(c.unit, 0.0), []).append((c.location, k, c.unit))
        for bucket in buckets.values():
            heapify(bucket)
        self.buckets = buckets
        self.values = list(buckets)
        heapify(self.values)

    def _settled(self, value: float) -> list[tuple[int, int, int]] | None:
        """The bucket of ``value`` with its stale candidates moved on; ``None`` (and gone) if empty."""
        buckets = self.buckets
        bucket = buckets[value]
        egress = self.egress
        while bucket and egress.get(bucket[0][2], 0.0) != value:
            entry = heappop(bucket)
            now = egress.get(entry[2], 0.0)  # > value: sender times only grow in step 2
            there = buckets.get(now)
            if there is None:
                buckets[now] = [entry]
                heappush(self.values, now)
            else:
                heappush(there, entry)
        if bucket:
            return bucket
        del buckets[value]
        return None

    def best(self, seconds: float) -> tuple[float, int, int]:
        """(sender time after ``seconds`` more, location, candidate index) of the cheapest."""
        values = self.values
        found: tuple[float, int, int] | None = None
        passed: list[float] = []
        while values:
            value = values[0]
            bucket = self._settled(value)
            if bucket is None:
                heappop(values)
                continue
            total = value + seconds
            if found is not None and total != found[0]:
                break  # sums never fall as times grow: no later bucket can tie
            location, k, _unit = bucket[0]
            if found is None or location < found[1]:
                found = (total, location, k)
            passed.append(heappop(values))
        for value in passed:
            heappush(values, value)
        assert found is not None  # a group's kind has at least one candidate
        return found


class _Movable:
    """A request with several remote candidates: its slices along one axis, and its parts.

    ``parts`` are ``[slices, candidate index]`` in axis order; they tile the request's extent on
    ``axis``. Every part of a split is at least ``min_slices`` slices (``min_split_bytes``).
    ``receiver`` is the lane its bytes arrive on (the target process, or ``-1 - location``).
    ``cands`` are its group's (shared, never changed).
    """

    __slots__ = ("axis", "cands", "group", "index", "min_slices", "parts", "receiver", "size", "slice_bytes",
                 "slices")

    def __init__(self, index: int, request: ReplicaRequest, group: _Group, receiver: int, min_split: int) -> None:
        self.index = index
        self.group = group
        self.cands = group.cands
        self.receiver = receiver
        self.size = request_load(request)
        shape = request.shape
        self.axis = next((a for a, e in enumerate(shape) if e > 1), 0)
        self.slices = shape[self.axis] if shape else 1
        self.slice_bytes = self.size // self.slices
        self.min_slices = max(1, -(-min_split // self.slice_bytes)) if self.slice_bytes else self.slices
        self.parts: list[list[int]] = []

    def seconds(self, slices: int, k: int) -> float:
        return self.cands[k].link.seconds(slices * self.slice_bytes)

    def first_choice(self, egress: dict[int, float]) -> int:
        """Step 2: the candidate after which its sender's time is least, then the cheaper path,
        then the lowest location (a scan, or ``_Cheapest`` for a large group: the same one)."""
        cands = self.cands
        if len(cands) < _HEAP_FROM:
            return min(
                range(len(cands)),
                key=lambda k: (egress.get(cands[k].unit, 0.0) + self.seconds(self.slices, k), cands[k].rank,
                               cands[k].location),
            )
        group = self.group
        if group.cheapest is None:
            by_rank: dict[int, list[int]] = {}
            for k, c in enumerate(cands):
                by_rank.setdefault(c.rank, []).append(k)
            group.cheapest = [
                (rank, cands[ks[0]].link, _Cheapest(cands, ks, egress)) for rank, ks in sorted(by_rank.items())
            ]
        nbytes = self.slices * self.slice_bytes
        return min(
            (total, rank, location, k)
            for rank, link, cheapest in group.cheapest
            for total, location, k in (cheapest.best(link.seconds(nbytes)),)
        )[3]


class _Lanes:
    """α-β time per sending lane (egress) and per receiving lane (ingress)."""

    def __init__(self) -> None:
        self.egress: dict[int, float] = {}
        self.ingress: dict[int, float] = {}

    def add(self, sender: int, receiver: int, seconds: float) -> None:
        self.egress[sender] = self.egress.get(sender, 0.0) + seconds
        self.ingress[receiver] = self.ingress.get(receiver, 0.0) + seconds

    def score(self) -> tuple[float, float]:
        """(estimated sync time, busiest sender's time): what ``split_balanced`` lowers, in order."""
        top = max(self.egress.values(), default=0.0)
        return max(top, max(self.ingress.values(), default=0.0)), top


def split_balanced_policy(
    min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    *,
    cost: CostModel | None = None,
) -> ReplicaPolicy:
    """A cost-aware policy that may split a region across its holders; deterministic.

    Each candidate's path is priced with the α-β model (``policies.cost.CostModel``): ``process``
    when the holder runs in the target's own process, ``node`` when ``process_node`` (given to
    the planner) puts both on one node, else ``network``, whose (α, β) are ``alpha`` and ``beta``
    here (the other paths come from ``cost``, default ``CostModel()``). A message of B bytes
    costs ``α + B/β`` on its sender's egress and its receiver's ingress, as in
    ``analysis.estimate_sync_time``. The objective is, in order, the estimated sync time (the
    busiest lane, egress or ingress) and the busiest sender's time.

    1. A request with a holder in the target's process is a local copy (lowest such location):
       it uses no link. Single-holder requests go to their holder. Both loads are fixed.
    2. The rest are placed whole, largest first, each where it finishes earliest (sender time
       after it, then the cheaper path, then the lowest location): LPT in seconds.
    3. Levelling: while a move lowers the busiest sender's time, leaves every sender it touches
       below that time and no receiver above the current sync time, take it. A move carries
       load along a chain of holders (a breadth-first path over "holds part of the same request"
       from the busiest sender to a lighter one); at each hop a request's part moves whole, or
       is cut along the request's first axis of extent > 1, only if both pieces are at least
       ``min_split_bytes``. Each extra piece costs its α.
    4. If that did not lower the objective, the answers of step 2 are returned: no split
       survives that does not lower the pair (estimated sync time, busiest sender's time),
       compared in that order, as these lanes count it (one α per request), so a split may stay
       for the busiest sender alone at an equal sync time. The planner's merging of adjacent
       reads can leave the final plan's estimate an α away from the lanes' (docs/performance.md,
       "Targets": `split_balanced` on `uneven`).

    Parts tile their request exactly (cuts along one axis of the box), so the planner's
    ``check_answers`` accepts them. Give the planner the same ``min_split_bytes`` (its default
    is ``DEFAULT_MIN_SPLIT_BYTES`` too): a smaller planner floor is fine, a larger one refuses
    the splits. Without element sizes, sizes are elements and so is the floor, as in the
    planner's check. Only the requests and these numbers are read, in their fixed order, with
    ties broken by sender and location, and levelling stops after a fixed amount of work
    (``_LEVEL_WORK`` candidate moves): every process computes the same answers.

    Requests with the same holders, processes, nodes and target share one priced group
    (``_Group``), step 2 finds a large group's cheapest candidate in order (``_Cheapest``) and the
    levelling reads its edges through the groups, so a region held by k locations and read by k
    pieces costs about k log k, not k² (the answers are the ones pricing every candidate of
    every request gives: tests/test_split_balanced.py).
    """
    if type(min_split_bytes) is not int or min_split_bytes < 0:
        raise ValueError(f"min_split_bytes must be a non-negative int, got {min_split_bytes!r}")
    model = (cost or CostModel()).with_network(alpha, beta)
    links = {kind: model.link(kind) for kind in _PATH_RANK}

    def policy(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
        by_process = uses_processes(requests)
        answers: list[ReplicaAnswer] = [0] * len(requests)
        lanes = _Lanes()
        movable: list[_Movable] = []
        # One group per distinct (holders, processes, nodes, target process, target node): found
        # by the identities of those objects first (the planner hands refplan's own policies its
        # shared holder tuples, so a group's requests repeat one object), by value otherwise.
        # Each entry holds its objects, so no id is reused while the call lasts.
        by_value: dict[tuple[object, ...], _Group] = {}
        by_object: dict[tuple[int, ...], tuple[_Group, tuple[object, ...]]] = {}
        for i, r in enumerate(requests):
            holders = holder_locations(r)
            key: tuple[object, ...] = (
                (holders, r.candidate_processes, r.candidate_nodes, r.target_process, r.target_node)
                if by_process else (holders,)
            )
            if not _SHARE_GROUPS:
                key = (*key, i)
            ids = tuple(map(id, key))
            entry = by_object.get(ids)
            if entry is None:
                group = by_value.get(key)
                if group is None:
                    group = by_value[key] = _Group(_priced(
                        holders, r.candidate_processes, r.candidate_nodes, r.target_process, r.target_node,
                        by_process, links,
                    ))
                by_object[ids] = (group, key)
            else:
                group = entry[0]
            receiver = r.target_process if by_process and r.target_process is not None else -1 - r.target_location
            if group.local is not None:
                answers[i] = group.local
            elif len(group.cands) == 1:
                only = group.cands[0]
                answers[i] = only.location
                lanes.add(only.unit, receiver, only.link.seconds(request_load(r)))
            else:
                movable.append(_Movable(i, r, group, receiver, min_split_bytes))
        if not movable:
            return answers
        movable.sort(key=lambda m: (-m.size, m.index))
        egress = lanes.egress
        for m in movable:
            best = m.first_choice(egress)
            m.parts = [[m.slices, best]]
            lanes.add(m.cands[best].unit, m.receiver, m.seconds(m.slices, best))
        whole = [(m.index, m.cands[m.parts[0][1]].location) for m in movable]
        before = lanes.score()
        mover = _Mover(movable, lanes, links["network"])
        while mover.step():
            pass
        if lanes.score() < before:
            for m in movable:
                answers[m.index] = _answer(requests[m.index], m)
        else:
            for i, location in whole:
                answers[i] = location
        return answers

    policy.__name__ = "split_balanced"
    policy.__qualname__ = "split_balanced"
    made, table = id(policy), _MADE  # the callback reads no global: it may run at shutdown
    table[made] = weakref.ref(policy, lambda _ref: table.pop(made, None))
    return policy


_MADE: dict[int, weakref.ref[ReplicaPolicy]] = {}
"""Every policy ``split_balanced_policy`` made that is still alive, by id (``made_by_split_balanced``)."""


def made_by_split_balanced(policy: object) -> bool:
    """Whether ``policy`` is one ``split_balanced_policy`` made (by identity, never ``==``).

    Why: such a policy reads its requests and nothing else (no parameter name, no field it
    forces), so the planner may hand it the layouts' shared request objects instead of a copy
    per request (``planner._for_policy``); a copy of a request held by k locations makes its k
    candidates, k² for k such requests."""
    ref = _MADE.get(id(policy))
    return ref is not None and ref() is policy


class _Mover:
    """Step 3 of ``split_balanced_policy``: move work off the busiest sender while it helps.

    A move follows a path of senders p = u0 → u1 → … → uL: at each hop a part of some request
    that sits on u(i) and has a holder on u(i+1) moves there, whole or cut, so a chain of
    holders carries load from the busiest sender to a lighter one that shares no request with it
    directly. A move is taken only if every sender it touches ends below the busiest sender's
    old time and no receiver ends above the current sync time: the sorted vector of sender
    times falls lexicographically, so the loop ends, and the sync time never rises.

    ``on[u][g]``: the requests of group ``g`` with a part on sender ``u``. There is an edge
    u → v wherever one of them has a holder on v; the edges are read through the groups, never
    listed one by one (k requests over k shared holders would be k² of them).
    """

    def __init__(self, movable: list[_Movable], lanes: _Lanes, network: LinkCost) -> None:
        self.movable = movable
        self.lanes = lanes
        self.network = network
        self.on: dict[int, dict[_Group, set[int]]] = {}
        self.work = 0
        for pos in range(len(movable)):
            self._index(pos, add=True)

    def _index(self, pos: int, *, add: bool) -> None:
        m = self.movable[pos]
        for _count, k in m.parts:
            u = m.cands[k].unit
            if add:
                self.on.setdefault(u, {}).setdefault(m.group, set()).add(pos)
                continue
            held = self.on.get(u, {}).get(m.group)
            if held is not None:
                held.discard(pos)
                if not held:
                    del self.on[u][m.group]

    def _hop(
        self, u: int, v: int, want: float, changed: dict[int, list[list[int]]]
    ) -> tuple[int, list[list[int]]] | None:
        """The request part on ``u`` that best carries ``want`` bytes to ``v``: (pos, its new parts)."""
        best: tuple[float, int, int, int, int, int] | None = None  # (miss, cut?, pos, part, cand, slices)
        here: set[int] = set()
        for group, held in self.on.get(u, {}).items():
            if v in group.nearest:
                here |= held
        for pos in sorted(here):
            m = self.movable[pos]
            current = changed.get(pos, m.parts)
            k2 = m.group.nearest[v]
            for j, (count, k) in enumerate(current):
                if m.cands[k].unit != u:
                    continue
                self.work += 1
                options = [count]
                share = want / m.slice_bytes
                if count >= 2 * m.min_slices and math.isfinite(share):  # a tiny finite beta can overflow it
                    ideal = round(share)
                    options.append(min(max(ideal, m.min_slices), count - m.min_slices))
                for s in options:
                    key = (abs(s * m.slice_bytes - want), 0 if s == count else 1, pos, j, k2, s)
                    if best is None or key < best:
                        best = key
        if best is None:
            return None
        _miss, _cut, pos, j, k2, s = best
        m = self.movable[pos]
        current = [list(p) for p in changed.get(pos, m.parts)]
        count, k = current[j]
        if s == count:
            current[j][1] = k2
        else:
            current[j][0] = count - s
            current.insert(j + 1, [s, k2])
        merged: list[list[int]] = []
        for part in current:
            if merged and merged[-1][1] == part[1]:
                merged[-1][0] += part[0]
            else:
                merged.append(part)
        return pos, merged

    def _after(self, changed: dict[int, list[list[int]]]) -> tuple[dict[int, float], dict[int, float]]:
        """Egress and ingress of the lanes the ``changed`` requests touch, after the change."""
        egress = self.lanes.egress
        ingress = self.lanes.ingress
        out_e: dict[int, float] = {}
        out_i: dict[int, float] = {}
        for pos, new in changed.items():
            m = self.movable[pos]
            for parts, sign in ((m.parts, -1.0), (new, 1.0)):
                for slices, k in parts:
                    u = m.cands[k].unit
                    t = sign * m.seconds(slices, k)
                    out_e[u] = out_e.get(u, egress.get(u, 0.0)) + t
                    out_i[m.receiver] = out_i.get(m.receiver, ingress.get(m.receiver, 0.0)) + t
        return out_e, out_i

    def step(self) -> bool:
        """One improving move, if any; ``False`` when none exists (or the work bound is spent)."""
        egress = self.lanes.egress
        busiest = max(egress, key=lambda u: (egress[u], -u))
        top = egress[busiest]
        makespan = self.lanes.score()[0]
        parent: dict[int, int] = {busiest: busiest}
        depth = {busiest: 0}
        queue = [busiest]
        # Breadth first, each new sender's parent the first one in queue order with an edge to
        # it, met in sorted order. A group's units are all reached from the first sender that
        # has one of its requests, so each group is opened once per search.
        opened: set[_Group] = set()
        for u in queue:
            fresh: set[int] = set()
            for group in self.on.get(u, {}):
                if group not in opened:
                    opened.add(group)
                    fresh.update(v for v in group.units if v not in parent)
            for v in sorted(fresh):
                parent[v] = u
                depth[v] = depth[u] + 1
                queue.append(v)
        targets = sorted((egress.get(w, 0.0), depth[w], w) for w in parent if w != busiest)
        for low, _depth, w in targets:
            if low >= top or self.work > _LEVEL_WORK:
                return False
            path = [w]
            while path[-1] != busiest:
                path.append(parent[path[-1]])
            path.reverse()
            gap_bytes = (top - low) * self.network.beta / 2.0
            if not math.isfinite(gap_bytes):  # times beyond a float's range: nothing left to level by
                return False
            for fraction in (1.0, 0.5, 0.25):
                changed: dict[int, list[list[int]]] = {}
                for u, v in pairwise(path):
                    hop = self._hop(u, v, gap_bytes * fraction, changed)
                    if hop is None:
                        break
                    changed[hop[0]] = hop[1]
                else:
                    out_e, out_i = self._after(changed)
                    if (
                        out_e.get(busiest, top) < top
                        and all(t < top for t in out_e.values())
                        and all(t <= makespan for t in out_i.values())
                    ):
                        for pos, new in changed.items():
                            self._index(pos, add=False)
                            self.movable[pos].parts = new
                            self._index(pos, add=True)
                        egress.update(out_e)
                        self.lanes.ingress.update(out_i)
                        return True
        return False


def _answer(request: ReplicaRequest, m: _Movable) -> ReplicaAnswer:
    if len(m.parts) == 1:
        return m.cands[m.parts[0][1]].location
    parts: list[ReplicaPart] = []
    start = request.logical_origin[m.axis]
    for slices, k in m.parts:
        origin = list(request.logical_origin)
        shape = list(request.shape)
        origin[m.axis] = start
        shape[m.axis] = slices
        parts.append(ReplicaPart(tuple(origin), tuple(shape), m.cands[k].location))
        start += slices
    return parts


split_balanced = split_balanced_policy()
"""``split_balanced_policy()`` with its defaults (8 MiB floor, α = 30 µs, β = 25 GB/s)."""
