"""Property suite: random maps and answers held against the oracle and the element simulator.

Three judges take part and none of them trusts another: the planner (with ``check_answers``),
the oracle ``verify_plan`` (boxes only, shares no logic with the planner) and the simulator
``simulate_transfer`` (executes every element on marker data). The strategies are the public ones
of ``refplan.strategies``, so another project can run the same properties against its planner.

The tests whose names contain ``core`` are the core properties; ``make nightly`` also runs them
under the ``crosshair`` hypothesis profile (a solver-backed backend, 10–100× slower per example).
Example counts come only from the profiles in ``conftest.py``; deadlines are off.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Reached, assert_segments_are_boxes, examples
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st

from refplan import InvalidReplicaPolicyError, PlanBudget, ReplicaSelectionRequest, check
from refplan import strategies as rst
from refplan.box import Box, volume
from refplan.limits import fast_paths
from refplan.maps import (
    LAYOUTS,
    ParamAffineMap,
)
from refplan.planner import plan_transfer, plan_transfers
from refplan.policies import balanced, first_holder, from_selector
from refplan.requests import ReplicaPart, ReplicaPolicy, ReplicaRequest, TransferEndpoints
from refplan.simulate import simulate_transfer
from refplan.verify import verify_plan

# ---------------------------------------------------------------------------------------------
# Helpers


def _points(box: Box) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(o, o + e) for o, e in zip(box.origin, box.extent))))


def _assert_tiles(box: Box, parts: list[Box]) -> None:
    """Element-by-element: every point of ``box`` in exactly one part, no part point outside."""
    count: dict[tuple[int, ...], int] = {}
    for part in parts:
        assert not part.is_empty(), part
        for point in _points(part):
            count[point] = count.get(point, 0) + 1
    assert set(count) == set(_points(box)), f"{parts} do not cover exactly {box}"
    assert all(v == 1 for v in count.values()), f"{parts} overlap"


def _target_bytes(report: Any) -> dict[int, bytes]:
    return {rank: np.ascontiguousarray(a).tobytes() for rank, a in sorted(report.result.targets.items())}


# ---------------------------------------------------------------------------------------------
# The strategies themselves


def test_pinwheel_is_a_non_guillotine_tiling() -> None:
    box = Box((1, 2, 0), (5, 4, 2))
    for flip_a, flip_b in itertools.product([False, True], repeat=2):
        parts = rst.pinwheel(box, (0, 1), (1, 3, 1, 2), (flip_a, flip_b))
        _assert_tiles(box, parts)
        for axis in range(2):  # no straight cut across axis 0 or 1 separates the parts
            for at in range(box.origin[axis] + 1, box.origin[axis] + box.extent[axis]):
                assert any(p.origin[axis] < at < p.origin[axis] + p.extent[axis] for p in parts)


@given(data=st.data())
def test_box_partitions_tile_their_box(data: st.DataObject) -> None:
    shape = data.draw(rst.logical_shapes(max_elements=256))
    origin = tuple(data.draw(st.integers(-3, 3)) for _ in shape)
    box = Box(origin, shape)
    parts = data.draw(rst.box_partitions(box, max_parts=10))
    assert 1 <= len(parts) <= 10
    _assert_tiles(box, parts)


# ---------------------------------------------------------------------------------------------
# Theorem 3


@given(data=st.data())
def test_core_theorem3_every_valid_answer_copies_identical_bytes(data: st.DataObject) -> None:
    """Theorem 3 (``proofs/theorem3.md``; RFC #8935, agreed by @Achyuthan-S and @0z5a).

    If every part of every answer is served by a validated holder of its request's region and
    the parts of each answer tile the request's box, every target address receives exactly one
    copy of its logical element, so (replicas agreeing) the target bytes are the same whichever
    holders serve and however requests are split. Here: a random sync of 1–3 parameters (replicas
    on both sides, target replicas cut at different boundaries), optional endpoints, nodes and
    element sizes, a split floor, two independent random valid answers plus the built-in
    policies. Every plan must be ``ok`` for the oracle and ``exact`` for the simulator, and every
    plan's target shards must be byte-identical.
    """
    pairs = data.draw(rst.map_batches(max_parts=data.draw(st.sampled_from([6, 40]), label="max_parts")), label="sync")
    targets = [t for t, _ in pairs.values()]
    sources = [s for _, s in pairs.values()]
    bound: TransferEndpoints | None = None
    nodes: dict[int, int] | None = None
    if data.draw(st.booleans(), label="with endpoints"):
        bound = data.draw(rst.endpoints(sources, targets), label="endpoints")
        nodes = data.draw(st.none() | rst.process_nodes(bound), label="process_node")
    sizes = data.draw(st.none() | st.fixed_dictionaries({n: st.sampled_from([1, 2, 4]) for n in pairs}), label="sizes")
    floor = data.draw(st.sampled_from([1, 2, 8]), label="min_split_bytes")
    requests = rst.collect_batch_requests(pairs, endpoints=bound, element_size=sizes, process_node=nodes)
    policies: list[ReplicaPolicy] = [
        rst.replaying(data.draw(rst.valid_answers(requests, min_split_bytes=floor), label="answers 1")),
        rst.replaying(data.draw(rst.valid_answers(requests, min_split_bytes=floor), label="answers 2")),
        balanced,
        first_holder,
    ]
    reference: dict[str, dict[int, bytes]] | None = None
    for policy in policies:
        plans = plan_transfers(
            pairs, replica_policy=policy, endpoints=bound, element_size=sizes, process_node=nodes,
            min_split_bytes=floor,
        )
        assert sorted(plans) == sorted(pairs)
        got: dict[str, dict[int, bytes]] = {}
        for name, plan in plans.items():
            target, source = pairs[name]
            verdict = verify_plan(target, source, plan, parameter=name)
            assert verdict.status == "ok", str(verdict)
            # refplan's own segments are boxes in both shards: the oracle needs no element fallback.
            assert verdict.fallback_elements == 0, str(verdict)
            assert_segments_are_boxes(plan, target, source)
            report = simulate_transfer(target, source, plan)
            assert report.exact, f"{name}: {report.first_mismatch}"
            assert plan.moved_elements == sum(r.elements for r in requests if r.parameter == name)
            got[name] = _target_bytes(report)
        if reference is None:
            reference = got
        assert got == reference, "two valid answers produced different target bytes"


@given(data=st.data())
def test_core_split_floor_and_part_budget_are_enforced(data: st.DataObject) -> None:
    """The RFC's other two answer checks: a split part below ``min_split_bytes`` and a split of
    more parts than ``max_parts_per_request`` are refused; at the limits they are accepted."""
    target, source = data.draw(rst.map_pairs(), label="maps")
    requests = rst.collect_requests(target, source)
    answers = data.draw(rst.valid_answers(requests), label="answers")
    splits = [a for a in answers if not isinstance(a, int) and len(a) >= 2]
    smallest = min((volume(p.shape) for a in splits for p in a), default=None)
    most = max((len(a) for a in answers if not isinstance(a, int)), default=1)
    policy = rst.replaying(answers)
    if smallest is not None:
        plan_transfer(target, source, replica_policy=policy, min_split_bytes=smallest)
        with pytest.raises(InvalidReplicaPolicyError, match="below min_split_bytes"):
            plan_transfer(target, source, replica_policy=policy, min_split_bytes=smallest + 1)
    at_limit = PlanBudget(max_parts_per_request=most)
    plan_transfer(target, source, replica_policy=policy, min_split_bytes=1, limits=at_limit)
    if most >= 2:
        with pytest.raises(InvalidReplicaPolicyError, match="max_parts_per_request"):
            plan_transfer(
                target, source, replica_policy=policy, min_split_bytes=1,
                limits=PlanBudget(max_parts_per_request=most - 1),
            )


# ---------------------------------------------------------------------------------------------
# Adversarial answers

_REFUSAL = {
    "wrong_location": r"not one of its validated holders",
    "other_request_location": r"not one of its validated holders",
    "bool_location": r"neither an int location nor a sequence",
    "float_location": r"neither an int location nor a sequence",
    "numpy_location": r"neither an int location nor a sequence",
    "part_bool_location": r"is not an int location",
    "part_not_candidate": r"not one of its validated holders",
    "gap": r"gap or overlap",
    "overlap": r"parts \d+ and \d+ overlap",
    "outside": r"lies outside the request's box",
    "zero_extent": r"zero or negative extent",
    "wrong_ndim": r"axes, the box has",
    "not_a_part": r"not a ReplicaPart",
    "empty_split": r"empty split",
    "too_few": r"exactly one answer per request",
    "too_many": r"exactly one answer per request",
    "not_a_sequence": r"expected a sequence",
}


def test_every_adversarial_kind_has_an_expected_refusal() -> None:
    assert set(_REFUSAL) == set(rst.ADVERSARIAL_KINDS)


_SPLIT_KINDS = {"gap", "overlap", "outside", "zero_extent", "part_not_candidate", "part_bool_location"}


def _split_violations(request: ReplicaRequest, answer: Any) -> set[str]:
    """Which of the split conditions a well-formed split breaks, judged independently of the checker."""
    box = request.box
    broken: set[str] = set()
    boxes: list[Box] = []
    for part in answer:
        assert isinstance(part, ReplicaPart) and len(part.shape) == len(part.logical_origin) == box.ndim
        if type(part.source_location) is not int:
            broken.add("location type")
        elif part.source_location not in request.locations:
            broken.add("holder")
        if any(e <= 0 for e in part.shape):
            broken.add("positive extent")
            continue
        boxes.append(part.box)
        if not box.contains(part.box):
            broken.add("inside")
    if sum(b.volume for b in boxes) != box.volume:
        broken.add("volume")
    if any(p.overlaps(q) for i, p in enumerate(boxes) for q in boxes[i + 1 :]):
        broken.add("disjoint")
    return broken


def _assert_refused(kind: str, data: st.DataObject) -> None:
    target, source = data.draw(rst.map_pairs(), label="maps")
    requests = rst.collect_requests(target, source)
    bad = data.draw(rst.adversarial_answers(requests, kinds=[kind]), label="answers")
    note(f"{bad.kind} at answer {bad.index}: {bad.note}")
    if bad.kind in _SPLIT_KINDS:
        assert bad.index is not None
        broken = _split_violations(requests[bad.index], bad.answers[bad.index])
        assert len(broken) == 1, f"{bad.kind} should break exactly one check, breaks {sorted(broken)}"
    try:
        plan = plan_transfer(target, source, replica_policy=rst.replaying(bad.answers), min_split_bytes=1)
    except InvalidReplicaPolicyError as exc:
        assert re.search(_REFUSAL[bad.kind], str(exc)), f"{bad.note}: refused, but for {exc}"
    else:
        raise AssertionError(f"{bad.kind} ({bad.note}) was accepted and planned as {plan}")


@pytest.mark.parametrize("kind", rst.ADVERSARIAL_KINDS)
@given(data=st.data())
def test_core_adversarial_answers_are_refused(kind: str, data: st.DataObject) -> None:
    """Each adversarial answer list breaks exactly one check: the planner must refuse it with
    ``InvalidReplicaPolicyError`` for that check's reason, and return no plan."""
    _assert_refused(kind, data)


def test_the_adversarial_property_finds_a_checker_without_its_disjointness_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Non-vacuity: with the disjointness test of ``check_answers`` planted away (the pairwise
    loop, off under ``fast_paths(False)``, and the ``first_overlap`` query that decides for more
    parts), the ``overlap`` property fails at once."""
    monkeypatch.setattr(check, "first_overlap", lambda *_args, **_kwargs: None)

    @settings(phases=[Phase.generate], database=None)  # a failure is all we need: skip shrinking
    @given(data=st.data())
    def planted(data: st.DataObject) -> None:
        _assert_refused("overlap", data)

    with fast_paths(False), pytest.raises(AssertionError, match=r"overlap .* was accepted"):
        planted()


# ---------------------------------------------------------------------------------------------
# Oracle against simulator


def test_core_oracle_agrees_with_the_simulator() -> None:
    """``verify_plan`` ok ⇔ ``simulate_transfer`` exact, on valid and corrupted plans.

    Every example judges the valid plan (the oracle must say ``ok``, never ``unverifiable``: these
    plans are far inside its fallback budget) and, when it has a segment, one corrupted copy of
    it: ``invalid`` with a reason exactly when the simulator finds it wrong. The dict forms of
    maps and plan must get the same verdict. How many examples judged a corrupted plan is
    counted and asserted, so the property cannot pass on valid plans alone.
    """
    reached = Reached()

    @given(data=st.data())
    def agree(data: st.DataObject) -> None:
        max_parts = data.draw(st.sampled_from([6, 40]), label="max_parts")
        target, source = data.draw(rst.map_pairs(max_parts=max_parts), label="maps")
        requests = rst.collect_requests(target, source)
        answers = data.draw(rst.valid_answers(requests), label="answers")
        plan = plan_transfer(target, source, replica_policy=rst.replaying(answers), min_split_bytes=1)
        candidates = [(plan, "none")]
        if plan.segments:
            corrupted = data.draw(rst.corrupted_plans(plan, source, target), label="corruption")
            note(corrupted.note)
            candidates.append((corrupted.plan, corrupted.kind))
        for judged, kind in candidates:
            verdict = verify_plan(target, source, judged)
            report = simulate_transfer(target, source, judged)
            if report.exact:
                assert verdict.status == "ok", f"{kind}: simulator exact, oracle says {verdict}"
            else:
                assert verdict.status == "invalid", (
                    f"{kind}: simulator saw {report.first_mismatch}, oracle says {verdict}"
                )
                assert verdict.reason
                reached.hit("corrupted plan caught")
            if kind == "none":
                assert report.exact and verdict.fallback_elements == 0, str(verdict)
                reached.hit("valid plan")
            else:
                reached.hit("corrupted plan judged")
            as_dicts = verify_plan(target.to_dict(), source.to_dict(), judged.to_dict())
            assert as_dicts.status == verdict.status

    agree()
    # Bounds with slack for the other profiles (a backend may discard or stop early); under the
    # derandomized ``ci`` profile every one of the 30 examples judges a valid and a corrupted plan.
    reached.at_least("valid plan", max(1, examples() // 2))
    reached.at_least("corrupted plan judged", max(1, examples() // 3))
    reached.at_least("corrupted plan caught", 1)


# ---------------------------------------------------------------------------------------------
# Layout families (facts §4.6), every degree pair, every built-in policy


FAMILIES: dict[str, Callable[[int], ParamAffineMap]] = LAYOUTS
DEGREES = (1, 2, 3, 4, 8)


def _selector(request: ReplicaSelectionRequest) -> int:
    return request.candidates[request.target_rank % len(request.candidates)].source_rank


POLICIES: dict[str, ReplicaPolicy] = {
    "first_holder": first_holder,
    "balanced": balanced,
    "from_selector": from_selector(_selector),
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize(("source_degree", "target_degree"), list(itertools.product(DEGREES, DEGREES)))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layout_families_every_degree_pair(family: str, source_degree: int, target_degree: int, policy: str) -> None:
    target = FAMILIES[family](target_degree)
    source = FAMILIES[family](source_degree)
    plan = plan_transfer(target, source, replica_policy=POLICIES[policy])
    verdict = verify_plan(target, source, plan)
    assert verdict.status == "ok", str(verdict)
    assert verdict.fallback_elements == 0, str(verdict)
    assert_segments_are_boxes(plan, target, source)
    report = simulate_transfer(target, source, plan)
    assert report.exact, report.first_mismatch
    assert plan.moved_elements == sum(
        p.numel for ps in target.pieces_by_rank.values() for p in ps
    )
