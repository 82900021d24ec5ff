"""Per-process load of a plan batch, its lower bound, and an α-β estimate of the sync time.

Load is what limits a sync: the busiest sender's bytes set its duration on equal links, so the
number worth printing is max load / even share (1.0 is perfect balance), or better, max load /
the least max load any plan could have if regions could be split in arbitrary fractions
(``load_lower_bound``: whole elements can need more), which is what ``refplan bench`` reports
every plan against.

The α-β model (``CostModel``, ``LinkCost``, ``path_kind`` and the defaults) lives in
``policies.cost``, upstream of both the policy that decides with it and this module, which
reports with it; the names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .endpoints import PROCESS_NODE_NEEDS_ENDPOINTS, check_endpoints
from .errors import InvalidMapError
from .limits import element_sizes
from .plan import TransferPlan, TransferSegment
from .policies.cost import DEFAULT_ALPHA, DEFAULT_BETA, PATH_KINDS, CostModel, LinkCost, path_kind
from .policies.simple import uses_processes
from .requests import ReplicaRequest, TransferEndpoints, _node_of, holder_locations

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "PATH_KINDS",
    "CostModel",
    "LinkCost",
    "LoadLowerBound",
    "LoadReport",
    "SyncEstimate",
    "estimate_sync_time",
    "load_lower_bound",
    "max_load_for",
    "path_kind",
    "sender_load",
    "sync_time_lower_bound",
]

@dataclass(frozen=True)
class LoadReport:
    """Bytes (or elements) sent per source process (or location), local copies apart.

    ``senders``: the processes (locations) that could send, as far as ``sender_load`` knew them
    (the ``senders`` it was given, every process ``endpoints`` binds a source location to, and
    every one that sent), sorted; ``None`` when it could not know them: without endpoints or
    ``senders``, the plans name only the locations that did send, not the other holders.
    """

    sent: dict[int, int]
    local: dict[int, int]
    by_process: bool
    senders: tuple[int, ...] | None = None

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    def imbalance(self, senders: int | None = None) -> float:
        """Busiest sender over the even share among ``senders`` (default: those that could send,
        ``self.senders``); 1.0 when nothing was sent.

        Why no fallback to the senders in ``sent``: those are only the ones that did send, so a
        plan sending everything from one of four replicas would report perfect balance (1.0). When
        the report does not know who could send (``self.senders`` is ``None``) and something was
        sent, this raises ``ValueError`` rather than print that number: pass the count here, or
        ``senders=`` (or ``endpoints=``) to ``sender_load``.
        """
        if self.total_sent == 0:
            return 1.0
        if senders is not None:
            count = senders
        elif self.senders is not None:
            count = len(self.senders)
        else:
            raise ValueError(
                "imbalance() cannot tell which senders could send: the report was made without "
                "endpoints or senders; pass the count (imbalance(n)) or senders= to sender_load"
            )
        if count == 0:
            return 1.0
        return max(self.sent.values()) / (self.total_sent / count)


def _cost_model(cost: object) -> CostModel:
    """``cost`` or the default ``CostModel``; ``TypeError`` for anything else (before, a string
    or a dict ended in a bare ``AttributeError`` of ``.network``)."""
    if cost is None:
        return CostModel()
    if not isinstance(cost, CostModel):
        raise TypeError(f"cost must be a CostModel or None, got a {type(cost).__name__}")
    return cost


def _bound(endpoints: TransferEndpoints, plans: Mapping[str, TransferPlan]) -> None:
    """Refuse, naming the parameter, segment and location, a plan segment whose source or target
    location ``endpoints`` binds to no process (``InvalidMapError``, as the planner refuses such
    endpoints); before, a report ended in a bare ``KeyError`` of the location. Called by a
    report only once its own pass met a missing location, so a sound batch pays nothing."""
    for name in sorted(plans):
        for i, seg in enumerate(plans[name].segments):
            for side, table, location in (("source", endpoints.source, seg.source_rank),
                                          ("target", endpoints.target, seg.target_rank)):
                if location not in table:
                    raise InvalidMapError(
                        f"parameter {name!r}: endpoints bind no process to {side} location {location}, "
                        f"which segment {i} of its plan {'reads' if side == 'source' else 'writes'}"
                    )


def _checked_nodes(
    plans: Mapping[str, TransferPlan], endpoints: TransferEndpoints | None, process_node: Mapping[int, int] | None
) -> dict[int, int] | None:
    """``process_node`` read once and held to the planner's rules (``InvalidMapError`` in its
    words): it needs endpoints (nodes are known per process), and it names a node for every
    process a segment moves between. Before, an estimate ignored a ``process_node`` given without
    endpoints and counted a process missing from it as a network hop, where the planner refuses
    both; an estimate of a batch the planner cannot plan is no estimate."""
    if process_node is None:
        return None
    if endpoints is None:
        raise InvalidMapError(PROCESS_NODE_NEEDS_ENDPOINTS)
    nodes = dict(process_node.items())
    for name in sorted(plans):
        for seg in plans[name].segments:
            for process in (endpoints.source.get(seg.source_rank), endpoints.target.get(seg.target_rank)):
                if process is not None:
                    _node_of(nodes, process, name)  # the planner's refusal, in its words
    return nodes


def _sized(
    plans: Mapping[str, TransferPlan], element_size: Mapping[str, int] | int | None
) -> Iterator[tuple[TransferSegment, int]]:
    """Every segment of ``plans`` (parameters in name order) with its bytes (elements when no
    element size is given). The sizes are checked first, as the planner checks them
    (``limits.element_sizes``): the same ``element_size`` a plan was made with, an ``int``
    included, gives the same sizes here."""
    names = sorted(plans)
    sizes = element_sizes(names, element_size)
    for name in names:
        unit = 1 if sizes is None else sizes[name]
        for seg in plans[name].segments:
            yield seg, seg.numel * unit


def sender_load(
    plans: Mapping[str, TransferPlan],
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: Mapping[str, int] | int | None = None,
    senders: list[int] | None = None,
) -> LoadReport:
    """Sum each segment's bytes onto its sending process (or source location without endpoints).

    A segment whose source and target are the same process is a local copy and is counted apart,
    since it uses no link. ``senders`` pre-seeds zero rows so idle senders show up.
    ``element_size`` is what ``plan_transfers`` takes (an ``int`` for every parameter, or one
    per parameter); a parameter without one, or a location ``endpoints`` does not bind, is
    refused by name; ``endpoints`` that is not a ``TransferEndpoints`` is a ``TypeError``, as in
    ``plan_transfers``. The report keeps who could send (``LoadReport.senders``: the ``senders``
    given and the processes ``endpoints`` binds source locations to), read off those arguments
    with no per-element work, so ``imbalance()`` divides by them and not by who happened to send.
    """
    check_endpoints(endpoints)
    sent: dict[int, int] = dict.fromkeys(senders or [], 0)
    local: dict[int, int] = {}
    try:
        for seg, size in _sized(plans, element_size):
            if endpoints is None:
                sent[seg.source_rank] = sent.get(seg.source_rank, 0) + size
                continue
            src = endpoints.source[seg.source_rank]
            if src == endpoints.target[seg.target_rank]:
                local[src] = local.get(src, 0) + size
            else:
                sent[src] = sent.get(src, 0) + size
    except KeyError:
        if endpoints is not None:
            _bound(endpoints, plans)  # names the unbound location
        raise
    could: set[int] | None = None
    if senders is not None or endpoints is not None:
        could = set(sent)
        if endpoints is not None:
            could.update(endpoints.source.values())
    return LoadReport(sent, local, endpoints is not None, None if could is None else tuple(sorted(could)))


@dataclass(frozen=True)
class SyncEstimate:
    """α-β time of a batch: per process, egress (sends), ingress (receives), local copies.

    A process's time is ``max(egress, ingress, local)``: links are full duplex, and the executor
    does local copies while a round's messages are in flight. Every segment is one message (the
    executor may cut it into staging chunks; that adds α per chunk, identically for every policy
    on the same plan sizes, so it is left out). ``seconds`` is the busiest process's time.
    """

    egress: dict[int, float]
    ingress: dict[int, float]
    local: dict[int, float]
    seconds: float


def estimate_sync_time(
    plans: Mapping[str, TransferPlan],
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: Mapping[str, int] | int | None = None,
    process_node: Mapping[int, int] | None = None,
    cost: CostModel | None = None,
) -> SyncEstimate:
    """The α-β estimate of ``plans`` (see ``SyncEstimate``).

    Without endpoints, source and target locations stand for processes in two disjoint sets
    (nothing is local, every path is ``network``); without element sizes, elements count as bytes.
    ``element_size`` and ``endpoints`` are checked as in ``sender_load``; a ``cost`` that is not a
    ``CostModel`` is a ``TypeError``; ``process_node`` is held to the planner's rules (it needs
    endpoints and a node for every process a segment moves between, else ``InvalidMapError``).
    """
    check_endpoints(endpoints)
    model = _cost_model(cost)
    process_node = _checked_nodes(plans, endpoints, process_node)
    egress: dict[int, float] = {}
    ingress: dict[int, float] = {}
    local: dict[int, float] = {}
    try:
        for seg, size in _sized(plans, element_size):
            if endpoints is None:
                link = model.network
                t = link.alpha + size / link.beta
                egress[seg.source_rank] = egress.get(seg.source_rank, 0.0) + t
                ingress[-1 - seg.target_rank] = ingress.get(-1 - seg.target_rank, 0.0) + t
                continue
            src = endpoints.source[seg.source_rank]
            dst = endpoints.target[seg.target_rank]
            kind = path_kind(src, dst, process_node)
            link = model.link(kind)
            t = link.alpha + size / link.beta
            if kind == "process":
                local[src] = local.get(src, 0.0) + t
            else:
                egress[src] = egress.get(src, 0.0) + t
                ingress[dst] = ingress.get(dst, 0.0) + t
    except KeyError:
        if endpoints is not None:
            _bound(endpoints, plans)  # names the unbound location
        raise
    procs = set(egress) | set(ingress) | set(local)
    seconds = max(
        (max(egress.get(p, 0.0), ingress.get(p, 0.0), local.get(p, 0.0)) for p in procs), default=0.0
    )
    return SyncEstimate(egress, ingress, local, seconds)


# ---------------------------------------------------------------------------------------------
# The lower bound: least possible load on the busiest sender when regions may be split freely.


@dataclass(frozen=True)
class LoadLowerBound:
    """The least bytes any plan must put on its busiest sender, and where that is forced.

    ``bytes`` is exact (a ``Fraction``): the optimum of the LP "serve every remote request from
    its candidates in arbitrary fractions, minimise the largest per-sender total". Requests with
    a candidate in the target's own process cost nothing on the network (served locally) and are
    left out. ``critical`` is a set of senders that forces it: the remote requests whose every
    candidate lies in ``critical`` hold ``bytes × len(critical)`` bytes between them (Hall's
    condition, read off the minimum cut). ``units`` are processes when every request carries
    them (endpoints given), else source locations, as in ``sender_load``.
    """

    bytes: Fraction
    critical: tuple[int, ...]
    remote_bytes: int
    local_bytes: int
    senders: tuple[int, ...]
    by_process: bool
    groups: int
    ingress: dict[int, int] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        """Remote bytes over every sender that could send: the even share."""
        return self.remote_bytes / len(self.senders) if self.senders else 0.0

    def ratio(self, max_sent: float) -> float:
        """``max_sent`` over this bound (1.0 when both are zero: nothing had to move)."""
        if self.bytes == 0:
            return 1.0 if max_sent == 0 else float("inf")
        return float(max_sent / self.bytes)


def _request_size(r: ReplicaRequest) -> int:
    return r.bytes if r.bytes is not None else r.elements


def _max_flow(
    demand: Sequence[int], members: Sequence[tuple[int, ...]], units: int, capacity: int
) -> tuple[int, set[int]]:
    """Integer max-flow source → group (``demand``) → its member units (unbounded) → sink
    (``capacity`` each); returns (flow, units reachable from the source in the residual graph).

    Dinic's algorithm on the small bipartite graph; nodes: 0 source, 1..G groups, G+1..G+U
    units, G+U+1 sink.
    """
    groups = len(demand)
    sink = groups + units + 1
    n = sink + 1
    head: list[list[int]] = [[] for _ in range(n)]
    to: list[int] = []
    cap: list[int] = []
    infinite = sum(demand) + 1

    def edge(a: int, b: int, c: int) -> None:
        head[a].append(len(to))
        to.append(b)
        cap.append(c)
        head[b].append(len(to))
        to.append(a)
        cap.append(0)

    for g, d in enumerate(demand):
        edge(0, 1 + g, d)
        for u in members[g]:
            edge(1 + g, 1 + groups + u, infinite)
    for u in range(units):
        edge(1 + groups + u, sink, capacity)
    flow = 0
    while True:
        level = [-1] * n
        level[0] = 0
        queue = [0]
        for a in queue:
            for e in head[a]:
                if cap[e] > 0 and level[to[e]] < 0:
                    level[to[e]] = level[a] + 1
                    queue.append(to[e])
        if level[sink] < 0:
            reach = {v - 1 - groups for v in range(1 + groups, 1 + groups + units) if level[v] >= 0}
            return flow, reach
        it = [0] * n
        while True:
            got = _augment(0, sink, infinite, head, to, cap, level, it)
            if not got:
                break
            flow += got


def _augment(
    a: int, sink: int, limit: int, head: list[list[int]], to: list[int], cap: list[int], level: list[int],
    it: list[int],
) -> int:
    """One augmenting path of the level graph from ``a`` (depth 3 here: shallow recursion)."""
    if a == sink:
        return limit
    edges = head[a]
    while it[a] < len(edges):
        e = edges[it[a]]
        b = to[e]
        if cap[e] > 0 and level[b] == level[a] + 1:
            got = _augment(b, sink, min(limit, cap[e]), head, to, cap, level, it)
            if got:
                cap[e] -= got
                cap[e ^ 1] += got
                return got
        it[a] += 1
    return 0


def max_load_for(groups: Mapping[tuple[int, ...], int], capacity: Fraction | int) -> tuple[bool, tuple[int, ...]]:
    """Can ``groups`` (candidate units → bytes) be served with at most ``capacity`` per unit?

    Returns (feasible, a violating unit set when infeasible). Exact: capacities are scaled to
    integers by the denominator of ``capacity``, so it must be a ``Fraction`` or an ``int``
    (``TypeError`` otherwise: a float has no exact denominator, and a bool is no capacity).
    """
    if isinstance(capacity, bool) or not isinstance(capacity, (int, Fraction)):
        raise TypeError(f"capacity must be a Fraction or an int, got a {type(capacity).__name__}")
    units = sorted({u for members in groups for u in members})
    index = {u: i for i, u in enumerate(units)}
    keys = sorted(groups)
    q = capacity.denominator
    demand = [groups[k] * q for k in keys]
    members = [tuple(index[u] for u in k) for k in keys]
    flow, reach = _max_flow(demand, members, len(units), capacity.numerator)
    if flow == sum(demand):
        return True, ()
    return False, tuple(units[i] for i in sorted(reach))


def load_lower_bound(requests: Iterable[ReplicaRequest]) -> LoadLowerBound:
    """The least load any plan (splits allowed anywhere) must put on its busiest sender.

    Requests are grouped by candidate set (their sender units), so the flow network has one node
    per distinct holder set, not per request. The bound is found exactly by Dinkelbach's
    iteration on Hall's ratio: start from T = remote bytes / all senders (a valid lower bound);
    while T is infeasible, the minimum cut names a sender set S whose captive demand D(S) exceeds
    T·|S|, so T' = D(S)/|S| is a larger valid lower bound; stop when T is feasible, hence optimal.
    Pure Python with exact rationals; each round is one max-flow on (groups + senders) nodes.
    """
    reqs = list(requests)
    by_process = uses_processes(reqs)
    ingress: dict[int, int] = {}
    local = remote = 0
    # A request's sender units depend only on its candidate processes (or holder locations), and
    # requests share those tuples (one per region, or per holder set): the units are worked out
    # once per tuple object, and bytes summed per units object, then merged by value. Per request
    # that is O(1); before, sorting, hashing and testing membership in every request's units was
    # k² for k requests over k holders (4 096 of each: 10 s). Each entry holds its tuple, so no
    # id is reused while this runs.
    known: dict[int, tuple[object, tuple[int, ...], frozenset[int]]] = {}
    by_units: dict[int, list[Any]] = {}  # id(units) -> [units, bytes]
    for r in reqs:
        size = _request_size(r)
        held: object = r.candidate_processes if by_process else holder_locations(r)
        entry = known.get(id(held))
        if entry is None:
            named = {p for p in r.candidate_processes if p is not None} if by_process else set(holder_locations(r))
            entry = known[id(held)] = (held, tuple(sorted(named)), frozenset(named))
        _held, units, unit_set = entry
        if by_process:
            if r.target_process in unit_set:
                local += size
                continue
            assert r.target_process is not None
            ingress[r.target_process] = ingress.get(r.target_process, 0) + size
        remote += size
        total = by_units.get(id(units))
        if total is None:
            by_units[id(units)] = [units, size]
        else:
            total[1] += size
    senders: set[int] = set()
    groups: dict[tuple[int, ...], int] = {}
    for units, size in by_units.values():
        senders.update(units)
        if size:
            groups[units] = groups.get(units, 0) + size
    if not groups:
        return LoadLowerBound(Fraction(0), (), remote, local, tuple(sorted(senders)), by_process, 0, ingress)
    everyone = tuple(sorted({u for k in groups for u in k}))
    bound = Fraction(sum(groups.values()), len(everyone))
    critical = everyone
    while True:
        feasible, violated = max_load_for(groups, bound)
        if feasible:
            break
        captive = sum(d for k, d in groups.items() if set(k) <= set(violated))
        better = Fraction(captive, len(violated))
        if better <= bound:  # cannot happen: the cut proves D(S) > T·|S|
            raise AssertionError("lower bound iteration did not make progress")
        bound, critical = better, violated
    return LoadLowerBound(bound, critical, remote, local, tuple(sorted(senders)), by_process, len(groups), ingress)


def sync_time_lower_bound(
    bound: LoadLowerBound, cost: CostModel | None = None, *, process_node: Mapping[int, int] | None = None
) -> float:
    """The α-β makespan no plan can beat (up to floating-point rounding: with α = 0 a plan's
    estimate sums per-segment times and can land one step below), from ``bound``.

    The busiest sender moves at least ``bound.bytes`` in at least one message, at best at the
    fastest non-local path's speed; each target process receives its non-local bytes the same
    way. With ``process_node`` a same-node path may be the fastest; without it every remote path
    is ``network``. A ``cost`` that is not a ``CostModel`` is a ``TypeError``.
    """
    model = _cost_model(cost)
    links = [model.network] + ([model.node] if process_node is not None else [])
    alpha = min(link.alpha for link in links)
    beta = max(link.beta for link in links)
    send = alpha + float(bound.bytes) / beta if bound.bytes > 0 else 0.0
    receive = max((alpha + b / beta for b in bound.ingress.values() if b > 0), default=0.0)
    return max(send, receive)
