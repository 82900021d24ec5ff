"""R3a: location ids are at most 2**62 in magnitude, on every path of the planner and the oracle.

A map whose location id did not fit int64 was planned on the small paths and judged by the
oracle's quick path, while the general paths built their location columns as int64 and failed
with a bare ``OverflowError`` from inside (``regions.intersections``, ``check_plan``): whether a
call answered or crashed depended on the map's size. Now both refuse such a map by the same rule,
whatever the path, and both take every id up to 2**62.
"""

from __future__ import annotations

import pytest

from refplan.errors import InvalidMapError
from refplan.limits import fast_paths
from refplan.maps import ParamAffineMap, contiguous_split_map
from refplan.plan import TransferPlan, TransferSegment
from refplan.planner import plan_transfers
from refplan.requests import TransferEndpoints
from refplan.verify import verify_plan

CAP = 2**62


def held_at(location: int, n: int) -> ParamAffineMap:
    """All of an n-element F held whole at one location."""
    return ParamAffineMap.from_dict({"logical_shape": [n], "ranks": {str(location): {"shard_shape": [n], "pieces": [
        {"shape": [n], "source": [0, [1]], "dest": [0, [1]], "locations": [location]}]}}})


def one_by_one(location: int, n: int) -> TransferPlan:
    """n one-element segments from ``location`` into location 0: past the oracle's quick path
    from 65 segments on."""
    return TransferPlan(tuple(TransferSegment(location, i, (1,), 0, i, (1,), (1,)) for i in range(n)), (n,), n)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-paths", "general-paths"])
@pytest.mark.parametrize("n", [4, 100])
@pytest.mark.parametrize("location", [CAP + 1, 2**63, 2**70, -CAP - 1, -(2**63) - 1])
def test_a_location_id_above_2_62_is_refused_by_planner_and_oracle_alike(location: int, n: int, fast: bool) -> None:
    source, target = held_at(location, n), contiguous_split_map((n,), [n], 0)
    text = f"location id {location} is above 2**62 in magnitude"
    with fast_paths(fast):
        with pytest.raises(InvalidMapError) as refused:
            plan_transfers({"w": (target, source)}, endpoints=TransferEndpoints({location: 0}, {0: 1}), element_size=2)
        verdict = verify_plan(target, source, one_by_one(location, n))
    assert str(refused.value) == f"parameter 'w', source map, location {location}: {text}"
    assert verdict.status == "invalid_map", verdict
    assert verdict.map_error == f"InvalidMapError: source map, location {location}: {text}", verdict


@pytest.mark.parametrize("fast", [True, False], ids=["fast-paths", "general-paths"])
@pytest.mark.parametrize("n", [4, 100])
@pytest.mark.parametrize("location", [CAP, -CAP])
def test_location_ids_up_to_2_62_are_planned_and_judged(location: int, n: int, fast: bool) -> None:
    source, target = held_at(location, n), contiguous_split_map((n,), [n], 0)
    with fast_paths(fast):
        plans = plan_transfers({"w": (target, source)}, endpoints=TransferEndpoints({location: 0}, {0: 1}),
                               element_size=2)
        assert verify_plan(target, source, plans["w"]).ok
        assert verify_plan(target, source, one_by_one(location, n)).ok
