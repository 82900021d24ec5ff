"""``analysis.load_lower_bound``: exact against brute force, and never beaten by any plan.

The bound is the optimum of "serve every remote request from its candidates, split anyhow,
minimise the busiest sender". Two independent brute forces check it on tiny instances:

- Hall's condition by enumeration: the optimum is max over sender sets S of D(S)/|S|, where
  D(S) is the demand whose candidates all lie in S (every subset is tried);
- every integral split: with demands that are multiples of lcm(1..#senders) the optimum is an
  integer and is attained by an integral split (max-flow integrality), so enumerating all
  integral splits finds exactly the bound.

Then every policy's plan on random replicated maps puts at least the bound on its busiest sender.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from fractions import Fraction

import pytest

from refplan import (
    ReplicaCandidate,
    ReplicaPart,
    ReplicaRequest,
    TransferEndpoints,
    contiguous_split_map,
    replicate,
    replicated_map,
)
from refplan.analysis import (
    CostModel,
    estimate_sync_time,
    load_lower_bound,
    max_load_for,
    sender_load,
    sync_time_lower_bound,
)
from refplan.maps import ParamAffineMap
from refplan.maps import split as _split
from refplan.planner import collect_requests, plan_transfers
from refplan.policies import POLICIES, split_balanced_policy
from refplan.requests import ReplicaAnswer


def request(target: int, candidates: tuple[int, ...], size: int, *, index: int = 0) -> ReplicaRequest:
    """A 1-D request of ``size`` bytes for target process ``target``; location = process."""
    return ReplicaRequest(
        parameter="p",
        target_location=target,
        target_process=target,
        logical_origin=(index * 1000,),
        shape=(size,),
        target_offset=0,
        target_strides=(1,),
        candidates=tuple(ReplicaCandidate(c, 0, (1,)) for c in candidates),
        candidate_processes=candidates,
        bytes=size,
    )


def hall(requests: list[ReplicaRequest]) -> Fraction:
    """max over sender sets S of (remote demand confined to S) / |S|, by enumerating every S."""
    remote = [(set(r.candidate_processes), r.bytes or 0) for r in requests
              if r.target_process not in r.candidate_processes]
    units = sorted({u for cands, _ in remote for u in cands})
    best = Fraction(0)
    for k in range(1, len(units) + 1):
        for subset in itertools.combinations(units, k):
            s = set(subset)
            demand = sum(size for cands, size in remote if cands <= s)
            best = max(best, Fraction(demand, k))
    return best


def integral_optimum(requests: list[ReplicaRequest]) -> int:
    """Least busiest-sender load over every integral split of every remote request."""
    remote = [(tuple(sorted(set(r.candidate_processes))), r.bytes or 0) for r in requests
              if r.target_process not in r.candidate_processes]
    units = sorted({u for cands, _ in remote for u in cands})
    index = {u: i for i, u in enumerate(units)}
    states = {(0,) * len(units)}
    for cands, size in remote:
        nxt = set()
        for split in compositions(size, len(cands)):
            for loads in states:
                new = list(loads)
                for u, amount in zip(cands, split):
                    new[index[u]] += amount
                nxt.add(tuple(new))
        states = nxt
    return min(max(s) for s in states) if units else 0


def compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(total,)]
    return [(first, *rest) for first in range(total + 1) for rest in compositions(total - first, parts - 1)]


def random_instance(rng: random.Random, units: int, count: int, unit_size: int) -> list[ReplicaRequest]:
    out = []
    for i in range(count):
        k = rng.randint(1, units)
        cands = tuple(sorted(rng.sample(range(units), k)))
        target = rng.choice([100, 100, 100, *cands])  # sometimes local
        out.append(request(target, cands, unit_size * rng.randint(1, 2), index=i))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_bound_equals_the_best_integral_split(seed: int) -> None:
    rng = random.Random(seed)
    units = rng.randint(1, 3)
    scale = math.lcm(*range(1, units + 1))
    reqs = random_instance(rng, units, rng.randint(1, 3), scale)
    bound = load_lower_bound(reqs)
    assert bound.bytes == integral_optimum(reqs)
    assert bound.bytes == hall(reqs)


@pytest.mark.parametrize("seed", range(60))
def test_bound_equals_halls_condition(seed: int) -> None:
    rng = random.Random(1000 + seed)
    reqs = random_instance(rng, rng.randint(1, 7), rng.randint(1, 12), rng.randint(1, 50))
    bound = load_lower_bound(reqs)
    assert bound.bytes == hall(reqs)
    if bound.bytes > 0:
        # The critical set really forces it, and the bound is feasible but nothing below it is.
        crit = set(bound.critical)
        captive = sum(r.bytes or 0 for r in reqs
                      if r.target_process not in r.candidate_processes and set(r.candidate_processes) <= crit)
        assert Fraction(captive, len(crit)) == bound.bytes
        groups: dict[tuple[int, ...], int] = {}
        for r in reqs:
            if r.target_process not in r.candidate_processes:
                key = tuple(sorted(set(r.candidate_processes)))
                groups[key] = groups.get(key, 0) + (r.bytes or 0)
        assert max_load_for(groups, bound.bytes)[0]
        below = bound.bytes - Fraction(1, 10**6)
        feasible, violated = max_load_for(groups, below)
        assert not feasible and violated


def test_local_requests_cost_nothing() -> None:
    reqs = [request(0, (0, 1), 100), request(1, (0, 1), 100), request(5, (0, 1), 40)]
    bound = load_lower_bound(reqs)
    assert bound.local_bytes == 200 and bound.remote_bytes == 40
    assert bound.bytes == 20
    assert bound.ingress == {5: 40}


def test_without_processes_locations_are_the_units() -> None:
    target, source = contiguous_split_map((8, 4), [4, 4], 0), replicate(contiguous_split_map((8, 4), [8], 0), 4)
    reqs = collect_requests({"w": (target, source)})
    bound = load_lower_bound(reqs)
    assert not bound.by_process
    assert bound.bytes == Fraction(32, 4)  # elements, spread over the 4 replicas


def test_single_holders_fix_the_bound() -> None:
    reqs = [request(9, (0,), 70), request(9, (0, 1), 10), request(8, (1, 2), 30)]
    assert load_lower_bound(reqs).bytes == 70


@pytest.mark.parametrize("seed", range(10))
def test_shared_holder_tuples_give_the_bound_of_fresh_ones(seed: int) -> None:
    """The bound works a units tuple out once per candidate-processes (or holders) object and sums
    bytes per units object: the same requests repeated as objects, sharing one tuple per holder
    set as the planner's requests do, must give exactly what fresh copies give (Hall's value)."""
    rng = random.Random(seed)
    pool = random_instance(rng, 4, 6, 6)
    shared = {tuple(r.candidate_processes): tuple(r.candidate_processes) for r in pool}
    pool = [dataclasses.replace(r, candidate_processes=shared[tuple(r.candidate_processes)]) for r in pool]
    picks = [rng.randrange(len(pool)) for _ in range(30)]
    repeated = [pool[i] for i in picks]
    fresh = [dataclasses.replace(pool[i], candidate_processes=tuple(pool[i].candidate_processes)) for i in picks]
    got = load_lower_bound(repeated)
    assert got == load_lower_bound(fresh)
    assert got.bytes == hall(fresh)


def test_a_region_held_by_many_locations_is_bounded_without_its_candidates() -> None:
    """512 row shards from a tensor replicated on 512 locations: the requests keep their holders
    and make candidates only if asked (``_UniformRequest``); the bound never asks, and is the
    even share (4 rows x 8 x 2 bytes per shard over 512 senders)."""
    k = 512
    pairs = {"w": (contiguous_split_map((4 * k, 8), [4] * k, 0), replicated_map((4 * k, 8), k))}
    reqs = collect_requests(pairs, element_size=2)
    bound = load_lower_bound(reqs)
    assert bound.bytes == 64 and bound.groups == 1 and len(bound.senders) == k
    assert all("candidates" not in r.__dict__ for r in reqs)


def test_empty_batch() -> None:
    bound = load_lower_bound([])
    assert bound.bytes == 0 and bound.ratio(0) == 1.0 and bound.ratio(5) == float("inf")


# ---------------------------------------------------------------------------------------------
# No plan ever beats it.


def random_batch(
    rng: random.Random,
) -> tuple[dict[str, tuple[ParamAffineMap, ParamAffineMap]], TransferEndpoints, dict[int, int]]:
    tp_s, dp_s, tp_t = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 4)
    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    for i in range(rng.randint(1, 4)):
        shape = (rng.randint(tp_s * tp_t, 40), rng.randint(1, 6))
        axis = rng.choice([0, 1]) if shape[1] >= max(tp_s, tp_t) else 0
        if rng.random() < 0.2:
            pairs[f"p{i}"] = (replicated_map(shape, tp_t), replicated_map(shape, tp_s * dp_s))
        else:
            pairs[f"p{i}"] = (
                contiguous_split_map(shape, _split(shape[axis], tp_t), axis),
                replicate(contiguous_split_map(shape, _split(shape[axis], tp_s), axis), dp_s),
            )
    sources = tp_s * dp_s
    colocated = rng.random() < 0.5
    endpoints = TransferEndpoints(
        {loc: loc for loc in range(sources)},
        {loc: (loc % sources if colocated else sources + loc) for loc in range(tp_t)},
    )
    nodes = {p: p % 2 for p in range(sources + tp_t)}
    return pairs, endpoints, nodes


def random_split_policy(seed: int):  # type: ignore[no-untyped-def]
    """Answers with arbitrary valid splits along axis 0 (a policy the planner must accept)."""
    def policy(requests):  # type: ignore[no-untyped-def]
        rng = random.Random(seed)
        out: list[ReplicaAnswer] = []
        for r in requests:
            locs = [c.source_rank for c in r.candidates]
            if r.shape[0] >= 2 and rng.random() < 0.5:
                cut = rng.randint(1, r.shape[0] - 1)
                a = ReplicaPart(r.logical_origin, (cut, *r.shape[1:]), rng.choice(locs))
                b_origin = (r.logical_origin[0] + cut, *r.logical_origin[1:])
                b = ReplicaPart(b_origin, (r.shape[0] - cut, *r.shape[1:]), rng.choice(locs))
                out.append([a, b])
            else:
                out.append(rng.choice(locs))
        return out
    return policy


@pytest.mark.parametrize("seed", range(25))
def test_no_plan_beats_the_bound(seed: int) -> None:
    rng = random.Random(seed)
    pairs, endpoints, nodes = random_batch(rng)
    sizes = dict.fromkeys(pairs, 2)
    bound = load_lower_bound(collect_requests(pairs, endpoints=endpoints, element_size=sizes, process_node=nodes))
    policies = {**POLICIES, "random_split": random_split_policy(seed),
                "split_small": split_balanced_policy(min_split_bytes=2)}
    model = CostModel()
    floor = sync_time_lower_bound(bound, model, process_node=nodes)
    for name, policy in policies.items():
        plans = plan_transfers(pairs, endpoints=endpoints, element_size=sizes, replica_policy=policy,
                               min_split_bytes=0, process_node=nodes)
        load = sender_load(plans, endpoints=endpoints, element_size=sizes)
        top = max(load.sent.values(), default=0)
        assert top >= bound.bytes, name
        assert load.total_sent >= bound.remote_bytes, name
        estimate = estimate_sync_time(plans, endpoints=endpoints, element_size=sizes, process_node=nodes, cost=model)
        assert estimate.seconds >= floor * (1 - 1e-12), name


def test_bound_on_a_replicated_sync_is_the_even_share() -> None:
    """TP2×DP2 → TP2 on separate processes: every slice has two holders, so total / 4."""
    shape = (16, 4)
    pairs = {"w": (contiguous_split_map(shape, [8, 8], 0), replicate(contiguous_split_map(shape, [8, 8], 0), 2))}
    endpoints = TransferEndpoints({i: i for i in range(4)}, {0: 10, 1: 11})
    bound = load_lower_bound(collect_requests(pairs, endpoints=endpoints, element_size={"w": 2}))
    assert bound.bytes == 16 * 4 * 2 / 4
    assert bound.senders == (0, 1, 2, 3)
    plans = plan_transfers(pairs, endpoints=endpoints, element_size={"w": 2}, replica_policy=POLICIES["first_holder"])
    top = max(sender_load(plans, endpoints=endpoints, element_size={"w": 2}).sent.values())
    assert bound.ratio(top) == 2.0
