"""Plan dict form, the canonical encoding that ``max_plan_bytes`` measures, and coalescing."""

from __future__ import annotations

import pytest

from refplan import InvalidMapError, PlanBudget, TransferPlan, TransferSegment
from refplan.maps import contiguous_split_map, replicate, segmented_map
from refplan.plan import coalesce, encode_plan, make_segment
from refplan.planner import plan_transfer
from refplan.policies import first_holder


@pytest.mark.parametrize(
    "pair",
    [
        (contiguous_split_map((8, 8), [2, 2, 2, 2], 1), contiguous_split_map((8, 8), [4, 4], 0)),
        (segmented_map((48, 8), [(32, False), (16, True)], 0, 4, [[8, 8, 8, 8]]),
         segmented_map((48, 8), [(32, False), (16, True)], 0, 2, [[16, 16]])),
        (contiguous_split_map((5,), [5], 0),
         replicate(contiguous_split_map((5,), [2, 3], 0), 2)),
    ],
)
def test_fast_encoding_equals_the_generic_encoder_and_round_trips(pair: tuple[object, object]) -> None:
    target, source = pair
    plan = plan_transfer(target, source, replica_policy=first_holder)  # type: ignore[arg-type]
    assert plan.encode() == encode_plan(plan.to_dict())
    assert plan.statistics.plan_bytes == len(plan.encode())
    again = TransferPlan.from_dict(plan.to_dict())
    assert again.segments == plan.segments and again.moved_elements == plan.moved_elements
    seg = plan.segments[0]
    assert TransferSegment.from_dict(seg.to_dict()) == seg
    assert "logical_origin" not in seg.to_dict()


def test_segment_dicts_are_deepspeed_shaped_and_checked() -> None:
    seg = TransferSegment(0, 64, (8, 1), 1, 0, (8, 1), (24, 8))
    assert seg.to_dict() == {"shape": [24, 8], "source": [0, 64, [8, 1]], "target": [1, 0, [8, 1]]}
    with pytest.raises(InvalidMapError, match="source"):
        TransferSegment.from_dict({"shape": [1], "source": [0, True, [1]], "target": [0, 0, [1]]})
    with pytest.raises(InvalidMapError, match="logical_shape"):
        TransferPlan.from_dict({"logical_shape": "x", "segments": []})


def test_coalesce_folds_physically_contiguous_runs_in_any_input_order() -> None:
    # Eight one-row segments of a (8,4) shard copied to the same rows of a (8,4) target shard.
    rows = [TransferSegment(0, 4 * i, (4, 1), 0, 4 * i, (4, 1), (1, 4)) for i in range(8)]
    merged, checks = coalesce(list(reversed(rows)), {0: (8, 4)}, {0: (8, 4)}, PlanBudget())
    assert merged == [TransferSegment(0, 0, (4, 1), 0, 0, (4, 1), (8, 4))]
    assert checks > 0
    with pytest.raises(Exception, match="max_merge_checks"):
        coalesce(rows, {0: (8, 4)}, {0: (8, 4)}, PlanBudget(max_merge_checks=3))


def test_coalesce_never_wraps_a_segment_across_shard_rows() -> None:
    # Two (1,2) halves of row 0 are adjacent in memory with row 1's first half... only within a row.
    a = TransferSegment(0, 2, (4, 1), 0, 2, (4, 1), (1, 2))  # row 0, cols 2-3
    b = TransferSegment(0, 4, (4, 1), 0, 4, (4, 1), (1, 2))  # row 1, cols 0-1: contiguous in memory
    merged, _ = coalesce([a, b], {0: (2, 4)}, {0: (2, 4)}, PlanBudget())
    assert merged == [a, b], "a merge across a row boundary would not be a box in the shard"


def test_fast_constructors_build_ordinary_equal_instances() -> None:
    """``make_segment`` and ``requests._make_request`` fill the instance dictionary directly; they
    must set exactly the dataclass's fields (a field added later and forgotten there fails here)."""
    import dataclasses

    from refplan.requests import ReplicaCandidate, ReplicaRequest, _make_request

    args = (1, 40, (8, 1), 2, 16, (4, 1), (2, 4))
    fast = make_segment(*args)
    assert fast == TransferSegment(*args) and hash(fast) == hash(TransferSegment(*args))
    assert list(vars(fast)) == [f.name for f in dataclasses.fields(TransferSegment)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.shape = (1, 1)  # type: ignore[misc]
    fields = ("w", 0, 3, (0, 0), (2, 4), 0, (4, 1), (ReplicaCandidate(1, 40, (8, 1)),), (5,), 16, (0,), 1)
    request = _make_request(*fields)
    assert request == ReplicaRequest(*fields)
    assert list(vars(request)) == [f.name for f in dataclasses.fields(ReplicaRequest)]

