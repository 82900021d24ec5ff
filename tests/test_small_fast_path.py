"""The small-map fast path (issue 27) plans exactly what the general path plans.

A distinct layout (every parameter's shape its own, so the batch memo never hits) costs the
planner its per-layout work: validating both maps, grouping, covering, intersecting, building
requests, coalescing. For small maps that work now takes pure-Python shortcuts
(``frames._small_normalize``, the separation shortcuts of ``regions``, the lone-segment shortcut
of ``plan.coalesce``, shared candidate offsets in ``requests``, holder sets keyed by locations in
``policies.simple``), and a layout whose maps are slabs along one axis skips frames, regions and
intersections altogether (``planner._slab_layout``, ``_slab_requests``, ``_lone_checks``; switch
``limits.SLAB_MAP_PIECES``). Each shortcut claims "same result, same work charged, same refusal", so:

- drawn layouts are planned with the fast path and with it forced off
  (``limits.SMALL_MAP_PIECES = -1``): the same plans (bytes and statistics) or the same error
  class and message, and the oracle judges both plans exact;
- every one-field change of a drawn map (``test_fast_paths._CHANGES``) and every budget is
  refused the same way by both;
- the fast-path functions are held to exact outputs (frames, work charged, bail-outs), so that
  a mutant of any of them is caught (they are in the planner core's mutation scope).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from math import prod
from typing import Any

import pytest
from conftest import Reached, examples, piece, pmap
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_paths import _CHANGES, _mutated

from refplan import limits, plan_transfers, verify_plans
from refplan.box import Box, WorkCounter
from refplan.errors import AffineTransferError, InvalidMapError, UnsupportedLayoutError
from refplan.frames import (
    MAX_COORDINATE,
    Frame,
    _apart,
    _small_geometry,
    _small_normalize,
    _small_shard,
    normalize,
)
from refplan.limits import PlanBudget
from refplan.maps import AffinePiece, MapContent, ParamAffineMap, contiguous_split_map, replicate
from refplan.plan import (
    PlanStatistics,
    TransferPlan,
    TransferSegment,
    _decode,
    _decodes,
    coalesce,
    encode_plan,
    encode_segments,
    make_plan,
    make_statistics,
)
from refplan.planner import _lone_checks, _slab_layout, _slab_requests, _slab_side, collect_requests
from refplan.policies import POLICIES
from refplan.policies.simple import _Units
from refplan.regions import check_target_cover, intersections, source_regions
from refplan.requests import ReplicaCandidate, TransferEndpoints, build_requests, holder_locations
from refplan.strategies import map_batches, param_maps

# ---------------------------------------------------------------------------------------------
# Both paths.


@contextmanager
def _general() -> Iterator[None]:
    """The general path only: no map is small enough for ``_small_normalize`` or for
    ``planner._slab_layout``."""
    saved = limits.SMALL_MAP_PIECES, limits.SLAB_MAP_PIECES
    limits.SMALL_MAP_PIECES = limits.SLAB_MAP_PIECES = -1
    try:
        yield
    finally:
        limits.SMALL_MAP_PIECES, limits.SLAB_MAP_PIECES = saved


@contextmanager
def _no_slabs() -> Iterator[None]:
    """Every path but ``planner._slab_layout`` (``_small_normalize`` included)."""
    saved = limits.SLAB_MAP_PIECES
    limits.SLAB_MAP_PIECES = -1
    try:
        yield
    finally:
        limits.SLAB_MAP_PIECES = saved


def _outcome(run: Callable[[], Any]) -> Any:
    try:
        return ("ok", run())
    except AffineTransferError as exc:
        return (type(exc).__name__, str(exc))


def _planned(batch: dict[str, tuple[ParamAffineMap, ParamAffineMap]], **kwargs: Any) -> Any:
    """Every plan as (bytes, statistics), or the refusal."""
    def run() -> Any:
        plans = plan_transfers(batch, **kwargs)
        return plans, {name: (plan.encode(), plan.statistics) for name, plan in plans.items()}
    return _outcome(run)


def _small_taken(batch: dict[str, tuple[ParamAffineMap, ParamAffineMap]]) -> bool:
    return any(
        _small_normalize(m, "source", name, PlanBudget()) is not None
        for name, pair in batch.items() for m in pair
    )


def test_drawn_layouts_are_planned_the_same_and_exactly_by_both_paths() -> None:
    """Batches of drawn layouts under every policy: the same plan bytes and statistics (or the same
    refusal) with the fast path and without it, and the oracle judges both plans exact. Counted:
    enough examples must plan with the fast path actually taken."""
    reached = Reached()

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(map_batches(max_parameters=3, max_holders=3), st.sampled_from(sorted(POLICIES)))
    def both(batch: dict[str, tuple[ParamAffineMap, ParamAffineMap]], policy: str) -> None:
        fast = _planned(batch, replica_policy=POLICIES[policy])
        with _general():
            slow = _planned(batch, replica_policy=POLICIES[policy])
        assert fast[0] == slow[0]
        assert (fast[1][1] if fast[0] == "ok" else fast[1]) == (slow[1][1] if slow[0] == "ok" else slow[1])
        if fast[0] != "ok":
            reached.hit("refused by both")
            return
        assert verify_plans(batch, fast[1][0]).status == "ok"
        assert verify_plans(batch, slow[1][0]).status == "ok"
        if _small_taken(batch):
            reached.hit("fast path planned, both judged exact")

    both()
    reached.at_least("fast path planned, both judged exact", max(1, examples() // 3))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(param_maps(max_holders=2), st.integers(0, len(_CHANGES) - 1), st.integers(0, 1000))
def test_every_change_to_a_drawn_map_is_decided_the_same_way(m: ParamAffineMap, change: int, pick: int) -> None:
    """Frames, work charged and every refusal (class and message) are the general path's."""
    m = _mutated(m, change, pick)

    def run() -> Any:
        work = WorkCounter()
        return normalize(m, "source", "w", work=work), work.count

    fast = _outcome(run)
    with _general():
        slow = _outcome(run)
    assert fast == slow


@pytest.mark.parametrize("change", range(len(_CHANGES)))
def test_every_change_to_a_replicated_split_is_planned_or_refused_the_same_way(change: int) -> None:
    source = _mutated(replicate(contiguous_split_map((8, 6), [4, 4], 0), 2), change, 1)
    target = contiguous_split_map((8, 6), [2, 3, 3], 0)
    for batch in ({"w": (target, source)}, {"w": (source, target)}):
        fast = _planned(batch)
        with _general():
            slow = _planned(batch)
        assert fast[0] == slow[0]
        assert (fast[1][1] if fast[0] == "ok" else fast[1]) == (slow[1][1] if slow[0] == "ok" else slow[1])
        assert (fast[0] == "ok") == (change == 0)


_BUDGETS = [
    {"max_pair_checks": k} for k in range(0, 16)
] + [
    {"max_pieces_per_map": 3}, {"max_pieces_per_map": 4}, {"max_ndim": 1}, {"max_ndim": 2},
    {"max_merge_checks": 5}, {"max_merge_checks": 6}, {"max_merge_passes": 0}, {"max_segments": 2},
    {"max_plan_bytes": 100},
]


