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


def held_in_pieces(location: int, n: int) -> ParamAffineMap:
    """All of an n-element F held at one location as n one-element pieces: more pieces than
    ``oracle.small.read_map`` reads (``SMALL_PIECES``), so the oracle validates it on its general
    path, whose own R3a test must let the bounds through."""
    return ParamAffineMap.from_dict({"logical_shape": [n], "ranks": {str(location): {"shard_shape": [n], "pieces": [
        {"shape": [1], "source": [i, [1]], "dest": [i, [1]], "locations": [location]} for i in range(n)]}}})


@pytest.mark.parametrize("location", [CAP, -CAP, CAP + 1, -CAP - 1])
def test_the_oracle_s_general_validation_takes_the_bounds_and_refuses_past_them(location: int) -> None:
    from refplan.oracle import small

    n = small.SMALL_PIECES + 1
    source, target = held_in_pieces(location, n), contiguous_split_map((n,), [n], 0)
    assert small.read_map(source) is None  # the general path decides
    verdict = verify_plan(target, source, one_by_one(location, n))
    if abs(location) <= CAP:
        assert verdict.ok, verdict
    else:
        assert verdict.map_error == (
            f"InvalidMapError: source map, location {location}: location id {location} is above 2**62 in magnitude"
        )


def test_a_map_with_no_location_is_refused_for_its_cover_not_its_ids() -> None:
    """No location at all: the bound on ids holds vacuously (``small.read_map`` takes the largest id
    of none as 0), and the map is refused for what it does not cover, on either side."""
    empty, whole = ParamAffineMap((4,), {}, {}), contiguous_split_map((4,), [4], 0)
    as_source = verify_plan(whole, empty, [])
    as_target = verify_plan(empty, whole, [])
    assert as_source.map_error == (
        "InvalidMapError: source map: source pieces cover 0 of the 4 elements of F; [0:4] is held by nobody"
    )
    assert as_target.map_error == (
        "InvalidMapError: target map: target pieces do not cover F; [0:4] is held by no target location"
    )
