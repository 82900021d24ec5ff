"""Determinism: a plan depends on the maps, never on the order they are written in.

Every process of a collective transfer may plan for itself, so the same batch must give the
same plan JSON byte for byte: planned twice, and after permuting the key order of ``pairs``,
``pieces_by_rank`` and ``shard_shapes``, every location's piece list and the endpoint dicts.
Checked for ``first_holder`` and the default ``balanced`` policy, with and without endpoints,
and for the request sequence a policy sees.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from conftest import assert_executes_exactly, shuffled_map, split
from hypothesis import given
from hypothesis import strategies as st

from refplan.maps import LAYOUTS, ParamAffineMap, contiguous_split_map, replicate, replicated_map
from refplan.planner import plan_transfer, plan_transfers
from refplan.policies import balanced, first_holder
from refplan.requests import ReplicaRequest, TransferEndpoints

POLICIES = {"first_holder": first_holder, "balanced": balanced}

Pairs = dict[str, tuple[ParamAffineMap, ParamAffineMap]]


# The §4.6 layouts these tests use, from the one table (``maps.LAYOUTS``), at a TP degree.
_bigcode = LAYOUTS["bigcode"]
_yuan = LAYOUTS["yuan_gather"]
_sub = LAYOUTS["sub_params"]


def batch() -> Pairs:
    """Parameters whose sources have several holders, so the policy's choices matter."""
    row2 = replicate(contiguous_split_map((8, 8), [4, 4], 0), 2)
    uneven = replicate(contiguous_split_map((7, 13), [4, 3], 0), 3)
    return {
        "w_row_to_col": (contiguous_split_map((8, 8), [2] * 4, 1), row2),
        "bigcode": (_bigcode(4), replicate(_bigcode(2), 2)),
        "yuan": (_yuan(2), replicate(_yuan(4), 2)),
        "sub_params": (_sub(2), replicate(_sub(4), 2)),
        "replicated": (replicated_map((5, 6), 3), replicate(replicated_map((5, 6), 2), 2)),
        "uneven": (contiguous_split_map((7, 13), split(13, 3), 1), uneven),
        "single_holder": (contiguous_split_map((8, 4), [4, 4], 0), contiguous_split_map((8, 4), [2] * 4, 0)),
    }


def endpoints_for(pairs: Pairs) -> TransferEndpoints:
    """Source location r on process r; target location r on process (3r + 1) mod 8 (some local)."""
    src = sorted({r for _, s in pairs.values() for r in s.shard_shapes})
    tgt = sorted({r for t, _ in pairs.values() for r in t.shard_shapes})
    return TransferEndpoints({r: r for r in src}, {r: (3 * r + 1) % 8 for r in tgt})


def shuffled(pairs: Pairs, endpoints: TransferEndpoints | None, rng: random.Random) -> tuple[Pairs, Any]:
    names = list(pairs)
    rng.shuffle(names)
    out = {n: (shuffled_map(pairs[n][0], rng), shuffled_map(pairs[n][1], rng)) for n in names}
    if endpoints is None:
        return out, None
    s_keys, t_keys = list(endpoints.source), list(endpoints.target)
    rng.shuffle(s_keys)
    rng.shuffle(t_keys)
    return out, TransferEndpoints({k: endpoints.source[k] for k in s_keys}, {k: endpoints.target[k] for k in t_keys})


def plan_json(plans: Mapping[str, Any]) -> str:
    return json.dumps({name: plans[name].to_dict() for name in sorted(plans)}, sort_keys=True)


def request_key(r: ReplicaRequest) -> tuple[Any, ...]:
    return (
        r.parameter, r.target_location, r.target_process, tuple(r.logical_origin), tuple(r.shape),
        r.target_offset, tuple(r.target_strides),
        tuple((c.source_rank, c.source_offset, tuple(c.source_strides)) for c in r.candidates),
        tuple(r.candidate_processes), r.bytes,
    )