@pytest.mark.parametrize("budget", _BUDGETS, ids=[str(b) for b in _BUDGETS])
def test_every_budget_is_refused_the_same_way(budget: dict[str, int]) -> None:
    batch = {"w": (contiguous_split_map((8, 6), [2, 3, 3], 0), replicate(contiguous_split_map((8, 6), [4, 4], 0), 2))}
    fast = _planned(batch, limits=PlanBudget(**budget))
    with _general():
        slow = _planned(batch, limits=PlanBudget(**budget))
    assert fast[0] == slow[0]
    assert (fast[1][1] if fast[0] == "ok" else fast[1]) == (slow[1][1] if slow[0] == "ok" else slow[1])


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_budget_only_one_counter_exceeds_is_refused_the_same_way(side: str) -> None:
    """Each counter alone decides: a source of 16 replicated pieces against a 2-way target (the
    source counter 20, the others 6), and an 8-way target of all of F (the target counter 24,
    the others at most 17), each under a budget of 18 that only that counter exceeds."""
    if side == "source":
        batch = {"w": (contiguous_split_map((8, 6), [4, 4], 0), replicate(contiguous_split_map((8, 6), [4, 4], 0), 8))}
    else:
        batch = {"w": (contiguous_split_map((8, 6), [1] * 8, 0), contiguous_split_map((8, 6), [8], 0))}
    assert _slab_layout(batch["w"][0], batch["w"][1], PlanBudget()) is not None  # the fast path's layout
    fast = _planned(batch, limits=PlanBudget(max_pair_checks=18))
    with _general():
        slow = _planned(batch, limits=PlanBudget(max_pair_checks=18))
    assert fast == slow and fast[0] == "AffineTransferError", (fast, slow)
    assert f"parameter 'w', {side} map: validation needs more than max_pair_checks=18" in fast[1], fast[1]


def test_the_budgets_above_cover_both_outcomes() -> None:
    """The pair-check budgets above straddle the layout's largest counter (each of a
    parameter's three counters is held to the budget alone): some refuse, some plan."""
    batch = {"w": (contiguous_split_map((8, 6), [2, 3, 3], 0), replicate(contiguous_split_map((8, 6), [4, 4], 0), 2))}
    assert plan_transfers(batch)["w"].statistics.pair_checks == 26
    outcomes = [_planned(batch, limits=PlanBudget(**b))[0] for b in _BUDGETS if "max_pair_checks" in b]
    assert outcomes[0] == "AffineTransferError" and outcomes[-1] == "ok"


# ---------------------------------------------------------------------------------------------
# frames: exact outputs.

_REPLICATED = replicate(contiguous_split_map((8, 6), [4, 4], 0), 2)  # locations 0, 2 | 1, 3


def test_small_normalize_of_a_replicated_split() -> None:
    out = _small_normalize(_REPLICATED, "source", "w", PlanBudget())
    assert out is not None
    nmap, charged = out
    top, bottom = Box((0, 0), (4, 6)), Box((4, 0), (4, 6))
    local = Box((0, 0), (4, 6))
    assert nmap.frames == (
        Frame(0, 0, frozenset({0, 2}), top, local, (4, 6), (6, 1), 0),
        Frame(1, 0, frozenset({1, 3}), bottom, local, (4, 6), (6, 1), -24),
        Frame(2, 0, frozenset({0, 2}), top, local, (4, 6), (6, 1), 0),
        Frame(3, 0, frozenset({1, 3}), bottom, local, (4, 6), (6, 1), -24),
    )
    assert (nmap.parameter, nmap.side, nmap.logical_shape, nmap.piece_count) == ("w", "source", (8, 6), 4)
    assert nmap.shard_shapes == {0: (4, 6), 1: (4, 6), 2: (4, 6), 3: (4, 6)}
    assert charged == 2 + 4  # two distinct boxes separated, one look per frame
    with _general():
        work = WorkCounter()
        assert normalize(_REPLICATED, "source", "w", work=work) == nmap
        assert work.count == charged


def _two_pieces_in_one_shard() -> ParamAffineMap:
    """Location 0 holds rows 2:4 then 0:2 of F (4, 3), swapped in its shard; location 1 all of F."""
    return pmap((4, 3), {0: (4, 3), 1: (4, 3)}, {
        0: [piece((2, 3), 6, (3, 1), 0, (3, 1), [0, 1]), piece((2, 3), 0, (3, 1), 6, (3, 1), [0, 1])],
        1: [piece((4, 3), 0, (3, 1), 0, (3, 1), [1])],
    })


def test_small_normalize_of_several_pieces_in_one_shard() -> None:
    m = _two_pieces_in_one_shard()
    # Location 1 says it alone holds F, but location 0 holds all of it too: the general path
    # explains that, the fast path declines.
    assert _small_normalize(m, "source", "w", PlanBudget()) is None
    fixed = pmap((4, 3), {0: (4, 3), 1: (2, 3), 2: (2, 3)}, {
        0: [piece((2, 3), 6, (3, 1), 0, (3, 1), [0, 2]), piece((2, 3), 0, (3, 1), 6, (3, 1), [0, 1])],
        1: [piece((2, 3), 0, (3, 1), 0, (3, 1), [0, 1])],
        2: [piece((2, 3), 6, (3, 1), 0, (3, 1), [0, 2])],
    })
    out = _small_normalize(fixed, "source", "w", PlanBudget())
    assert out is not None
    nmap, charged = out
    assert [(f.location, f.piece_index, f.box, f.local, f.shift) for f in nmap.frames] == [
        (0, 1, Box((0, 0), (2, 3)), Box((2, 0), (2, 3)), 6),
        (0, 0, Box((2, 0), (2, 3)), Box((0, 0), (2, 3)), -6),
        (1, 0, Box((0, 0), (2, 3)), Box((0, 0), (2, 3)), 0),
        (2, 0, Box((2, 0), (2, 3)), Box((0, 0), (2, 3)), -6),
    ]
    assert charged == 2 * 2 + 2 + 4  # location 0's two separations, the two boxes, four frames
    with _general():
        work = WorkCounter()
        assert normalize(fixed, "source", "w", work=work) == nmap
        assert work.count == charged


def test_small_normalize_charges_the_counter_it_is_given() -> None:
    work = WorkCounter()
    normalize(_REPLICATED, "source", "w", work=work)
    assert work.count == 6
    with pytest.raises(AffineTransferError, match="max_pair_checks=5"):
        normalize(_REPLICATED, "source", "w", PlanBudget(max_pair_checks=5))
    normalize(_REPLICATED, "source", "w", PlanBudget(max_pair_checks=6))


def test_small_normalize_stops_at_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "SMALL_MAP_PIECES", 4)
    assert _small_normalize(_REPLICATED, "source", "w", PlanBudget()) is not None
    monkeypatch.setattr(limits, "SMALL_MAP_PIECES", 3)
    assert _small_normalize(_REPLICATED, "source", "w", PlanBudget()) is None


