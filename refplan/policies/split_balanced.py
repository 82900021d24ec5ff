"""``split_balanced``: the cost-aware policy that may split a region across its holders.

It prices every candidate path with the α-β model (``policies.cost``), places single-holder
load first, then assigns and levels the movable requests by estimated sync time, splitting a
request along one axis only where each part keeps at least ``min_split_bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from ..check import DEFAULT_MIN_SPLIT_BYTES
from ..requests import ReplicaAnswer, ReplicaPart, ReplicaPolicy, ReplicaRequest
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


class _Movable:
    """A request with several remote candidates: its slices along one axis, and its parts.

    ``parts`` are ``[slices, candidate index]`` in axis order; they tile the request's extent on
    ``axis``. Every part of a split is at least ``min_slices`` slices (``min_split_bytes``).
    ``receiver`` is the lane its bytes arrive on (the target process, or ``-1 - location``).
    """

    __slots__ = ("axis", "cands", "index", "min_slices", "parts", "receiver", "size", "slice_bytes", "slices")

    def __init__(
        self, index: int, request: ReplicaRequest, cands: list[_Candidate], receiver: int, min_split: int
    ) -> None:
        self.index = index
        self.cands = cands
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
       survives that does not lower the makespan.

    Parts tile their request exactly (cuts along one axis of the box), so the planner's
    ``check_answers`` accepts them. Give the planner the same ``min_split_bytes`` (its default
    is ``DEFAULT_MIN_SPLIT_BYTES`` too): a smaller planner floor is fine, a larger one refuses
    the splits. Without element sizes, sizes are elements and so is the floor, as in the
    planner's check. Only the requests and these numbers are read, in their fixed order, with
    ties broken by sender and location, and levelling stops after a fixed amount of work
    (``_LEVEL_WORK`` candidate moves): every process computes the same answers.
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
        for i, r in enumerate(requests):
            cands: list[_Candidate] = []
            for k, c in enumerate(r.candidates):
                proc = r.candidate_processes[k]
                if by_process and proc is not None:
                    if proc == r.target_process:
                        kind = "process"
                    elif r.candidate_nodes is not None and r.target_node is not None and (
                        r.candidate_nodes[k] == r.target_node
                    ):
                        kind = "node"
                    else:
                        kind = "network"
                    cands.append(_Candidate(proc, c.source_rank, links[kind], _PATH_RANK[kind]))
                else:
                    cands.append(_Candidate(c.source_rank, c.source_rank, links["network"], 2))
            receiver = r.target_process if by_process and r.target_process is not None else -1 - r.target_location
            local = [c.location for c in cands if c.rank == 0]
            if local:
                answers[i] = min(local)
            elif len(cands) == 1:
                only = cands[0]
                answers[i] = only.location
                lanes.add(only.unit, receiver, only.link.seconds(request_load(r)))
            else:
                movable.append(_Movable(i, r, cands, receiver, min_split_bytes))
        if not movable:
            return answers
        movable.sort(key=lambda m: (-m.size, m.index))
        egress = lanes.egress
        for m in movable:
            best = min(
                range(len(m.cands)),
                key=lambda k: (
                    egress.get(m.cands[k].unit, 0.0) + m.seconds(m.slices, k), m.cands[k].rank, m.cands[k].location,
                ),
            )
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
    return policy


class _Mover:
    """Step 3 of ``split_balanced_policy``: move work off the busiest sender while it helps.

    A move follows a path of senders p = u0 → u1 → … → uL: at each hop a part of some request
    that sits on u(i) and has a holder on u(i+1) moves there, whole or cut, so a chain of
    holders carries load from the busiest sender to a lighter one that shares no request with it
    directly. A move is taken only if every sender it touches ends below the busiest sender's
    old time and no receiver ends above the current sync time: the sorted vector of sender
    times falls lexicographically, so the loop ends, and the sync time never rises.
    """

    def __init__(self, movable: list[_Movable], lanes: _Lanes, network: LinkCost) -> None:
        self.movable = movable
        self.lanes = lanes
        self.network = network
        self.edges: dict[int, dict[int, set[int]]] = {}
        self.work = 0
        for pos in range(len(movable)):
            self._index(pos, add=True)

    def _index(self, pos: int, *, add: bool) -> None:
        m = self.movable[pos]
        for _count, k in m.parts:
            u = m.cands[k].unit
            out = self.edges.setdefault(u, {})
            for c in m.cands:
                if c.unit != u:
                    bucket = out.setdefault(c.unit, set())
                    if add:
                        bucket.add(pos)
                    else:
                        bucket.discard(pos)

    def _hop(
        self, u: int, v: int, want: float, changed: dict[int, list[list[int]]]
    ) -> tuple[int, list[list[int]]] | None:
        """The request part on ``u`` that best carries ``want`` bytes to ``v``: (pos, its new parts)."""
        best: tuple[float, int, int, int, int, int] | None = None  # (miss, cut?, pos, part, cand, slices)
        for pos in sorted(self.edges.get(u, {}).get(v, ())):
            m = self.movable[pos]
            current = changed.get(pos, m.parts)
            k2 = min(
                (k for k, c in enumerate(m.cands) if c.unit == v), key=lambda k: (m.cands[k].rank, m.cands[k].location)
            )
            for j, (count, k) in enumerate(current):
                if m.cands[k].unit != u:
                    continue
                self.work += 1
                options = [count]
                if count >= 2 * m.min_slices:
                    ideal = round(want / m.slice_bytes)
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
        for u in queue:
            for v in sorted(self.edges.get(u, {})):
                if v not in parent and self.edges[u][v]:
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
