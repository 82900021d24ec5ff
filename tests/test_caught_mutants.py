"""Checks for hand-made bugs that once passed the whole suite (issue 17, item 10).

Each test below was written against a deliberately broken copy of the library and fails on it;
the bug each one kills is named in its docstring. The fourth bug of the set, coalescing that
checks only the source shard's row bounds, is killed by
``tests/test_golden.py::test_coalescing_checks_the_target_shard_too`` and by the "every segment
is a box in both shards" assertion that the golden and property tests now make.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from refplan import TransferEndpoints, contiguous_split_map, replicated_map
from refplan.check import check_answers
from refplan.errors import InvalidReplicaPolicyError
from refplan.execute import TransferRejectedError, execute_transfer
from refplan.planner import plan_transfer
from refplan.policies import balanced
from refplan.requests import ReplicaCandidate, ReplicaPart, ReplicaRequest

# ---------------------------------------------------------------------------------------------
# balanced: largest first (LPT), not request order.


def test_balanced_places_the_largest_movable_request_first() -> None:
    """Bug killed: ``balanced`` assigning movable requests in request order.

    F (4,) is replicated on two source locations; the target cuts it into 1, 1 and 2 elements,
    so the three requests (in request order) move 1, 1 and 2 elements and each has both holders.
    In request order the least-loaded rule gives 1 → A, 1 → B, 2 → A: 3 on the busiest sender.
    Largest first gives 2 → A, 1 → B, 1 → B: 2, the optimum.
    """
    source = replicated_map((4,), 2)
    target = contiguous_split_map((4,), [1, 1, 2], 0)
    plan = plan_transfer(target, source, replica_policy=balanced)
    assert [s.numel for s in sorted(plan.segments, key=lambda s: s.target_rank)] == [1, 1, 2]
    per_sender: dict[int, int] = {}
    for seg in plan.segments:
        per_sender[seg.source_rank] = per_sender.get(seg.source_rank, 0) + seg.numel
    assert sorted(per_sender.values()) == [2, 2], per_sender


# ---------------------------------------------------------------------------------------------
# Executor: two target buffers sharing bytes are refused (not only source/target aliasing).


def _two_location_plan() -> tuple[Any, TransferEndpoints]:
    source = contiguous_split_map((4, 4), [2, 2], 0)
    target = contiguous_split_map((4, 4), [2, 2], 1)
    endpoints = TransferEndpoints({0: 0, 1: 0}, {0: 0, 1: 0})
    return plan_transfer(target, source, endpoints=endpoints), endpoints


def test_executor_refuses_target_buffers_that_overlap_each_other() -> None:
    """Bug killed: the executor without its target/target storage-overlap refusal.

    Targets 0 and 1 are views of one allocation that share four elements. Both would be written,
    so one location's data would silently overwrite the other's. The refusal must come before
    any byte is written. Disjoint views of the same allocation stay accepted.
    """
    plan, endpoints = _two_location_plan()
    sources = {0: torch.arange(8.0), 1: torch.arange(8.0, 16.0)}
    whole = torch.full((12,), -1.0)
    targets = {0: whole[0:8], 1: whole[4:12]}
    with pytest.raises(TransferRejectedError, match="target buffers overlap in memory"):
        execute_transfer(plan, sources, targets, endpoints, dtype=torch.float32)
    assert torch.equal(whole, torch.full((12,), -1.0)), "a refused transfer must write nothing"

    apart = torch.full((16,), -1.0)
    execute_transfer(plan, sources, {0: apart[0:8], 1: apart[8:16]}, endpoints, dtype=torch.float32)
    full = torch.arange(16.0).view(4, 4)
    assert torch.equal(apart[0:8].view(4, 2), full[:, :2])
    assert torch.equal(apart[8:16].view(4, 2), full[:, 2:])


# ---------------------------------------------------------------------------------------------
# check_answers: a bool is not an int, in a split part's origin or shape either.


def _request() -> ReplicaRequest:
    strides = (3, 1)
    candidates = (ReplicaCandidate(3, 0, strides), ReplicaCandidate(5, 0, strides))
    return ReplicaRequest("w", 0, None, (0, 0), (2, 3), 0, strides, candidates, (None, None), None)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (ReplicaPart((False, 0), (1, 3), 3), ReplicaPart((1, 0), (1, 3), 5)),  # origin
        (ReplicaPart((0, 0), (1, 3), 3), ReplicaPart((True, 0), (1, 3), 5)),  # origin, == 1
        (ReplicaPart((0, 0), (True, 3), 3), ReplicaPart((1, 0), (1, 3), 5)),  # shape, == 1
    ],
    ids=["origin_false", "origin_true", "shape_true"],
)
def test_a_bool_in_a_split_part_is_refused(first: ReplicaPart, second: ReplicaPart) -> None:
    """Bug killed: ``isinstance(v, int)`` instead of ``type(v) is int`` for part coordinates.

    The spec (``spec/requests-and-answers.md``) requires real ints. Each split here would tile the
    request exactly if ``False``/``True`` were read as 0/1, so only the type check refuses it.
    """
    request = _request()
    honest = [ReplicaPart(tuple(int(v) for v in p.logical_origin), tuple(int(v) for v in p.shape),
                          p.source_location) for p in (first, second)]
    assert len(check_answers([request], [honest], min_split_bytes=1)[0]) == 2  # the int form is fine
    with pytest.raises(InvalidReplicaPolicyError, match="origin and shape must be sequences of int"):
        check_answers([request], [[first, second]], min_split_bytes=1)