class _Map(ParamAffineMap):
    __slots__ = ()


_DECLINED: dict[str, tuple[ParamAffineMap, PlanBudget]] = {
    "subclass": (_Map((4,), {0: (4,)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])]}), PlanBudget()),
    "plain tuple piece": (
        ParamAffineMap((4,), {0: (4,)}, {0: [tuple(AffinePiece((4,), 0, (1,), 0, (1,), [0]))]}),  # type: ignore[list-item]
        PlanBudget(),
    ),
    "more pieces than the budget": (_REPLICATED, PlanBudget(max_pieces_per_map=3)),
    "more axes than the budget": (_REPLICATED, PlanBudget(max_ndim=1)),
    "no axes": (pmap((), {0: ()}, {0: [piece((), 0, (), 0, (), [0])]}), PlanBudget()),
    "empty F": (pmap((0, 2), {0: (0, 2)}, {0: []}), PlanBudget()),
    "F above 2**62": (pmap((2**31, 2**32), {0: (1, 1)}, {0: [piece((1, 1), 0, (2**32, 1), 0, (1, 1), [0])]}),
                      PlanBudget()),
    "extent above 2**62": (pmap((2**63,), {0: (1,)}, {0: [piece((1,), 0, (1,), 0, (1,), [0])]}), PlanBudget()),
    "shard without pieces": (pmap((4,), {0: (4,), 1: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0])], 1: []}),
                             PlanBudget()),
    "pieces without shard": (pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0])],
                                                     1: [piece((4,), 0, (1,), 0, (1,), [1])]}), PlanBudget()),
    "shards elsewhere": (pmap((4,), {0: (4,), 2: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0])],
                                                         1: [piece((4,), 0, (1,), 0, (1,), [1])]}), PlanBudget()),
    "empty shard": (pmap((4,), {0: (4,), 1: (0,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0])],
                                                    1: [piece((0,), 0, (1,), 0, (1,), [1])]}), PlanBudget()),
    "part of the shard": (pmap((4,), {0: (5,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0])]}), PlanBudget()),
    "empty piece beside": (pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0]),
                                                      piece((0,), 4, (1,), 4, (1,), [0])]}), PlanBudget()),
    "overlapping local boxes": (pmap((4,), {0: (4,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0]),
                                                           piece((2,), 2, (1,), 1, (1,), [0])]}), PlanBudget()),
    "local boxes short of the shard": (pmap((4,), {0: (5,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0]),
                                                                  piece((2,), 2, (1,), 3, (1,), [0])]}),
                                       PlanBudget()),
    "overlapping logical boxes": (pmap((4,), {0: (4,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0]),
                                                             piece((2,), 1, (1,), 2, (1,), [0])]}), PlanBudget()),
    "regions not separated": (pmap((4,), {0: (4,), 1: (2,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0])],
                                                               1: [piece((2,), 1, (1,), 0, (1,), [1])]}),
                              PlanBudget()),
    "a lone holder names another": (pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [1])]}),
                                    PlanBudget()),
    "a lone holder names two": (pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0, 1])]}), PlanBudget()),
    "replicas name too few": (pmap((4,), {0: (4,), 1: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0, 1])],
                                                              1: [piece((4,), 0, (1,), 0, (1,), [1])]}),
                              PlanBudget()),
    "replicas name too many": (pmap((4,), {0: (4,), 1: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0, 1, 2])],
                                                               1: [piece((4,), 0, (1,), 0, (1,), [0, 1, 2])]}),
                               PlanBudget()),
    "one location holds a box twice": (pmap((4,), {0: (8,), 1: (4,)}, {
        0: [piece((4,), 0, (1,), 0, (1,), [0, 1]), piece((4,), 0, (1,), 4, (1,), [0, 1])],
        1: [piece((4,), 0, (1,), 0, (1,), [0, 1])]}), PlanBudget()),
    "bad piece": (pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0], 2.0)]}), PlanBudget()),
}


@pytest.mark.parametrize("case", sorted(_DECLINED))
def test_small_normalize_declines(case: str) -> None:
    m, budget = _DECLINED[case]
    assert _small_normalize(m, "source", "w", budget) is None
    with _general():
        slow = _outcome(lambda: normalize(m, "source", "w", budget))
    assert _outcome(lambda: normalize(m, "source", "w", budget)) == slow


def test_small_normalize_takes_the_usual_cases() -> None:
    for m in (
        pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0])]}),
        pmap((4,), {0: (4,), 1: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0, 1])],
                                        1: [piece((4,), 0, (1,), 0, (1,), [0, 1])]}),
        pmap((4,), {0: (4,)}, {0: [piece((2,), 0, (1,), 2, (1,), [0]), piece((2,), 2, (1,), 0, (1,), [0])]}),
        contiguous_split_map((6, 4, 2), [2, 2], 1),
    ):
        out = _small_normalize(m, "target", "p", PlanBudget())
        assert out is not None
        with _general():
            work = WorkCounter()
            assert normalize(m, "target", "p", work=work) == out[0]
            assert work.count == out[1]


def test_small_shard() -> None:
    assert _small_shard((3, 4), 2) == ((4, 1), 12)
    assert _small_shard((5,), 1) == ((1,), 5)
    assert _small_shard((2, 3, 4), 3) == ((12, 4, 1), 24)
    assert _small_shard((3, 4), 1) is None
    assert _small_shard((3, 0), 2) is None
    assert _small_shard((1, MAX_COORDINATE), 2) == ((MAX_COORDINATE, 1), MAX_COORDINATE)
    assert _small_shard((1, MAX_COORDINATE + 1), 2) is None
    assert _small_shard((2, 2**61), 2) == ((2**61, 1), 2**62)
    assert _small_shard((4, 2**61), 2) is None  # volume above 2**62


def _geometry(p: AffinePiece, shard: tuple[int, ...], logical: tuple[int, ...]) -> Any:
    strides = tuple(int(x) for x in _small_shard(logical, len(logical))[0])  # type: ignore[index]
    return _small_geometry(p, shard, {}, logical, strides)


