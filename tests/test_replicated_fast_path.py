"""The slab path with replicated target boxes (issue 27) plans exactly what the general path plans.

A norm or bias parameter is usually held whole by every location on both sides: every target
location holds all of F. Its target boxes are then replicated, no axis separates them, and the
general path's intersection query falls to the k-d walk of ``box._partition_pairs`` (one root
cell, one leaf). ``planner._slab_layout`` settles such layouts itself when the walk is one leaf
(at most ``limits.LEAF`` boxes), charging what the walk charges. So:

- drawn layouts (replicated whole-F or replicated slab targets, whole or slab sources, 1-3
  axes, location orders, element sizes, endpoints and nodes) give the same plans, statistics
  included, with the slab path and on the general path, and the oracle judges both exact;
- the pair checks the slab path charges are held to the general path's on enumerated layouts
  and to exact numbers, at the leaf boundary and at the budget boundary.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from conftest import Reached, examples, piece
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_small_fast_path import _general, _planned, _side_of

from refplan import limits, plan_transfers, verify_plans
from refplan.limits import PlanBudget
from refplan.maps import ParamAffineMap, contiguous_split_map, replicate, replicated_map
from refplan.planner import _slab_layout, _slab_side
from refplan.policies import POLICIES
from refplan.requests import TransferEndpoints

Batch = dict[str, tuple[ParamAffineMap, ParamAffineMap]]


def _dicts(outcome: Any) -> Any:
    """A ``_planned`` outcome with every plan as its JSON text (segments, statistics and all)."""
    if outcome[0] != "ok":
        return outcome
    return {name: json.dumps(plan.to_dict(), sort_keys=True) for name, plan in outcome[1][0].items()}


def _split(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


@st.composite
def _sides(draw: st.DrawFn, shape: tuple[int, ...], axis: int, target: bool) -> ParamAffineMap:
    """All of F or a split along ``axis`` (sometimes along another axis: a layout the slab path
    declines), replicated 1-4 times (a target at least twice, mostly) in either location order."""
    ndim = len(shape)
    if draw(st.booleans()):
        tp = contiguous_split_map(shape, [shape[0]], 0)
    else:
        along = axis if draw(st.integers(0, 7)) else draw(st.integers(0, ndim - 1))
        tp = contiguous_split_map(shape, _split(shape[along], draw(st.integers(1, min(3, shape[along])))), along)
    copies = draw(st.integers(2 if target and draw(st.integers(0, 5)) else 1, 4))
    if copies == 1:
        return tp
    if draw(st.booleans()):  # TP outermost: a box's holders are neighbours
        return replicate(tp, copies, lambda loc, copy: loc * copies + copy)
    return replicate(tp, copies)


@st.composite
def _batches(draw: st.DrawFn) -> tuple[Batch, dict[str, Any]]:
    batch: Batch = {}
    for i in range(draw(st.integers(1, 3))):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
        axis = draw(st.integers(0, ndim - 1))
        batch[f"p{i}"] = (draw(_sides(shape, axis, True)), draw(_sides(shape, axis, False)))
    kwargs: dict[str, Any] = {}
    if draw(st.booleans()):
        kwargs["element_size"] = {name: draw(st.sampled_from([1, 2, 4, 16])) for name in batch}
    if draw(st.booleans()):  # every location bound, now and then one missing (a refusal)
        source = {loc: draw(st.integers(0, 3)) for loc in range(16)}
        target = {loc: draw(st.integers(0, 3)) for loc in range(16)}
        if draw(st.integers(0, 7)) == 0:
            del target[draw(st.integers(0, 3))]
        kwargs["endpoints"] = TransferEndpoints(source, target)
        if draw(st.booleans()):
            kwargs["process_node"] = {p: p // 2 for p in range(4)}
    return batch, kwargs


def _replicated_taken(batch: Batch) -> bool:
    for target, source in batch.values():
        layout = _slab_layout(target, source, PlanBudget())
        if layout is not None and len({s[1:] for s in layout.slabs or ()}) < len(layout.slabs or ()):
            return True  # two target locations receive the same part: a replicated target box
    return False


def test_drawn_replicated_layouts_are_planned_the_same_and_exactly_by_both_paths() -> None:
    """Every policy: the same plans (``to_dict``, statistics included) or the same refusal with
    the slab path and on the general path alone, both judged exact by the oracle. Counted:
    enough examples take the slab path with a replicated target box."""
    reached = Reached()

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_batches(), st.sampled_from(sorted(POLICIES)))
    def both(drawn: tuple[Batch, dict[str, Any]], policy: str) -> None:
        batch, kwargs = drawn
        kwargs = {**kwargs, "replica_policy": POLICIES[policy]}
        fast = _planned(batch, **kwargs)
        with _general():
            slow = _planned(batch, **kwargs)
        assert _dicts(fast) == _dicts(slow)
        if fast[0] != "ok":
            reached.hit("refused by both")
            return
        for plans in (fast[1][0], slow[1][0]):
            assert verify_plans(batch, plans).status == "ok"
        if _replicated_taken(batch):
            reached.hit("replicated target planned by the slab path, judged exact")

    both()
    reached.at_least("replicated target planned by the slab path, judged exact", max(1, examples() // 3))


def _general_checks(target: ParamAffineMap, source: ParamAffineMap) -> int:
    with _general():
        return plan_transfers({"w": (target, source)})["w"].statistics.pair_checks


def _replicated_cases() -> list[tuple[ParamAffineMap, ParamAffineMap]]:
    """Norm-like layouts (all of F on both sides) and replicated slabs against slabs, with the
    number of boxes from 3 up to past ``limits.LEAF``."""
    cases = []
    for shape in ((7,), (3, 5), (2, 3, 4)):
        for copies in (2, 3, 8, 16, 31):
            for held in (1, 2, 16):
                cases.append((replicated_map(shape, copies), replicated_map(shape, held)))
        for copies in (2, 5, 15, 16):
            target = replicate(contiguous_split_map(shape, _split(shape[0], 2), 0), copies)
            for parts in (1, 2, 3):
                source = replicate(contiguous_split_map(shape, _split(shape[0], min(parts, shape[0])), 0), 2)
                cases.append((target, source))
    return cases


def test_replicated_layouts_charge_the_general_paths_pair_checks() -> None:
    """The slab path's pair checks are the general path's on every case it takes, and it takes
    exactly the cases of at most ``limits.LEAF`` boxes (one frame per target location, one box
    per source region); a miscount in any counter fails here."""
    taken = 0
    for target, source in _replicated_cases():
        layout = _slab_layout(target, source, PlanBudget())
        regions = {(p.source_offset, p.shape) for ps in source.pieces_by_rank.values() for p in ps}
        if len(target.shard_shapes) + len(regions) > limits.LEAF:
            assert layout is None
            continue
        assert layout is not None, (target, source)
        assert layout.regions == len(regions)
        assert layout.checks == _general_checks(target, source)
        taken += 1
    assert taken >= 20


def test_the_norm_layout_charges_exact_counts() -> None:
    """A Llama norm: 8 target locations and 16 source locations, each holding all of F.
    Source 16 (one look per frame, one region), target 8 + 1 (frames, then the cover's one
    distinct box), joint 9 + 9·8/2 (the walk's root cell, then its one leaf): 70."""
    target, source = replicated_map((4101,), 8), replicated_map((4101,), 16)
    layout = _slab_layout(target, source, PlanBudget())
    assert layout is not None
    assert (layout.regions, layout.frame_count, layout.checks) == (1, 8, 70)
    assert type(layout.checks) is int  # it is written into the plan's statistics, and so its bytes
    assert _general_checks(target, source) == 70
    assert [s[0] for s in layout.slabs or ()] == list(range(8))
    assert {s[1:5] for s in layout.slabs or ()} == {((0,), (4101,), 0, (1,))}
    assert list((layout.slabs or [])[0][7]) == list(range(16))
    # Replicated slabs against replicated slabs: source 4 + 2·2, target 6 + 2·2, joint 8 + 28.
    target = replicate(contiguous_split_map((6, 2), [3, 3], 0), 3)
    source = replicate(contiguous_split_map((6, 2), [1, 5], 0), 2)
    layout = _slab_layout(target, source, PlanBudget())
    assert layout is not None and layout.checks == 8 + 10 + 36 == _general_checks(target, source)


def test_the_leaf_bounds_the_replicated_slab_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Taken with exactly ``limits.LEAF`` boxes, declined with one more (the walk may then cut
    its root cell); read at call time, so a smaller leaf declines sooner, and the general path,
    which reads the same leaf, still agrees."""
    whole = replicated_map((5, 3), 2)
    assert _slab_layout(replicated_map((5, 3), limits.LEAF - 2), whole, PlanBudget()) is not None  # 30 + 1
    assert _slab_layout(replicated_map((5, 3), limits.LEAF - 1), whole, PlanBudget()) is not None  # 31 + 1
    assert _slab_layout(replicated_map((5, 3), limits.LEAF), whole, PlanBudget()) is None  # 32 + 1
    target = replicate(contiguous_split_map((6, 3), [3, 3], 0), 2)
    source = contiguous_split_map((6, 3), [2, 2, 2], 0)
    batch = {"w": (target, source)}
    monkeypatch.setattr(limits, "LEAF", 7)
    layout = _slab_layout(target, source, PlanBudget())
    assert layout is not None and layout.checks == 3 + 2 * 3 + 4 + 2 * 2 + 7 + 21
    fast = _planned(batch)
    with _general():
        slow = _planned(batch)
    assert _dicts(fast) == _dicts(slow)
    assert fast[0] == "ok" and fast[1][1]["w"][1].pair_checks == 45
    monkeypatch.setattr(limits, "LEAF", 6)  # the walk now cuts its root cell, and charges otherwise
    assert _slab_layout(target, source, PlanBudget()) is None
    cut = _planned(batch)
    with _general():
        assert _dicts(_planned(batch)) == _dicts(cut)
    assert cut[0] == "ok" and cut[1][1]["w"][1].pair_checks != 45


@pytest.mark.parametrize("budget", [15, 14, 5, 4, 3, 2])
def test_the_pair_budget_is_decided_by_the_general_path(budget: int) -> None:
    """A norm over 4 target and 3 source locations charges source 3, target 4 + 1 and joint
    5 + 10 (four frames and one region) = 15: at 15 the slab path plans; below it declines, and
    both paths refuse alike, naming the side whose counter ran out (the joint one is the target's)."""
    target, source = replicated_map((6,), 4), replicated_map((6,), 3)
    layout = _slab_layout(target, source, PlanBudget(max_pair_checks=budget))
    assert (layout is not None) == (budget >= 15)
    batch = {"w": (target, source)}
    fast = _planned(batch, limits=PlanBudget(max_pair_checks=budget))
    with _general():
        slow = _planned(batch, limits=PlanBudget(max_pair_checks=budget))
    assert _dicts(fast) == _dicts(slow)
    assert fast[0] == ("ok" if budget >= 15 else "AffineTransferError")
    if fast[0] != "ok":
        side = "source" if budget < 3 else "target"  # the joint counter is named for the target
        assert f"{side} map: validation needs more than max_pair_checks={budget}" in fast[1]


def test_replicated_targets_with_their_own_piece_objects() -> None:
    """Equal pieces that are distinct objects at each holder (a map written out by hand) are
    grouped by box as the general path groups frames: the same plan, requests in location order."""
    locations = [3, 0, 2]
    target = ParamAffineMap((4, 2), dict.fromkeys(locations, (4, 2)), {
        loc: [piece((4, 2), 0, (2, 1), 0, (2, 1), locations)] for loc in locations
    })
    source = replicate(contiguous_split_map((4, 2), [1, 3], 0), 2)
    layout = _slab_layout(target, source, PlanBudget())
    assert layout is not None and [s[0] for s in layout.slabs or ()] == [0, 0, 2, 2, 3, 3]
    batch = {"w": (target, source)}
    endpoints = TransferEndpoints({0: 0, 1: 1, 2: 0, 3: 1}, {0: 1, 2: 0, 3: 1})
    fast = _planned(batch, endpoints=endpoints, element_size=2, process_node={0: 0, 1: 1})
    with _general():
        slow = _planned(batch, endpoints=endpoints, element_size=2, process_node={0: 0, 1: 1})
    assert fast[0] == "ok" and _dicts(fast) == _dicts(slow)
    assert verify_plans(batch, fast[1][0]).status == "ok"


def _rows(named: dict[int, list[int]], boxes: dict[int, tuple[int, int]], strides: Any = None) -> ParamAffineMap:
    """Rows ``boxes[loc] = (first, count)`` of an (8, 3) F at each location, naming ``named[loc]``
    as holders, each piece its own object (so equal boxes are merged by box, not by identity)."""
    return ParamAffineMap((8, 3), {loc: (n, 3) for loc, (_, n) in boxes.items()}, {
        loc: [piece((n, 3), 3 * first, (3, 1), 0, strides or (3, 1), named[loc])] for loc, (first, n) in boxes.items()
    })


_HALVES = {0: (0, 4), 1: (4, 4), 2: (0, 4), 3: (4, 4)}
_SIDE_CASES: dict[str, tuple[ParamAffineMap, Any]] = {
    "replicated halves": (_rows({0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}, _HALVES),
                          (0, [(0, 4, (0, 2), (3, 1)), (4, 4, (1, 3), (3, 1))])),
    "a holder missing": (_rows({0: [0], 1: [1, 3], 2: [0, 2], 3: [1, 3]}, _HALVES), None),
    "a holder too many": (_rows({0: [0, 2, 3], 1: [1, 3], 2: [0, 2, 3], 3: [1, 3]}, _HALVES), None),
    "holders swapped": (_rows({0: [0, 3], 1: [1, 2], 2: [0, 3], 3: [1, 2]}, _HALVES), None),
    "unreplicated, a holder too many": (_rows({0: [0, 1], 1: [1]}, {0: (0, 4), 1: (4, 4)}), None),
    "unreplicated, a stranger named": (_rows({0: [0, 5], 1: [1]}, {0: (0, 4), 1: (4, 4)}), None),
    "unreplicated, holders crossed": (_rows({0: [1], 1: [0]}, {0: (0, 4), 1: (4, 4)}), None),
    "merged, overlapping": (_rows({0: [0, 2], 1: [1], 2: [0, 2]}, {0: (0, 4), 1: (3, 5), 2: (0, 4)}), None),
    "merged, a gap": (_rows({0: [0, 2], 1: [1], 2: [0, 2]}, {0: (0, 4), 1: (5, 3), 2: (0, 4)}), None),
    "merged, runs past F": (_rows({0: [0, 2], 1: [1], 2: [0, 2]}, {0: (0, 4), 1: (4, 5), 2: (0, 4)}), None),
    "merged, end to end": (_rows({0: [0, 2], 1: [1], 2: [0, 2]}, {0: (0, 4), 1: (4, 4), 2: (0, 4)}),
                           (0, [(0, 4, (0, 2), (3, 1)), (4, 4, (1,), (3, 1))])),
}



@pytest.mark.parametrize("case", sorted(_SIDE_CASES))
def test_slab_side_holders_and_merged_boxes(case: str) -> None:
    """``_slab_side`` on maps whose pieces are separate objects: exact spans when every box's
    pieces name exactly its holders and the boxes run end to end, else ``None``; either way the
    whole plan (or refusal) is the general path's, as target and as source."""
    m, want = _SIDE_CASES[case]
    assert _side_of(m.content, PlanBudget()) == want
    other = contiguous_split_map((8, 3), [3, 5], 0)
    for batch in ({"w": (m, other)}, {"w": (other, m)}):
        fast = _planned(batch)
        with _general():
            slow = _planned(batch)
        assert _dicts(fast) == _dicts(slow)
        assert (fast[0] == "ok") == (want is not None)


def test_slab_side_checks_shard_strides_along_later_axes() -> None:
    """Columns of a (2, 6) F: a shard's row stride is its own width, not F's; a piece that claims
    F's row stride is refused by both paths."""
    good = contiguous_split_map((2, 6), [2, 4], 1)
    assert _side_of(good.content, PlanBudget()) == (1, [(0, 2, (0,), (2, 1)), (2, 4, (1,), (4, 1))])
    bad = ParamAffineMap((2, 6), {0: (2, 2), 1: (2, 4)}, {
        0: [piece((2, 2), 0, (6, 1), 0, (6, 1), [0])], 1: [piece((2, 4), 2, (6, 1), 0, (4, 1), [1])],
    })
    assert _slab_side(bad.content, PlanBudget()) is None
    batch = {"w": (bad, good)}
    fast = _planned(batch)
    with _general():
        slow = _planned(batch)
    assert fast[0] != "ok" and _dicts(fast) == _dicts(slow)


def test_a_broadcast_to_many_replicas_costs_the_distinct_boxes_not_their_pairs() -> None:
    """A target replicated over 512 locations from 16 source row slabs: the general path finds
    the overlaps of each *distinct* target box once and gives them to every replica. Before, the
    k-d query held the 512 identical boxes together in each of its 16 leaves and compared them
    pairwise there (about 2.1 million comparisons charged, so this budget refused the plan; at
    4 096 replicas the default budget did, and 1 024 took 2.6 s)."""
    shape = (64, 8)
    pairs = {"w": (replicated_map(shape, 512), contiguous_split_map(shape, [4] * 16, 0))}
    plans = plan_transfers(pairs, PlanBudget(max_pair_checks=1 << 20))
    assert len(plans["w"].segments) == 512 * 16
    assert verify_plans(pairs, plans).ok


def test_the_oracle_compares_each_declared_holder_set_once() -> None:
    """The oracle's holder rule compares each distinct declared-locations object with a box's
    holders once (``oracle.layout._declaring_other``): the 4 096 replicas of a broadcast share one,
    so it is one comparison, not 4 096 of 4 096 holders; a replica that declares other holders
    (its own set) is still named."""
    from refplan.oracle.layout import _declaring_other, validate_map

    layout = validate_map(replicated_map((8, 8), 4096), "target")
    held = [h for loc in sorted(layout.held) for h in layout.held[loc]]
    assert len(held) == 4096 and len({id(h.locations) for h in held}) == 1
    assert _declaring_other(held, frozenset(range(4096))) == set()
    odd = dataclasses.replace(held[7], locations=frozenset(range(4095)))
    assert _declaring_other([*held[:7], odd, *held[8:]], frozenset(range(4096))) == {id(odd.locations)}