class Recorder:
    """Wraps a policy and records the request sequence it was shown."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.seen: list[tuple[Any, ...]] = []

    def __call__(self, requests: Sequence[ReplicaRequest]) -> Any:
        self.seen.extend(request_key(r) for r in requests)
        return self.policy(requests)


CASES = [(p, e) for p in sorted(POLICIES) for e in (False, True)]
CASE_IDS = [f"{p}-{'endpoints' if e else 'no-endpoints'}" for p, e in CASES]


@pytest.mark.parametrize("policy, with_endpoints", CASES, ids=CASE_IDS)
def test_same_batch_twice(policy: str, with_endpoints: bool) -> None:
    pairs = batch()
    ep = endpoints_for(pairs) if with_endpoints else None
    first = plan_transfers(pairs, endpoints=ep, replica_policy=POLICIES[policy])
    second = plan_transfers(batch(), endpoints=endpoints_for(pairs) if with_endpoints else None,
                            replica_policy=POLICIES[policy])
    assert plan_json(first) == plan_json(second)
    assert sorted(first) == sorted(pairs)
    for name, (tgt, src) in pairs.items():
        assert_executes_exactly(first[name], tgt, src)


@pytest.mark.parametrize("policy, with_endpoints", CASES, ids=CASE_IDS)
def test_shuffled_inputs_give_identical_plans(policy: str, with_endpoints: bool) -> None:
    pairs = batch()
    ep = endpoints_for(pairs) if with_endpoints else None
    base_rec = Recorder(POLICIES[policy])
    base = plan_json(plan_transfers(pairs, endpoints=ep, replica_policy=base_rec))
    reordered = False
    for seed in range(5):
        rec = Recorder(POLICIES[policy])
        s_pairs, s_ep = shuffled(pairs, ep, random.Random(seed))
        reordered |= list(s_pairs) != list(pairs)
        got = plan_json(plan_transfers(s_pairs, endpoints=s_ep, replica_policy=rec))
        assert got == base, f"seed {seed}: plan JSON differs after shuffling"
        assert rec.seen == base_rec.seen, f"seed {seed}: the policy saw a different request sequence"
    assert reordered, "no shuffle reordered the parameters"


def test_balanced_actually_depends_on_the_batch() -> None:
    # Guard against a vacuous determinism test: the policies must disagree on this batch.
    pairs = batch()
    assert plan_json(plan_transfers(pairs, replica_policy=first_holder)) != plan_json(
        plan_transfers(pairs, replica_policy=balanced)
    )


def test_requests_arrive_in_fixed_order() -> None:
    # RFC: sorted by parameter, then target location, then origin; one per intersection,
    # single-holder intersections included.
    rec = Recorder(balanced)
    pairs = batch()
    plan_transfers(pairs, endpoints=endpoints_for(pairs), replica_policy=rec)
    keys = [(k[0], k[1], k[3]) for k in rec.seen]
    assert keys == sorted(keys)
    assert {k[0] for k in rec.seen} == set(pairs)
    assert any(len(k[7]) == 1 for k in rec.seen) and any(len(k[7]) > 1 for k in rec.seen)


def test_reversed_piece_lists_give_identical_segments() -> None:
    # Facts §4.6: a [3,3,2] column-split target vs the same map with each piece list reversed;
    # plus maps with several pieces per location, where reversal really reorders.
    for tgt in (contiguous_split_map((8, 8), [3, 3, 2], 1), _sub(3), _yuan(2), _bigcode(4)):
        src = replicate(contiguous_split_map(tgt.logical_shape, split(tgt.logical_shape[0], 2), 0), 2)
        rev = ParamAffineMap(tgt.logical_shape, tgt.shard_shapes,
                             {r: list(reversed(ps)) for r, ps in tgt.pieces_by_rank.items()})
        for policy in (first_holder, balanced):
            a = plan_transfer(tgt, src, replica_policy=policy)
            b = plan_transfer(rev, src, replica_policy=policy)
            assert a.segments == b.segments
            assert a.to_dict() == b.to_dict()


def test_selector_calls_do_not_depend_on_listing_order() -> None:
    tgt, src = _bigcode(4), replicate(_bigcode(2), 2)
    base_calls: list[Any] = []

    def base_sel(r: Any) -> int:
        base_calls.append((r.target_rank, r.logical_origin, r.shape, tuple(c.source_rank for c in r.candidates)))
        return r.candidates[-1].source_rank

    base = plan_transfer(tgt, src, replica_selector=base_sel).to_dict()
    rng = random.Random(7)
    for _ in range(3):
        calls: list[Any] = []

        def sel(r: Any, calls: list[Any] = calls) -> int:
            calls.append((r.target_rank, r.logical_origin, r.shape, tuple(c.source_rank for c in r.candidates)))
            return r.candidates[-1].source_rank

        got = plan_transfer(shuffled_map(tgt, rng), shuffled_map(src, rng), replica_selector=sel).to_dict()
        assert got == base
        assert calls == base_calls


_BASELINES: dict[tuple[str, bool], str] = {}


def _baseline(policy: str, with_endpoints: bool) -> str:
    key = (policy, with_endpoints)
    if key not in _BASELINES:
        pairs = batch()
        ep = endpoints_for(pairs) if with_endpoints else None
        _BASELINES[key] = plan_json(plan_transfers(pairs, endpoints=ep, replica_policy=POLICIES[policy]))
    return _BASELINES[key]


@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    policy=st.sampled_from(sorted(POLICIES)),
    with_endpoints=st.booleans(),
)
def test_random_shuffles_give_identical_plans(seed: int, policy: str, with_endpoints: bool) -> None:
    pairs = batch()
    ep = endpoints_for(pairs) if with_endpoints else None
    s_pairs, s_ep = shuffled(pairs, ep, random.Random(seed))
    got = plan_json(plan_transfers(s_pairs, endpoints=s_ep, replica_policy=POLICIES[policy]))
    assert got == _baseline(policy, with_endpoints)