def test_small_geometry() -> None:
    # Rows 2:4 of F (4, 3) as the whole shard.
    assert _geometry(AffinePiece((2, 3), 6, (3, 1), 0, (3, 1), [0]), (2, 3), (4, 3)) == (
        (Box((2, 0), (2, 3)), Box((0, 0), (2, 3)), (2, 3), (3, 1), -6), True
    )
    # The same rows at row 1 of a (3, 3) shard: not the whole shard.
    assert _geometry(AffinePiece((2, 3), 6, (3, 1), 3, (3, 1), [0]), (3, 3), (4, 3)) == (
        (Box((2, 0), (2, 3)), Box((1, 0), (2, 3)), (3, 3), (3, 1), -3), False
    )
    # Columns 1:3 of F (2, 4) in a (2, 2) shard; one and three axes take the general decode.
    assert _geometry(AffinePiece((2, 2), 1, (4, 1), 0, (2, 1), [0]), (2, 2), (2, 4)) == (
        (Box((0, 1), (2, 2)), Box((0, 0), (2, 2)), (2, 2), (2, 1), -1), True
    )
    assert _geometry(AffinePiece((3,), 2, (1,), 1, (1,), [0]), (4,), (6,)) == (
        (Box((2,), (3,)), Box((1,), (3,)), (4,), (1,), -1), False
    )
    assert _geometry(AffinePiece((1, 2, 2), 10, (8, 4, 1), 2, (6, 2, 1), [0]), (1, 3, 2), (2, 2, 4)) == (
        (Box((1, 0, 2), (1, 2, 2)), Box((0, 1, 0), (1, 2, 2)), (1, 3, 2), (6, 2, 1), -6), False
    )
    assert _geometry(AffinePiece((1, 2, 2), 14, (8, 4, 1), 2, (6, 2, 1), [0]), (1, 3, 2), (2, 2, 4)) is None


@pytest.mark.parametrize("bad", [
    AffinePiece((2,), 0, (1,), 0, (1,), [0]),  # axes
    AffinePiece((2, 3), 6, (1, 1), 0, (3, 1), [0]),  # source strides
    AffinePiece((2, 3), 6, (3, 1), 0, (4, 1), [0]),  # dest strides
    AffinePiece((2, 3), 6, (3, 1), 0, (3, 1), [0], 0.5),  # scale
    AffinePiece((2, 3), 6, (3, 1), 0, (3, 1), []),  # no holder
    AffinePiece((0, 3), 6, (3, 1), 0, (3, 1), [0]),  # empty
    AffinePiece((2, 3), -1, (3, 1), 0, (3, 1), [0]),  # source offset below F
    AffinePiece((2, 3), 12, (3, 1), 0, (3, 1), [0]),  # source offset past F
    AffinePiece((2, 3), 6, (3, 1), -1, (3, 1), [0]),  # dest offset below the shard
    AffinePiece((2, 3), 6, (3, 1), 9, (3, 1), [0]),  # dest offset past the shard
    AffinePiece((2, 3), 9, (3, 1), 0, (3, 1), [0]),  # box past F's rows
    AffinePiece((2, 2), 2, (3, 1), 0, (3, 1), [0]),  # box past F's columns
    AffinePiece((2, 3), 6, (3, 1), 6, (3, 1), [0]),  # shard box past the shard's rows
    AffinePiece((2, 2), 6, (3, 1), 2, (3, 1), [0]),  # shard box past the shard's columns
])
def test_small_geometry_declines(bad: AffinePiece) -> None:
    assert _geometry(bad, (3, 3), (4, 3)) is None


def test_small_geometry_declines_a_bad_shard() -> None:
    assert _small_geometry(AffinePiece((2,), 0, (1,), 0, (1,), [0]), (2, 1), {}, (4,), (1,)) is None
    sized: dict[tuple[int, ...], Any] = {}
    assert _small_geometry(AffinePiece((2,), 0, (1,), 0, (1,), [0]), (2,), sized, (4,), (1,)) is not None
    assert sized == {(2,): ((1,), 2)}  # worked out once per shard shape


def test_apart() -> None:
    b = Box
    assert _apart([b((0,), (2,)), b((2,), (2,))])  # touching
    assert _apart([b((2,), (2,)), b((0,), (2,))])  # in any order
    assert not _apart([b((0,), (2,)), b((1,), (2,))])  # one element shared
    assert not _apart([b((0,), (2,)), b((0,), (2,))])
    assert _apart([b((0, 0), (2, 2)), b((0, 2), (2, 2))])  # apart on the second axis only
    assert _apart([b((0, 0), (2, 2)), b((2, 0), (2, 2))])  # on the first only
    assert not _apart([b((0, 0), (2, 2)), b((2, 0), (2, 2)), b((0, 2), (4, 2)), b((1, 4), (1, 1))])
    assert _apart([b((0, 0), (1, 1))])


# ---------------------------------------------------------------------------------------------
# regions: the separation shortcuts charge what the general queries charge.


def _nmap(m: ParamAffineMap, side: str) -> Any:
    return normalize(m, side, "w")


def test_source_regions_charge_one_look_per_box() -> None:
    work = WorkCounter()
    regions = source_regions(_nmap(replicate(contiguous_split_map((9, 2), [3, 3, 3], 0), 2), "source"), work)
    assert [r.box for r in regions] == [Box((0, 0), (3, 2)), Box((3, 0), (3, 2)), Box((6, 0), (3, 2))]
    assert [[f.location for f in r.holders] for r in regions] == [[0, 3], [1, 4], [2, 5]]
    assert work.count == 3
    work = WorkCounter()
    source_regions(_nmap(replicate(contiguous_split_map((9, 2), [9], 0), 3), "source"), work)
    assert work.count == 0  # one region: nothing compared


def test_source_regions_refuse_as_before() -> None:
    recut = pmap((4,), {0: (4,), 1: (4,)}, {
        0: [piece((2,), 0, (1,), 0, (1,), [0, 1]), piece((2,), 2, (1,), 2, (1,), [0, 1])],
        1: [piece((4,), 0, (1,), 0, (1,), [0, 1])],
    })
    with pytest.raises(UnsupportedLayoutError, match=r"box \[0:2\] \(locations \[0\]\) overlaps box \[0:4\]"):
        source_regions(_nmap(recut, "source"), WorkCounter())
    short = pmap((4,), {0: (2,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0])]})
    with pytest.raises(InvalidMapError, match=r"cover only 2 of its 4 elements; box \[2:4\]"):
        source_regions(_nmap(short, "source"), WorkCounter())


def test_target_cover_charges_one_look_per_distinct_box() -> None:
    work = WorkCounter()
    check_target_cover(_nmap(replicate(contiguous_split_map((9, 2), [4, 5], 0), 3), "target"), work)
    assert work.count == 2
    gap = pmap((4,), {0: (2,), 1: (1,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0])],
                                          1: [piece((1,), 3, (1,), 0, (1,), [1])]})
    with pytest.raises(InvalidMapError, match=r"do not cover F \(4,\); box \[2:3\] has no target"):
        check_target_cover(_nmap(gap, "target"), WorkCounter())


def test_intersections_of_a_split_against_a_replicated_split() -> None:
    target = _nmap(contiguous_split_map((8, 2), [3, 5], 0), "target")
    regions = source_regions(_nmap(replicate(contiguous_split_map((8, 2), [4, 4], 0), 2), "source"), WorkCounter())
    work = WorkCounter()
    inters = intersections(target, regions, work)
    assert [(x.target.location, x.box, [f.location for f in x.region.holders]) for x in inters] == [
        (0, Box((0, 0), (3, 2)), [0, 2]),
        (1, Box((3, 0), (1, 2)), [0, 2]),
        (1, Box((4, 0), (4, 2)), [1, 3]),
    ]
    assert work.count == 2 + 2 + 3
    assert type(inters[0].box) is Box and type(inters[0]).__name__ == "Intersection"


