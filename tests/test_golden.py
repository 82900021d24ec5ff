"""Golden plans (facts §4.6), each executed by the numpy harness of ``conftest``.

Every plan here is run into sentinel-filled target buffers with guard regions; the harness
asserts one write per target element, the target map's extract of the marker data, and
untouched guards. The 10⁹-row plan cannot be executed, so it is compared segment by segment
against the closed form that the executed 10-row plan also satisfies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from conftest import assert_executes_exactly, piece, pmap

from refplan.maps import (  # LAYOUTS: the §4.6 layouts the conformance suite uses
    LAYOUTS,
    ParamAffineMap,
    contiguous_split_map,
    replicate,
    replicated_map,
)
from refplan.plan import TransferSegment, encode_plan
from refplan.planner import plan_transfer, plan_transfers
from refplan.policies import balanced, first_holder
from refplan.requests import ReplicaPart, ReplicaRequest, ReplicaSelectionRequest, TransferEndpoints
from refplan.verify import verify_plan

bigcode = LAYOUTS["bigcode"]

POLICIES = {"first_holder": first_holder, "balanced": balanced}


def moved_by_source(plan: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for s in plan.segments:
        out[s.source_rank] = out.get(s.source_rank, 0) + s.numel
    return out


# ---------------------------------------------------------------------------------------------
# Hand-derived worked example.


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_hand_derived_row2_to_col4(policy: str) -> None:
    src = contiguous_split_map((8, 8), [4, 4], 0)
    tgt = contiguous_split_map((8, 8), [2, 2, 2, 2], 1)
    plan = plan_transfer(tgt, src, replica_policy=POLICIES[policy])
    expected = tuple(
        TransferSegment(a, 2 * b, (8, 1), b, 8 * a, (2, 1), (4, 2)) for b in range(4) for a in range(2)
    )
    assert plan.segments == expected
    assert plan.moved_elements == 64
    stats = plan.statistics
    assert (stats.source_pieces, stats.target_pieces) == (2, 4)
    assert (stats.segments_before_merge, stats.segments) == (8, 8)
    assert (stats.requests, stats.split_requests) == (8, 0)
    assert stats.plan_bytes == len(encode_plan(plan.to_dict()))
    assert plan.to_dict()["logical_shape"] == [8, 8]
    assert all("logical_origin" not in seg for seg in plan.to_dict()["segments"])
    assert_executes_exactly(plan, tgt, src)

    def never(_request: ReplicaSelectionRequest) -> int:
        raise AssertionError("the selector is only called for requests with more than one holder")

    assert plan_transfer(tgt, src, replica_selector=never).segments == expected


# ---------------------------------------------------------------------------------------------
# bigcode (q rows split, kv rows replicated) 2 -> 4.


def test_bigcode_first_holder() -> None:
    src, tgt = bigcode(2), bigcode(4)
    plan = plan_transfer(tgt, src, replica_policy=first_holder)
    assert len(plan.segments) == 7
    assert plan.moved_elements == 768
    pair = [s for s in plan.segments if (s.source_rank, s.target_rank) == (0, 1)]
    assert pair == [TransferSegment(0, 64, (8, 1), 1, 0, (8, 1), (24, 8))]
    assert moved_by_source(plan) == {0: 640, 1: 128}
    assert plan.statistics.segments_before_merge == 8
    assert_executes_exactly(plan, tgt, src)
    # The one-parameter entry is the batch entry with a single parameter named "param".
    batch = plan_transfers({"param": (tgt, src)}, replica_policy=first_holder)
    assert list(batch) == ["param"] and batch["param"].to_dict() == plan.to_dict()


def test_bigcode_default_policy_is_balanced() -> None:
    src, tgt = bigcode(2), bigcode(4)
    default = plan_transfer(tgt, src)
    assert default.to_dict() == plan_transfer(tgt, src, replica_policy=balanced).to_dict()
    # Balanced spreads the replicated kv rows: no source moves more than first_holder's 640.
    load = moved_by_source(default)
    assert sum(load.values()) == 768 and max(load.values()) < 640
    assert_executes_exactly(default, tgt, src)


def test_bigcode_selector_target_rank_half() -> None:
    src, tgt = bigcode(2), bigcode(4)
    calls: list[ReplicaSelectionRequest] = []

    def selector(request: ReplicaSelectionRequest) -> int:
        calls.append(request)
        return request.target_rank // 2

    plan = plan_transfer(tgt, src, replica_selector=selector)
    assert len(calls) == 4
    assert sorted(c.target_rank for c in calls) == [0, 1, 2, 3]
    for c in calls:
        assert tuple(c.logical_origin) == (32, 0)
        assert tuple(c.shape) == (16, 8)
        assert [k.source_rank for k in c.candidates] == [0, 1]
        # kv sits after each location's 16 q rows, in both source and target shards.
        assert [k.source_offset for k in c.candidates] == [128, 128]
        assert all(tuple(k.source_strides) == (8, 1) for k in c.candidates)
        assert (c.target_offset, tuple(c.target_strides)) == (64, (8, 1))
    assert len(plan.segments) == 6
    assert moved_by_source(plan) == {0: 384, 1: 384}
    assert_executes_exactly(plan, tgt, src)


def test_bigcode_selector_max_candidate() -> None:
    src, tgt = bigcode(2), bigcode(4)
    plan = plan_transfer(tgt, src, replica_selector=lambda r: max(c.source_rank for c in r.candidates))
    assert len(plan.segments) == 7
    assert moved_by_source(plan) == {0: 128, 1: 640}
    assert_executes_exactly(plan, tgt, src)


def test_selector_uses_the_chosen_holders_addresses() -> None:
    # Both locations hold all of (4,2); location 1 stores the two row pairs swapped.
    rows01 = (0, (2, 1))
    rows23 = (4, (2, 1))
    src = pmap(
        (4, 2), {0: (4, 2), 1: (4, 2)},
        {
            0: [piece((2, 2), rows01[0], rows01[1], 0, (2, 1), [0, 1]),
                piece((2, 2), rows23[0], rows23[1], 4, (2, 1), [0, 1])],
            1: [piece((2, 2), rows01[0], rows01[1], 4, (2, 1), [0, 1]),
                piece((2, 2), rows23[0], rows23[1], 0, (2, 1), [0, 1])],
        },
    )
    tgt = replicated_map((4, 2), 1)
    plan = plan_transfer(tgt, src, replica_selector=lambda _r: 1)
    assert [(s.source_rank, s.source_offset, s.target_offset) for s in plan.segments] == [(1, 4, 0), (1, 0, 4)]
    assert_executes_exactly(plan, tgt, src)
    plan0 = plan_transfer(tgt, src, replica_selector=lambda _r: 0)
    assert [(s.source_rank, s.source_offset, s.target_offset) for s in plan0.segments] == [(0, 0, 0)]
    assert plan0.segments[0].shape == (4, 2)
    assert_executes_exactly(plan0, tgt, src)


# ---------------------------------------------------------------------------------------------
# Identity, location namespaces, scale-free size.


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_identity(policy: str) -> None:
    m = contiguous_split_map((6, 4), [3, 3], 0)
    plan = plan_transfer(m, m, replica_policy=POLICIES[policy])
    assert plan.moved_elements == 24
    assert {s.target_rank for s in plan.segments} == {0, 1}
    assert all(s.source_rank == s.target_rank for s in plan.segments)
    assert plan.segments == (
        TransferSegment(0, 0, (4, 1), 0, 0, (4, 1), (3, 4)),
        TransferSegment(1, 0, (4, 1), 1, 0, (4, 1), (3, 4)),
    )
    assert_executes_exactly(plan, m, m)


def test_location_namespaces() -> None:
    src = pmap(
        (4, 16), {3: (4, 8), 9: (4, 8)},
        {3: [piece((4, 8), 0, (16, 1), 0, (8, 1), [3])], 9: [piece((4, 8), 8, (16, 1), 0, (8, 1), [9])]},
    )
    tgt = replicated_map((4, 16), 1)
    plan = plan_transfer(tgt, src)
    assert {s.source_rank for s in plan.segments} == {3, 9}
    assert {s.target_rank for s in plan.segments} == {0}
    assert plan.moved_elements == 64
    assert plan.segments == (
        TransferSegment(3, 0, (8, 1), 0, 0, (16, 1), (4, 8)),
        TransferSegment(9, 0, (8, 1), 0, 8, (16, 1), (4, 8)),
    )
    assert_executes_exactly(plan, tgt, src)


def _row2_col4(rows: int) -> tuple[ParamAffineMap, ParamAffineMap, Any]:
    src = contiguous_split_map((rows, 8), [rows // 2] * 2, 0)
    tgt = contiguous_split_map((rows, 8), [2, 2, 2, 2], 1)
    return tgt, src, plan_transfer(tgt, src)


def _closed_form(rows: int) -> tuple[TransferSegment, ...]:
    half = rows // 2
    return tuple(
        TransferSegment(a, 2 * b, (8, 1), b, 2 * half * a, (2, 1), (half, 2)) for b in range(4) for a in range(2)
    )


def test_scale_free_size() -> None:
    tgt, src, small = _row2_col4(10)
    assert small.segments == _closed_form(10)
    assert_executes_exactly(small, tgt, src)
    _, _, big = _row2_col4(10**9)
    assert big.segments == _closed_form(10**9)
    assert big.moved_elements == 8 * 10**9
    assert (big.statistics.source_pieces, big.statistics.target_pieces) == (2, 4)
    assert big.statistics.pair_checks == small.statistics.pair_checks
    assert big.statistics.segments == small.statistics.segments == 8
    assert big.statistics.merge_checks == small.statistics.merge_checks


# ---------------------------------------------------------------------------------------------
# Executed-coverage suite: every layout, degrees {1,2,4}², both policies, plain and replicated.

DEGREES = [(s, t) for s in (1, 2, 4) for t in (1, 2, 4)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_executed_coverage(layout: str, policy: str) -> None:
    build = LAYOUTS[layout]
    for s, t in DEGREES:
        for copies in (1, 2):
            src = build(s) if copies == 1 else replicate(build(s), copies)
            tgt = build(t)
            plan = plan_transfer(tgt, src, replica_policy=POLICIES[policy])
            try:
                assert_executes_exactly(plan, tgt, src)
            except AssertionError as exc:
                raise AssertionError(f"{layout} {s}->{t} copies={copies} {policy}: {exc}") from exc


def test_executed_coverage_as_one_batch() -> None:
    # The same suite as one plan_transfers batch (balancing spans parameters), with endpoints.
    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    for layout, build in LAYOUTS.items():
        for s, t in DEGREES:
            pairs[f"{layout}.{s}to{t}"] = (build(t), replicate(build(s), 2))
    src_locs = {r for _, src in pairs.values() for r in src.shard_shapes}
    tgt_locs = {r for tgt, _ in pairs.values() for r in tgt.shard_shapes}
    endpoints = TransferEndpoints({r: r for r in src_locs}, {r: r for r in tgt_locs})
    plans = plan_transfers(pairs, endpoints=endpoints)
    assert sorted(plans) == sorted(pairs)
    for name, (tgt, src) in pairs.items():
        try:
            assert_executes_exactly(plans[name], tgt, src)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


def test_balanced_local_first_with_endpoints() -> None:
    # Source locations 0..3 are two copies of a 2-way row split (copy-major); the target is the
    # same 2-way split, bound to the processes of the *second* copy: every request has a local holder.
    src = replicate(contiguous_split_map((8, 8), [4, 4], 0), 2)
    tgt = contiguous_split_map((8, 8), [4, 4], 0)
    endpoints = TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3}, {0: 2, 1: 3})
    plan = plan_transfers({"w": (tgt, src)}, endpoints=endpoints)["w"]
    assert [(s.source_rank, s.target_rank) for s in plan.segments] == [(2, 0), (3, 1)]
    assert_executes_exactly(plan, tgt, src)


def _halves(requests: Sequence[ReplicaRequest]) -> list[Any]:
    """Split every multi-holder request into row halves served by its first two candidates."""
    out: list[Any] = []
    for r in requests:
        if len(r.candidates) < 2 or r.shape[0] < 2:
            out.append(r.candidates[0].source_rank)
            continue
        top = r.shape[0] // 2
        lo = tuple(r.logical_origin)
        hi = (lo[0] + top, *lo[1:])
        out.append([
            ReplicaPart(lo, (top, *r.shape[1:]), r.candidates[1].source_rank),
            ReplicaPart(hi, (r.shape[0] - top, *r.shape[1:]), r.candidates[0].source_rank),
        ])
    return out


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_split_answers_execute_exactly(layout: str) -> None:
    build = LAYOUTS[layout]
    for s, t in [(1, 2), (2, 4), (4, 2), (2, 2)]:
        src, tgt = replicate(build(s), 2), build(t)
        plan = plan_transfer(tgt, src, replica_policy=_halves, min_split_bytes=1)
        assert plan.statistics.split_requests > 0
        assert len({seg.source_rank for seg in plan.segments}) > 1
        try:
            assert_executes_exactly(plan, tgt, src)
        except AssertionError as exc:
            raise AssertionError(f"{layout} {s}->{t}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Segments stay boxes in *both* shards (Lemma M's guard on each side).


def _row_pair_to_block(m: int) -> tuple[ParamAffineMap, ParamAffineMap]:
    """F (2, m). Source: one location whose (1, 2m) shard holds F's rows side by side. Target: one
    (2, m) shard holding F as it is. The two row segments are adjacent in memory on both sides
    (source 0 then m, target 0 then m), so the offset arithmetic alone would merge them into one
    (1, 2m) segment: a box of the source shard, but in the target shard a run wrapping into row 1."""
    src = pmap((2, m), {0: (1, 2 * m)}, {0: [
        piece((1, m), 0, (m, 1), 0, (2 * m, 1), [0]),
        piece((1, m), m, (m, 1), m, (2 * m, 1), [0]),
    ]})
    tgt = pmap((2, m), {0: (2, m)}, {0: [piece((2, m), 0, (m, 1), 0, (m, 1), [0])]})
    return tgt, src


def test_coalescing_checks_the_target_shard_too() -> None:
    tgt, src = _row_pair_to_block(4)
    plan = plan_transfer(tgt, src)
    assert_executes_exactly(plan, tgt, src)  # includes: every segment is a box in both shards
    assert plan.segments == (
        TransferSegment(0, 0, (8, 1), 0, 0, (4, 1), (1, 4)),
        TransferSegment(0, 4, (8, 1), 0, 4, (4, 1), (1, 4)),
    )
    # At 80 000 elements a wrapped segment is beyond what the oracle expands element by element
    # (it would answer ``unverifiable``): refplan's own plans must never need that fallback.
    tgt, src = _row_pair_to_block(40_000)
    plan = plan_transfer(tgt, src)
    verdict = verify_plan(tgt, src, plan)
    assert (verdict.status, verdict.fallback_elements) == ("ok", 0), str(verdict)
    assert len(plan.segments) == 2