# ---------------------------------------------------------------------------------------------
# requests and policies.


def test_candidates_read_at_each_holders_own_offset() -> None:
    # Region [0:2] of F (4,) held by location 0 at shard offset 0 and by location 1 at offset 2.
    source = pmap((4,), {0: (4,), 1: (4,)}, {
        0: [piece((2,), 0, (1,), 0, (1,), [0, 1]), piece((2,), 2, (1,), 2, (1,), [0, 1])],
        1: [piece((2,), 0, (1,), 2, (1,), [0, 1]), piece((2,), 2, (1,), 0, (1,), [0, 1])],
    })
    target = pmap((4,), {0: (1,), 1: (3,)}, {0: [piece((1,), 0, (1,), 0, (1,), [0])],
                                             1: [piece((3,), 1, (1,), 0, (1,), [1])]})
    s, t = _nmap(source, "source"), _nmap(target, "target")
    inters = intersections(t, source_regions(s, WorkCounter()), WorkCounter())
    requests = build_requests("w", inters, element_size=2)
    assert [(r.target_location, r.logical_origin, r.shape, r.target_offset, r.bytes,
             [(c.source_rank, c.source_offset) for c in r.candidates]) for r in requests] == [
        (0, (0,), (1,), 0, 2, [(0, 0), (1, 2)]),
        (1, (1,), (1,), 0, 2, [(0, 1), (1, 3)]),
        (1, (2,), (2,), 1, 4, [(0, 2), (1, 0)]),
    ]
    replicated = _nmap(replicate(contiguous_split_map((4,), [2, 2], 0), 2), "source")
    inters = intersections(t, source_regions(replicated, WorkCounter()), WorkCounter())
    assert [[(c.source_rank, c.source_offset) for c in r.candidates] for r in build_requests("w", inters)] == [
        [(0, 0), (2, 0)], [(0, 1), (2, 1)], [(1, 0), (3, 0)],
    ]


def test_holder_sets_are_shared_by_requests_with_the_same_locations() -> None:
    source = replicate(contiguous_split_map((8, 2), [4, 4], 0), 2)
    requests = collect_requests({"w": (contiguous_split_map((8, 2), [2, 2, 2, 2], 0), source)})
    assert len(requests) == 4 and len({r.candidates for r in requests}) == 4
    units = _Units()
    placed = units.placed(list(requests))
    assert len(units.holders) == 2
    assert placed[0].holders is placed[1].holders and placed[2].holders is placed[3].holders
    assert placed[0].holders.ranks == (0, 2) and placed[2].holders.ranks == (1, 3)
    assert [p.size for p in placed] == [4, 4, 4, 4] and [p.fixed for p in placed] == [None] * 4


# ---------------------------------------------------------------------------------------------
# plan: lone segments, plan objects, encoding.


@pytest.mark.parametrize("shape", [(3,), (2, 3), (3, 1, 2), (2, 0), (0,), ()])
def test_decodes_is_decode(shape: tuple[int, ...]) -> None:
    from refplan.box import row_major_strides

    numel = 1
    for s in shape:
        numel *= s
    ends: dict[Any, Any] = {}
    for strides in (row_major_strides(shape), tuple(reversed(row_major_strides(shape))), (2,) * len(shape)):
        for offset in range(-numel - 3, 2 * numel + 4):
            assert _decodes(offset, strides, shape, ends) == (_decode(offset, strides, shape) is not None), (
                offset, strides, shape
            )


def _lone(s_off: int, t_off: int) -> TransferSegment:
    return TransferSegment(0, s_off, (3, 1), 1, t_off, (3, 1), (1, 3))


def test_lone_segments_are_kept_and_charged_once_per_axis() -> None:
    a = _lone(3, 0)
    b = TransferSegment(2, 0, (3, 1), 1, 3, (3, 1), (1, 3))
    far = _lone(9, 3)  # source offset past its (3, 3) shard: not decodable, never looked up
    shards = {0: (3, 3), 2: (3, 3)}
    out, checks = coalesce([b, a], shards, {1: (2, 3)}, PlanBudget())
    assert out == [a, b] and out[0] is a and checks == 4
    out, checks = coalesce([far], shards, {1: (2, 3)}, PlanBudget())
    assert out == [far] and checks == 0
    assert coalesce([a, b], shards, {1: (2, 3)}, PlanBudget(max_merge_passes=0))[1] == 0
    assert coalesce([a, b], shards, {1: (2, 3)}, PlanBudget(max_merge_passes=1))[1] == 4
    assert coalesce([a, b], shards, {1: (2, 3)}, PlanBudget(max_merge_checks=4))[1] == 4
    with pytest.raises(AffineTransferError, match="max_merge_checks=3"):
        coalesce([a, b], shards, {1: (2, 3)}, PlanBudget(max_merge_checks=3), "w")


def test_plan_objects_equal_their_constructors() -> None:
    stats = make_statistics(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert stats == PlanStatistics(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert [getattr(stats, f) for f in PlanStatistics.__dataclass_fields__] == list(range(1, 10))
    segments = (_lone(3, 0),)
    plan = make_plan(segments, (3, 3), 3, stats)
    assert plan == TransferPlan(segments, (3, 3), 3, stats)
    assert plan.statistics is stats and plan.segments is segments and plan.moved_elements == 3
    assert encode_segments(segments, (3, 3)) == encode_plan(plan.to_dict()) == plan.encode()
    assert encode_segments((), (2,)) == b'{"logical_shape":[2],"segments":[]}'


# ---------------------------------------------------------------------------------------------
# planner: the whole-parameter path for slab layouts (``_slab_layout``).


@st.composite
def _slab_batches(draw: st.DrawFn) -> tuple[dict[str, tuple[ParamAffineMap, ParamAffineMap]], dict[str, Any]]:
    """Batches of TP splits along axis 0 replicated by DP: mostly layouts ``_slab_layout`` takes,
    some it declines (an empty part, a split along another axis), replicated targets (taken too), some
    parameters sharing a layout at another element size (its requests rebuilt from the slabs),
    with and without endpoints and nodes (sometimes one unbound)."""
    batch: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    for i in range(draw(st.integers(1, 3))):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.lists(st.integers(1, 7), min_size=ndim, max_size=ndim)))
        axis = draw(st.sampled_from([0, 0, 0, ndim - 1]))

        def sizes(n: int) -> list[int]:
            cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=4)) & set(range(1, n)))
            if draw(st.integers(0, 5)) == 0:
                cuts.append(cuts[-1] if cuts else 0)  # an empty part
            return [b - a for a, b in zip([0, *cuts], [*cuts, n])]

        target = contiguous_split_map(shape, sizes(shape[axis]), axis)
        if draw(st.integers(0, 4)) == 0:
            target = replicate(target, 2)
        source = replicate(contiguous_split_map(shape, sizes(shape[axis]), axis), draw(st.integers(1, 3)))
        batch[f"p{i}"] = (target, source)
        if draw(st.booleans()):
            batch[f"q{i}"] = (target, source)
    sizes_by_name = None
    if draw(st.booleans()):
        sizes_by_name = {name: draw(st.integers(1, 4)) for name in batch}
    kwargs: dict[str, Any] = {"element_size": sizes_by_name}
    if draw(st.booleans()):  # every location bound, now and then one missing (a refusal)
        source = {loc: draw(st.integers(0, 3)) for loc in range(24)}
        target = {loc: draw(st.integers(0, 3)) for loc in range(12)}
        if draw(st.integers(0, 5)) == 0:
            del source[draw(st.integers(0, 3))]
        kwargs["endpoints"] = TransferEndpoints(source, target)
        if draw(st.booleans()):
            kwargs["process_node"] = {p: p // 2 for p in range(4) if p or draw(st.integers(0, 5))}
    return batch, kwargs


def _slab_taken(batch: dict[str, tuple[ParamAffineMap, ParamAffineMap]]) -> bool:
    return any(_slab_layout(t, s, PlanBudget()) is not None for t, s in batch.values())


def test_drawn_slab_layouts_are_planned_the_same_and_exactly_by_every_path() -> None:
    """Row-slab batches under every policy: the same plan bytes and statistics (or the same
    refusal) with ``_slab_layout``, without it (``_small_normalize`` still on) and on the general
    path alone; the oracle judges the plans exact. Counted: enough examples take the slab path."""
    reached = Reached()

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_slab_batches(), st.sampled_from(sorted(POLICIES)))
    def every(drawn: Any, policy: str) -> None:
        batch, kwargs = drawn
        kwargs = {**kwargs, "replica_policy": POLICIES[policy]}
        slab = _planned(batch, **kwargs)
        with _no_slabs():
            small = _planned(batch, **kwargs)
        with _general():
            slow = _planned(batch, **kwargs)
        outcomes = [(o[0], o[1][1] if o[0] == "ok" else o[1]) for o in (slab, small, slow)]
        assert outcomes[0] == outcomes[1] == outcomes[2]
        if slab[0] != "ok":
            reached.hit("refused by every path")
            return
        for plans in (slab[1][0], slow[1][0]):
            assert verify_plans(batch, plans).status == "ok"
        if _slab_taken(batch):
            reached.hit("slab path planned, judged exact")

    every()
    reached.at_least("slab path planned, judged exact", max(1, examples() // 3))

def _side_of(content: MapContent, budget: PlanBudget) -> tuple[int | None, list[Any]] | None:
    """``_slab_side`` with its boxes as a list, to compare with the lists written below."""
    got = _slab_side(content, budget)
    return None if got is None else (got[0], list(got[1]))



_COLUMNS = replicate(contiguous_split_map((8, 6), [2, 4], 1), 2)  # a split along axis 1: locations 0, 2 | 1, 3


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(_CHANGES) - 1), st.integers(0, 1000), st.booleans(), st.booleans())
def test_every_change_to_a_slab_map_is_taken_only_when_the_general_path_agrees(
    change: int, pick: int, as_target: bool, columns: bool
) -> None:
    """Whatever one-field change is made to a slab map: when ``_slab_side`` still accepts it,
    the general path validates it to exactly those boxes (slabs along the axis, every other axis
    whole) and holders; and the whole plan (or the refusal) is the same with the slab path and
    without it."""
    m = _mutated(_COLUMNS if columns else _REPLICATED, change, pick)
    side = _slab_side(m.content, PlanBudget()) if type(m.content) is MapContent else None
    if side is not None:
        axis, spans = side
        with _general():
            nmap = normalize(m, "source", "w")
        boxes: dict[Box, list[int]] = {}
        strides: dict[Box, set[tuple[int, ...]]] = {}
        for f in nmap.frames:
            boxes.setdefault(f.box, []).append(f.location)
            strides.setdefault(f.box, set()).add(f.strides)
        along = 0 if axis is None else axis
        # Every holder of a box reads it with the same shard strides, the ones the span carries.
        assert all(len(kinds) == 1 for kinds in strides.values())
        assert list(spans) == [
            (box.origin[along], box.extent[along], tuple(locs), *strides[box]) for box, locs in sorted(boxes.items())
        ]
        for box in boxes:
            assert [o for a, o in enumerate(box.origin) if a != along] == [0] * (len(box.origin) - 1)
            assert [e for a, e in enumerate(box.extent) if a != along] == [
                n for a, n in enumerate(m.logical_shape) if a != along
            ]
    other = contiguous_split_map((8, 6), [2, 3, 3], 1 if columns else 0)
    batch = {"w": (m, other) if as_target else (other, m)}
    slab = _planned(batch)
    with _general():
        slow = _planned(batch)
    assert slab[0] == slow[0]
    assert (slab[1][1] if slab[0] == "ok" else slab[1]) == (slow[1][1] if slow[0] == "ok" else slow[1])


def test_slab_side_of_splits() -> None:
    assert _side_of(_REPLICATED.content, PlanBudget()) == (0, [(0, 4, (0, 2), (6, 1)), (4, 4, (1, 3), (6, 1))])
    split = contiguous_split_map((8, 6), [2, 3, 3], 0)
    assert _side_of(split.content, PlanBudget()) == (
        0, [(0, 2, (0,), (6, 1)), (2, 3, (1,), (6, 1)), (5, 3, (2,), (6, 1))]
    )
    assert _side_of(_COLUMNS.content, PlanBudget()) == (1, [(0, 2, (0, 2), (2, 1)), (2, 4, (1, 3), (4, 1))])
    columns = contiguous_split_map((2, 3, 4), [1, 3], 2)
    assert _side_of(columns.content, PlanBudget()) == (2, [(0, 1, (0,), (3, 1, 1)), (1, 3, (1,), (9, 3, 1))])
    assert _side_of(contiguous_split_map((5,), [5], 0).content, PlanBudget()) == (None, [(0, 5, (0,), (1,))])
    assert _side_of(replicate(contiguous_split_map((3, 2, 2), [3], 0), 3).content, PlanBudget()) == (
        None, [(0, 3, (0, 1, 2), (4, 2, 1))]
    )


@pytest.mark.parametrize(
    "case", ["empty part", "max_ndim", "max_pieces", "threshold", "gap", "whole beside slabs", "two axes",
             "partial after the axis"]
)
def test_slab_side_declines(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = PlanBudget()
    m = _REPLICATED
    if case == "empty part":
        m = contiguous_split_map((8, 6), [4, 0, 4], 0)
    elif case == "max_ndim":
        budget = PlanBudget(max_ndim=1)
    elif case == "max_pieces":
        budget = PlanBudget(max_pieces_per_map=3)
    elif case == "threshold":
        monkeypatch.setattr(limits, "SLAB_MAP_PIECES", 3)
    elif case == "gap":  # rows 0-3 and 5-7 held: row 4 by nobody
        m = ParamAffineMap((8, 6), {0: (4, 6), 1: (3, 6)}, {
            0: [piece((4, 6), 0, (6, 1), 0, (6, 1), [0])], 1: [piece((3, 6), 30, (6, 1), 0, (6, 1), [1])],
        })
    elif case == "whole beside slabs":
        # All of F (two rows: span (0, 2) along axis 0) beside columns 0-1 (span (0, 2) along axis
        # 1) naming the same holders, and columns 2-3: the spans chain, the boxes overlap.
        m = ParamAffineMap((2, 4), {0: (2, 4), 1: (2, 2), 2: (2, 2)}, {
            0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])], 1: [piece((2, 2), 0, (4, 1), 0, (2, 1), [0, 1])],
            2: [piece((2, 2), 2, (4, 1), 0, (2, 1), [2])],
        })
    elif case == "partial after the axis":
        # F (2, 4, 6) split along axis 1 into rows 0-1 and 2-3, each holding only columns 0-2 of
        # the last axis: every offset is a whole multiple of axis 1's stride and the slabs lie
        # end to end along it, yet half of F is held by nobody (the general path refuses).
        m = ParamAffineMap((2, 4, 6), {0: (2, 2, 3), 1: (2, 2, 3)}, {
            0: [piece((2, 2, 3), 0, (24, 6, 1), 0, (6, 3, 1), [0])],
            1: [piece((2, 2, 3), 12, (24, 6, 1), 0, (6, 3, 1), [1])],
        })
    else:  # rows 0-1 at location 0, columns 2-3 of rows 2-3 ... split along two axes
        m = ParamAffineMap((4, 4), {0: (2, 4), 1: (2, 2), 2: (2, 2)}, {
            0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0])], 1: [piece((2, 2), 8, (4, 1), 0, (2, 1), [1])],
            2: [piece((2, 2), 10, (4, 1), 0, (2, 1), [2])],
        })
    assert _slab_side(m.content, budget) is None
    if case == "threshold":
        monkeypatch.setattr(limits, "SLAB_MAP_PIECES", 4)
        assert _slab_side(m.content, budget) is not None


def _requests_of(slabs: Any) -> list[tuple[Any, ...]]:
    """A slab layout's requests with their candidates (each holder, at the one read address) in
    place of the read address, holders and volume, after checking the volume is the shape's."""
    assert slabs is not None
    for slab in slabs:
        assert slab[6] == prod(slab[2])
    return [(*slab[:5], tuple((rank, *slab[5]) for rank in slab[7])) for slab in slabs]


def test_slab_layout_of_columns_against_all_of_f() -> None:
    """A split along axis 1 against a replicated whole: one region, offsets along the columns,
    each side's shard strides; counters (source 2, target 2·2 + 2, joint 2 + 1 + 2) and requests
    as the general path's."""
    target = contiguous_split_map((4, 6), [2, 4], 1)
    source = replicate(contiguous_split_map((4, 6), [4], 0), 2)
    layout = _slab_layout(target, source, PlanBudget())
    assert layout is not None
    assert (layout.regions, layout.frame_count, layout.checks) == (1, 2, 13)
    assert _requests_of(layout.slabs) == [
        (0, (0, 0), (4, 2), 0, (2, 1), ((0, 0, (6, 1)), (1, 0, (6, 1)))),
        (1, (0, 2), (4, 4), 0, (4, 1), ((0, 2, (6, 1)), (1, 2, (6, 1)))),
    ]
    batch = {"w": (target, source)}
    assert layout.slabs is not None
    with _general():
        assert _slab_requests("w", layout.slabs, 2) == collect_requests(batch, element_size=2)
        assert plan_transfers(batch)["w"].statistics.pair_checks == 13
    # Whole on the target side (replicated: the k-d walk's one leaf over 2 + 2 boxes), columns
    # on the source side: counters source 2 + 2·2, target 2 + 1, joint 4 + 6.
    flipped = _slab_layout(source, target, PlanBudget())
    assert flipped is not None and (flipped.regions, flipped.frame_count, flipped.checks) == (2, 2, 19)
    assert _requests_of(flipped.slabs) == [
        (0, (0, 0), (4, 2), 0, (6, 1), ((0, 0, (2, 1)),)),
        (0, (0, 2), (4, 4), 2, (6, 1), ((1, 0, (4, 1)),)),
        (1, (0, 0), (4, 2), 0, (6, 1), ((0, 0, (2, 1)),)),
        (1, (0, 2), (4, 4), 2, (6, 1), ((1, 0, (4, 1)),)),
    ]
    with _general():
        assert plan_transfers({"w": (source, target)})["w"].statistics.pair_checks == 19
    whole = contiguous_split_map((4, 6), [4], 0)
    layout = _slab_layout(whole, replicate(target, 2), PlanBudget())
    assert layout is not None and _requests_of(layout.slabs) == [
        (0, (0, 0), (4, 2), 0, (6, 1), ((0, 0, (2, 1)), (2, 0, (2, 1)))),
        (0, (0, 2), (4, 4), 2, (6, 1), ((1, 0, (4, 1)), (3, 0, (4, 1)))),
    ]


_STRIDES = (6, 1)


def test_slab_layout_of_a_split_against_a_replicated_split() -> None:
    """Counters as the general path charges them (source 4 + 2·2, target 2·3 + 3, joint 3 + 2 + 4
    overlaps: the 26 pair checks above), and one slab per overlap in request order."""
    layout = _slab_layout(contiguous_split_map((8, 6), [2, 3, 3], 0), _REPLICATED, PlanBudget())
    assert layout is not None
    assert (layout.regions, layout.frame_count, layout.checks, layout.logical) == (2, 3, 26, (8, 6))
    assert dict(layout.target_shards) == {0: (2, 6), 1: (3, 6), 2: (3, 6)}
    assert dict(layout.source_shards) == {0: (4, 6), 1: (4, 6), 2: (4, 6), 3: (4, 6)}
    assert layout.inters == [] and layout.templates == {} and layout.plans == {}
    assert _requests_of(layout.slabs) == [
        (0, (0, 0), (2, 6), 0, _STRIDES, ((0, 0, _STRIDES), (2, 0, _STRIDES))),
        (1, (2, 0), (2, 6), 0, _STRIDES, ((0, 12, _STRIDES), (2, 12, _STRIDES))),
        (1, (4, 0), (1, 6), 12, _STRIDES, ((1, 0, _STRIDES), (3, 0, _STRIDES))),
        (2, (5, 0), (3, 6), 0, _STRIDES, ((1, 6, _STRIDES), (3, 6, _STRIDES))),
    ]
    made = _slab_requests("w", layout.slabs, 2)
    assert all(type(c) is ReplicaCandidate for r in made for c in r.candidates)
    assert [holder_locations(r) for r in made] == [(0, 2), (0, 2), (1, 3), (1, 3)]


def test_slab_layout_declines(monkeypatch: pytest.MonkeyPatch) -> None:
    target = contiguous_split_map((8, 6), [2, 3, 3], 0)
    assert _slab_layout(_COLUMNS, target, PlanBudget()) is None  # replicated columns against rows
    assert _slab_layout(target, contiguous_split_map((8, 6), [3, 3], 1), PlanBudget()) is None
    assert _slab_layout(contiguous_split_map((8, 6), [3, 3], 1), _REPLICATED, PlanBudget()) is None
    # The largest counter is 9 (target and joint): one check fewer declines.
    assert _slab_layout(target, _REPLICATED, PlanBudget(max_pair_checks=8)) is None
    assert _slab_layout(target, _REPLICATED, PlanBudget(max_pair_checks=9)) is not None
    # Three frames and two regions: the slab join applies below ARRAY_MIN_PIECES only.
    monkeypatch.setattr(limits, "ARRAY_MIN_PIECES", 5)
    assert _slab_layout(target, _REPLICATED, PlanBudget()) is None
    monkeypatch.setattr(limits, "ARRAY_MIN_PIECES", 6)
    assert _slab_layout(target, _REPLICATED, PlanBudget()) is not None
    with limits.fast_paths(False):
        assert _slab_layout(target, _REPLICATED, PlanBudget()) is None


def test_slab_requests_are_build_requests() -> None:
    batch = {"w": (contiguous_split_map((8, 6), [2, 3, 3], 0), _REPLICATED)}
    layout = _slab_layout(*batch["w"], PlanBudget())
    assert layout is not None and layout.slabs is not None
    for size in (None, 3):
        got = _slab_requests("w", layout.slabs, size)
        with _general():
            want = collect_requests(batch, element_size=None if size is None else {"w": size})
        assert got == want
        assert [r.bytes for r in got] == ([None] * 4 if size is None else [36, 36, 18, 54])
        assert [r.candidate_processes for r in got] == [(None, None)] * 4
        assert all(r.parameter == "w" and r.target_process is None and r.candidate_nodes is None for r in got)


_ENDPOINTS = TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3}, {0: 1, 1: 2, 2: 0})
_NODES = {0: 0, 1: 0, 2: 1, 3: 1}


def test_slab_requests_bind_processes_and_nodes_as_build_requests() -> None:
    batch = {"w": (contiguous_split_map((8, 6), [2, 3, 3], 0), _REPLICATED)}
    layout = _slab_layout(*batch["w"], PlanBudget())
    assert layout is not None and layout.slabs is not None
    for nodes in (None, _NODES):
        got = _slab_requests("w", layout.slabs, 2, _ENDPOINTS, nodes)
        with _general():
            want = collect_requests(batch, endpoints=_ENDPOINTS, element_size=2, process_node=nodes)
        assert got == want
        assert got is not None
        assert [r.target_process for r in got] == [1, 2, 2, 0]
        assert [r.candidate_processes for r in got] == [(0, 2), (0, 2), (1, 3), (1, 3)]
        assert [r.target_node for r in got] == ([None] * 4 if nodes is None else [0, 1, 1, 0])
        assert [r.candidate_nodes for r in got] == ([None] * 4 if nodes is None else [(0, 1)] * 4)
        # A batch's bindings, shared by its parameters: bound once per holder tuple, the same
        # requests for every parameter (a second layout of other shapes reads the same holders).
        bindings: dict[Any, Any] = {}
        assert _slab_requests("w", layout.slabs, 2, _ENDPOINTS, nodes, bindings) == want
        assert set(bindings) == {(0, 2), (1, 3)}
        source = replicate(contiguous_split_map((4, 3), [2, 2], 0), 2)
        other = _slab_layout(contiguous_split_map((4, 3), [1, 2, 1], 0), source, PlanBudget())
        assert other is not None and other.slabs is not None
        shared = _slab_requests("v", other.slabs, 2, _ENDPOINTS, nodes, bindings)
        assert shared == _slab_requests("v", other.slabs, 2, _ENDPOINTS, nodes) is not None
        assert shared is not None and [r.candidate_processes for r in shared] == [(0, 2), (0, 2), (1, 3), (1, 3)]


@pytest.mark.parametrize("unbound", ["target location", "source location", "target process", "source process"])
def test_slab_requests_leave_an_unbound_location_to_build_requests(unbound: str) -> None:
    """``None`` from ``_slab_requests``; the planner then refuses exactly as the general path."""
    batch = {"w": (contiguous_split_map((8, 6), [2, 3, 3], 0), _REPLICATED)}
    layout = _slab_layout(*batch["w"], PlanBudget())
    assert layout is not None and layout.slabs is not None
    source, target = dict(_ENDPOINTS.source), dict(_ENDPOINTS.target)
    nodes = dict(_NODES)
    if unbound == "target location":
        del target[2]
    elif unbound == "source location":
        del source[3]
    elif unbound == "target process":
        del nodes[0]  # target location 2's process
    else:
        del nodes[3]  # source location 3's process, which no target location is bound to
    endpoints = TransferEndpoints(source, target)
    assert _slab_requests("w", layout.slabs, None, endpoints, nodes) is None
    fast = _planned(batch, endpoints=endpoints, process_node=nodes)
    with _general():
        slow = _planned(batch, endpoints=endpoints, process_node=nodes)
    assert fast == slow
    assert fast[0] == "InvalidMapError"


def test_lone_checks_are_what_coalesce_charges_on_a_slab_layout() -> None:
    """One check per axis per segment when nothing was split (no merge partner exists), none
    without merge passes; ``None`` (coalesce decides) for a split, a refusing merge budget or a
    layout not made by ``_slab_layout``; and the same count as ``coalesce`` reports."""
    batch = {"w": (contiguous_split_map((8, 6), [2, 3, 3], 0), _REPLICATED)}
    layout = _slab_layout(*batch["w"], PlanBudget())
    assert layout is not None
    whole: list[Any] = [[("box", "holder")]] * 4
    assert _lone_checks(layout, whole, 4, PlanBudget()) == 8
    assert _lone_checks(layout, whole, 3, PlanBudget()) == 6
    assert _lone_checks(layout, whole, 4, PlanBudget(max_merge_passes=0)) == 0
    assert _lone_checks(layout, whole, 4, PlanBudget(max_merge_passes=1)) == 8  # one pass checks them
    assert _lone_checks(layout, whole, 4, PlanBudget(max_merge_checks=8)) == 8
    assert _lone_checks(layout, whole, 4, PlanBudget(max_merge_checks=7)) is None
    assert _lone_checks(layout, [*whole[:3], [("a", 0), ("b", 1)]], 5, PlanBudget()) is None
    layout.slabs = None
    assert _lone_checks(layout, whole, 4, PlanBudget()) is None
    plan = plan_transfers(batch)["w"]
    with _general():
        general = plan_transfers(batch)["w"]
    assert plan.statistics.merge_checks == general.statistics.merge_checks == 8
    assert plan.segments == general.segments
    one_pass = PlanBudget(max_merge_passes=1)  # by rows and by the general path alike
    with _general():
        general_one = plan_transfers(batch, one_pass)["w"]
    assert plan_transfers(batch, one_pass)["w"].statistics == general_one.statistics
    assert general_one.statistics.merge_checks == 8
