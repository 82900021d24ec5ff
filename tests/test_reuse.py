"""Work done once per distinct layout must decide exactly what doing it per parameter decides.

The planner remembers, within one batch, each distinct (target, source) layout: its validation,
the requests built for it, and the plans emitted for it per set of answers. The oracle remembers
validated maps and the verdicts of small plans. Each reuse is keyed on content, so a parameter
that differs from an earlier one in any field — of a piece, of a segment, of an answer — must get
its own result. These tests build batches of identical twins and near-twins and compare every
outcome with the same batch run with every fast path off (``limits.fast_paths(False)``, which
turns the memos off too): the same requests, the same plan bytes and statistics, the same error
and message, the same verdicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refplan import (
    InvalidReplicaPolicyError,
    PlanBudget,
    ReplicaPart,
    TransferEndpoints,
    TransferPlan,
    plan_transfers,
    verify_plan,
    verify_plans,
)
from refplan.errors import AffineTransferError
from refplan.limits import fast_paths
from refplan.maps import AffinePiece, MapContent, ParamAffineMap, contiguous_split_map, replicate
from refplan.strategies import collect_batch_requests, map_pairs, replaying, valid_answers

MapPair = tuple[ParamAffineMap, ParamAffineMap]


def _fresh(m: ParamAffineMap) -> ParamAffineMap:
    """An equal map built anew through its dict form (what a model's loader yields): a new map
    object, sharing ``m``'s content exactly when ``m`` lists its locations in sorted order."""
    return ParamAffineMap.from_dict(m.to_dict())


def _nudged(m: ParamAffineMap, which: int) -> ParamAffineMap:
    """``m`` with one field of its first piece changed (0: the destination offset, 1: the piece's
    locations order-insensitively the same but listed under a different dict order)."""
    ranks = list(m.pieces_by_rank)
    if which == 0:
        loc = ranks[0]
        first, *rest = m.pieces_by_rank[loc]
        pieces = dict(m.pieces_by_rank)
        pieces[loc] = (first.replace(dest_offset=first.dest_offset + 1), *rest)
        return ParamAffineMap(m.logical_shape, m.shard_shapes, pieces)
    return ParamAffineMap(
        m.logical_shape,
        dict(reversed(list(m.shard_shapes.items()))),
        dict(reversed(list(m.pieces_by_rank.items()))),
    )


@st.composite
def twin_batches(draw: st.DrawFn) -> dict[str, MapPair]:
    """2–6 parameters, most of them equal copies of one drawn pair, some nudged, one maybe other."""
    target, source = draw(map_pairs(max_parts=4, max_locations=3))
    batch: dict[str, MapPair] = {}
    for i in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["twin", "twin", "twin", "nudge-target", "nudge-source", "reorder"]))
        t, s = _fresh(target), _fresh(source)
        if kind == "nudge-target":
            t = _nudged(t, 0)
        elif kind == "nudge-source":
            s = _nudged(s, 0)
        elif kind == "reorder":
            t, s = _nudged(t, 1), _nudged(s, 1)
        batch[f"p{i}"] = (t, s)
    if draw(st.booleans()):
        batch["other"] = draw(map_pairs(max_parts=4, max_locations=3))
    return batch


def _outcome(run: Callable[[], Any]) -> Any:
    try:
        return ("ok", run())
    except AffineTransferError as exc:
        return (type(exc).__name__, str(exc))


def _plan_bytes(plans: dict[str, TransferPlan]) -> dict[str, tuple[bytes, Any]]:
    return {name: (plan.encode(), plan.statistics) for name, plan in plans.items()}


def _both(run: Callable[[], Any]) -> tuple[Any, Any]:
    with fast_paths(True):
        fast = _outcome(run)
    with fast_paths(False):
        slow = _outcome(run)
    return fast, slow


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(batch=twin_batches(), data=st.data())
def test_reused_layouts_plan_what_fresh_ones_plan(batch: dict[str, MapPair], data: st.DataObject) -> None:
    """Requests, and plans under any valid answers (splits included), equal the memo-free run."""
    fast, slow = _both(lambda: collect_batch_requests(batch))
    assert fast == slow
    if fast[0] != "ok":
        return
    requests = fast[1]
    answers = data.draw(valid_answers(requests, min_split_bytes=1, max_parts=4))
    fast, slow = _both(lambda: _plan_bytes(plan_transfers(batch, replica_policy=replaying(answers),
                                                          min_split_bytes=1)))
    assert fast == slow
    fast, slow = _both(lambda: _plan_bytes(plan_transfers(batch)))
    assert fast == slow


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(batch=twin_batches(), data=st.data())
def test_reused_verdicts_equal_fresh_ones_for_corrupted_twins(batch: dict[str, MapPair], data: st.DataObject) -> None:
    """One twin's plan corrupted in one field of one segment: every verdict equals the memo-free
    one, so the corrupted twin is never handed its valid siblings' verdict."""
    try:
        plans: dict[str, Any] = dict(plan_transfers(batch))
    except AffineTransferError:
        return
    victim = data.draw(st.sampled_from(sorted(plans)))
    plan = plans[victim]
    if plan.segments:
        k = data.draw(st.integers(0, len(plan.segments) - 1))
        field = data.draw(st.sampled_from(["source_offset", "target_offset", "source_rank", "target_rank"]))
        delta = data.draw(st.sampled_from([-1, 1]))
        segs = list(plan.segments)
        segs[k] = dataclasses.replace(segs[k], **{field: getattr(segs[k], field) + delta})
        plans[victim] = dataclasses.replace(plan, segments=tuple(segs))
    fast, slow = _both(lambda: verify_plans(batch, plans).to_dict())
    assert fast == slow
    # Shifting one non-empty segment's offset, or its target location, changes the set of addresses
    # it reads or writes (a finite set is never its own translate), so the twin is invalid; only a
    # source location shift can land on a replica that holds the same data.
    if plan.segments and field != "source_rank" and plan.segments[k].numel > 0:
        assert slow[0] == "ok" and slow[1]["parameters"][victim]["status"] != "ok", (victim, field, slow)


def _layer(shape: tuple[int, int] = (8, 4)) -> MapPair:
    """TP=2 x 2 replicas (locations 0-3) -> TP=2 on locations 0-1: every request has two holders."""
    return contiguous_split_map(shape, [4, 4], 0), replicate(contiguous_split_map(shape, [4, 4], 0), 2)


def test_twins_with_different_answers_get_different_plans() -> None:
    """The plan memo is keyed on the answers: twins served by different replicas differ."""
    batch = {"a": _layer(), "b": _layer()}

    def alternate(requests: Any) -> list[int]:
        # 'a' from the first holder of each request, 'b' from the last.
        return [min(r.locations) if r.parameter == "a" else max(r.locations) for r in requests]

    plans = plan_transfers(batch, replica_policy=alternate)
    assert {s.source_rank for s in plans["a"].segments} == {0, 1}
    assert {s.source_rank for s in plans["b"].segments} == {2, 3}
    assert verify_plans(batch, plans).status == "ok"


def test_a_bad_answer_for_a_later_twin_names_that_twin() -> None:
    batch = {"a": _layer(), "b": _layer()}

    def bad_for_b(requests: Any) -> list[int]:
        return [min(r.locations) if r.parameter == "a" else 7 for r in requests]

    with pytest.raises(InvalidReplicaPolicyError, match="parameter 'b'"):
        plan_transfers(batch, replica_policy=bad_for_b)


def test_a_budget_refusal_caused_by_a_later_twin_names_that_twin() -> None:
    """'a' is planned (and its plan remembered) first; 'b' splits and blows ``max_plan_bytes``."""
    batch = {"a": _layer((8, 1 << 10)), "b": _layer((8, 1 << 10))}
    whole = plan_transfers({"a": batch["a"]})["a"]
    budget = PlanBudget(max_plan_bytes=len(whole.encode()))

    def split_b(requests: Any) -> list[Any]:
        out: list[Any] = []
        for r in requests:
            if r.parameter == "a":
                out.append(min(r.locations))
                continue
            half = r.shape[1] // 2
            out.append([
                ReplicaPart(r.logical_origin, (r.shape[0], half), min(r.locations)),
                ReplicaPart((r.logical_origin[0], r.logical_origin[1] + half), (r.shape[0], half), max(r.locations)),
            ])
        return out

    with pytest.raises(InvalidReplicaPolicyError, match=r"parameter 'b'.*max_plan_bytes"):
        plan_transfers(batch, budget, replica_policy=split_b, min_split_bytes=1)


def test_an_endpoint_missing_for_a_twin_is_refused_like_before() -> None:
    """Requests are copied from the first twin only after it was bound to endpoints without error."""
    batch = {"a": _layer(), "b": _layer()}
    partial = TransferEndpoints({0: 0, 1: 1, 2: 2}, {0: 4, 1: 5})
    fast, slow = _both(lambda: plan_transfers(batch, endpoints=partial))
    assert fast == slow
    assert fast[0] == "InvalidMapError" and "parameter 'a'" in fast[1] and "source location 3" in fast[1]


def test_element_sizes_are_part_of_the_request_memo() -> None:
    """Twins with different dtypes get requests with their own byte counts."""
    batch = {"a": _layer(), "b": _layer(), "c": _layer()}
    sizes = {"a": 2, "b": 4, "c": 2}
    fast, slow = _both(lambda: collect_batch_requests(batch, element_size=sizes))
    assert fast == slow
    by_name = {r.parameter: r.bytes for r in fast[1]}
    assert by_name == {"a": 16 * 2, "b": 16 * 4, "c": 16 * 2}


def test_a_piece_subclass_is_never_memoized() -> None:
    """Only exact ``AffinePiece``/``ParamAffineMap`` instances are keyed; a subclass could compare
    equal while meaning something else, so it is validated (and planned) on its own."""

    class Tagged(AffinePiece):
        pass

    target, source = _layer()
    odd_pieces = {
        loc: tuple(Tagged(p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides, p.locations)
                   for p in listed)
        for loc, listed in source.pieces_by_rank.items()
    }
    odd = ParamAffineMap(source.logical_shape, source.shard_shapes, odd_pieces)
    batch = {"a": (target, source), "b": (_fresh(target), odd)}
    fast, slow = _both(lambda: _plan_bytes(plan_transfers(batch)))
    assert fast == slow and fast[0] == "ok"


# -- the oracle's memos: what they must not hide, and when they apply ----------------------------


def test_a_verdict_is_reused_only_for_plans_up_to_the_segment_bound(
    monkeypatch: pytest.MonkeyPatch, oracle_work: dict[str, int]
) -> None:
    from refplan import limits
    from refplan.policies import first_holder

    """The planner's equal plans share one segments tuple: up to the bound they are reused (by
    plan content or by that tuple), past it still by the tuple's identity, which builds no key
    (``oracle.judge.Twins``); a batch of equal plans around tuples of their own is judged plan by
    plan past the bound; and with the bound below zero (``limits.fast_paths(False)``) nothing is
    reused."""
    batch = {"a": _layer(), "b": _layer(), "c": _layer()}
    plans = plan_transfers(batch, replica_policy=first_holder)  # three equal plans, one segments tuple
    assert len({id(p.segments) for p in plans.values()}) == 1
    size = len(plans["a"].segments)
    monkeypatch.setattr(limits, "REMEMBER_SEGMENTS", size)
    assert verify_plans(batch, plans).status == "ok" and oracle_work["check_plan"] == 1
    monkeypatch.setattr(limits, "REMEMBER_SEGMENTS", size - 1)
    assert verify_plans(batch, plans).status == "ok" and oracle_work["check_plan"] == 1 + 1
    copies = {name: dataclasses.replace(p, segments=tuple(list(p.segments))) for name, p in plans.items()}
    assert verify_plans(batch, copies).status == "ok" and oracle_work["check_plan"] == 1 + 1 + 3
    monkeypatch.setattr(limits, "REMEMBER_SEGMENTS", -1)
    assert verify_plans(batch, plans).status == "ok" and oracle_work["check_plan"] == 1 + 1 + 3 + 3


def test_a_map_is_remembered_only_up_to_the_piece_bound(
    monkeypatch: pytest.MonkeyPatch, oracle_work: dict[str, int]
) -> None:
    from refplan import limits

    batch = {"a": _layer(), "b": _layer()}  # target: 2 pieces, source: 4
    plans = plan_transfers(batch)
    monkeypatch.setattr(limits, "REMEMBER_PIECES", 3)  # the target is remembered, the source not
    assert verify_plans(batch, plans).status == "ok"
    assert oracle_work["validate_map"] == 1 + 2
    monkeypatch.setattr(limits, "REMEMBER_PIECES", 2)  # the bound itself is "at most": still remembered
    assert verify_plans(batch, plans).status == "ok"
    assert oracle_work["validate_map"] == 2 * (1 + 2)


def test_twins_that_differ_only_in_their_source_get_their_own_verdicts() -> None:
    """Same target map, same segments, different sources: the reused verdict is keyed on both
    layouts, so the twin whose source holds other data at the addresses read is invalid."""
    target = contiguous_split_map((8, 4), [8], 0)
    right = contiguous_split_map((8, 4), [8], 0)
    # Location 0 holds rows 4-7 first, then rows 0-3: the same plan reads the wrong rows.
    swapped = ParamAffineMap((8, 4), {0: (8, 4)}, {0: (
        AffinePiece((4, 4), 16, (4, 1), 0, (4, 1), {0}),
        AffinePiece((4, 4), 0, (4, 1), 16, (4, 1), {0}),
    )})
    batch = {"a": (target, right), "b": (target, swapped)}
    plan = plan_transfers({"a": batch["a"]})["a"]
    verdicts = verify_plans(batch, {"a": plan, "b": plan}).verdicts
    assert verdicts["a"].status == "ok"
    assert verdicts["b"].status == "invalid"


def test_a_map_with_a_forced_content_is_validated_afresh_not_remembered() -> None:
    """A map's fields cannot be forced one by one; its whole content can (``object.__setattr__``
    on the private slot). A content that is not a shared ``MapContent`` — here one holding
    mutable lists of pieces — is never a memo key: it is validated on its own (and here still
    valid), with its own name, by the planner and by the oracle alike."""
    target, source = _layer()
    with pytest.raises(AttributeError):
        object.__setattr__(source, "pieces_by_rank", {})
    forced = SimpleNamespace(
        logical_shape=source.logical_shape, shard_shapes=dict(source.shard_shapes),
        pieces_by_rank={loc: list(v) for loc, v in source.pieces_by_rank.items()}, pieces=source.content.pieces,
    )
    object.__setattr__(source, "_content", forced)
    assert source.content is forced
    twisted = {"a": _layer(), "b": (target, source)}
    plans = dict(plan_transfers({"a": _layer(), "b": _layer()}))
    verdicts = verify_plans(twisted, plans).verdicts
    assert verdicts["b"] == verify_plan(target, source, plans["b"], parameter="b")
    assert verdicts["b"].status == "ok" and verdicts["a"].status == "ok"
    fast, slow = _both(lambda: _plan_bytes(plan_transfers(twisted)))
    assert fast == slow and fast[0] == "ok"


class _Impostor:
    """A forced content that claims to equal (and hashes like) a real one while holding another
    layout: recognizing twins by identity must not be talked into taking it for that one."""

    __slots__ = ("logical_shape", "pieces", "pieces_by_rank", "real", "shard_shapes")

    def __init__(self, real: MapContent, holding: ParamAffineMap) -> None:
        self.real = real
        self.logical_shape = holding.logical_shape
        self.shard_shapes = holding.shard_shapes
        self.pieces_by_rank = holding.pieces_by_rank
        self.pieces = real.pieces

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash(self.real)


def test_a_content_that_only_claims_to_equal_a_validated_one_is_validated() -> None:
    """The memo keys of both the planner and the oracle are exact ``MapContent`` objects; an
    impostor forced into a map is validated afresh and refused, as it is alone."""
    target, source = _layer()
    loc, listed = next(iter(source.pieces_by_rank.items()))
    bad = ParamAffineMap(source.logical_shape, source.shard_shapes, {
        **source.pieces_by_rank, loc: (listed[0].replace(dest_offset=listed[0].dest_offset + 1), *listed[1:])
    })
    alone = _outcome(lambda: plan_transfers({"b": (_fresh(target), bad)}))
    assert alone[0] == "InvalidMapError"
    liar = _fresh(source)
    object.__setattr__(liar, "_content", _Impostor(source.content, bad))
    assert _outcome(lambda: plan_transfers({"a": (target, source), "b": (_fresh(target), liar)})) == alone
    plan = plan_transfers({"a": (target, source)})["a"]
    verdicts = verify_plans({"a": (target, source), "b": (_fresh(target), liar)}, {"a": plan, "b": plan}).verdicts
    assert verdicts["a"].status == "ok" and verdicts["b"].status == "invalid_map"


def test_a_piece_field_cannot_be_forced_after_it_is_built() -> None:
    """What a layout key saw of a piece is what validation reads: a piece is an immutable tuple,
    so even ``object.__setattr__`` (which forces a frozen dataclass) has nothing to set."""
    target, _source = _layer()
    piece = next(iter(target.pieces_by_rank.values()))[0]
    for name in AffinePiece.FIELDS:
        with pytest.raises(AttributeError):
            object.__setattr__(piece, name, getattr(piece, name))
    assert tuple(piece) == tuple(getattr(piece, name) for name in AffinePiece.FIELDS)


def test_a_plain_tuple_equal_to_a_piece_is_never_taken_for_it() -> None:
    """A piece equals the plain tuple of its fields; a map holding such a tuple where a piece
    belongs must be refused as it would be alone, not recognized as its twin's layout."""
    target, source = _layer()
    loc, listed = next(iter(source.pieces_by_rank.items()))
    plain = {**source.pieces_by_rank, loc: (tuple(listed[0]), *listed[1:])}
    forged = ParamAffineMap(source.logical_shape, source.shard_shapes, plain)  # type: ignore[arg-type]
    assert forged == source  # equal as values: only the exact type check tells them apart
    alone = _outcome(lambda: plan_transfers({"b": (_fresh(target), forged)}))
    assert alone[0] == "InvalidMapError" and "piece 0: expected an AffinePiece, got tuple" in alone[1]
    assert _outcome(lambda: plan_transfers({"a": _layer(), "b": (_fresh(target), forged)})) == alone
    plan = plan_transfers({"a": _layer()})["a"]
    verdicts = verify_plans({"a": _layer(), "b": (_fresh(target), forged)}, {"a": plan, "b": plan}).verdicts
    assert verdicts["a"].status == "ok"
    assert verdicts["b"].status == "invalid_map"
    assert "expected an AffinePiece, got tuple" in (verdicts["b"].map_error or "")


class _Meddling(Mapping[str, MapPair]):
    """A batch whose lookup of ``later`` replaces ``earlier``'s source content (the one thing of a
    map that ``object.__setattr__`` can force) while the planner reads pairs one by one."""

    def __init__(self, pairs: dict[str, MapPair], earlier: str, later: str, content: MapContent) -> None:
        self.pairs, self.earlier, self.later, self.content = pairs, earlier, later, content

    def __getitem__(self, name: str) -> MapPair:
        if name == self.later:
            object.__setattr__(self.pairs[self.earlier][1], "_content", self.content)
        return self.pairs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


def test_a_map_cannot_change_after_it_is_built() -> None:
    """What was validated for a map is what it holds: no field can be assigned, forced or
    deleted, its mappings are read-only views, and its values are immutable."""
    target, source = _layer()
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.logical_shape = (1, 1)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del source.shard_shapes  # type: ignore[misc]
    for field in ("logical_shape", "shard_shapes", "pieces_by_rank"):
        with pytest.raises(AttributeError):
            object.__setattr__(source, field, getattr(target, field))
    for field in ("logical_shape", "shard_shapes", "pieces_by_rank", "pieces"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(source.content, field, getattr(target.content, field))
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(source.content, field)
    loc = next(iter(source.pieces_by_rank))
    with pytest.raises(TypeError):
        source.pieces_by_rank[loc] = ()  # type: ignore[index]
    with pytest.raises(TypeError):
        dict.update(source.pieces_by_rank, {loc: ()})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        source.shard_shapes[loc] = (1,)  # type: ignore[index]
    again = ParamAffineMap(list(source.logical_shape), dict(source.shard_shapes), dict(source.pieces_by_rank))
    assert again == source and again.content is source.content  # equal content: one shared object


def test_a_twin_is_compared_with_what_was_validated_not_with_what_its_map_became() -> None:
    """After 'a' is validated its map's content is replaced (a piece moved off its shard); 'b'
    arrives with exactly that content. It must be validated and refused, as alone: a layout is
    remembered under the content it was validated for, never under what a map holds later."""
    target, source = _layer()
    loc, listed = next(iter(source.pieces_by_rank.items()))
    broken = {loc: (listed[0].replace(dest_offset=listed[0].dest_offset + 1), *listed[1:])}
    bad = ParamAffineMap(source.logical_shape, source.shard_shapes, {**source.pieces_by_rank, **broken})
    alone = _outcome(lambda: plan_transfers({"b": (_fresh(target), bad)}))
    assert alone[0] == "InvalidMapError"
    batch = _Meddling({"a": (target, source), "b": (_fresh(target), bad)}, "a", "b", bad.content)
    assert _outcome(lambda: plan_transfers(batch)) == alone


# -- what the policy is handed --------------------------------------------------------------------


class _Poison:
    """A parameter name that raises on any use: a policy that reads names would fail on it."""

    def _refuse(self, *args: object) -> Any:
        raise AssertionError("a read-only policy used a parameter name")

    __eq__ = __hash__ = __lt__ = __str__ = __format__ = __len__ = _refuse


@pytest.mark.parametrize("scenario", ["llama-sync", "moe-gather-64", "uneven"])
def test_read_only_policies_answer_the_shared_requests_as_they_answer_named_copies(scenario: str) -> None:
    """``balanced``, ``lpt``, ``first_holder`` and every ``split_balanced_policy`` get the layout's
    shared requests, not copies: their answers must equal the answers to copies named for each
    parameter, and to copies whose name is unusable (so no answer can depend on a name)."""
    from refplan import planner
    from refplan.cli.bench import SCENARIOS
    from refplan.limits import PlanBudget
    from refplan.policies import balanced, first_holder, lpt, split_balanced, split_balanced_policy

    s = SCENARIOS[scenario]()
    prepared, _sizes, _floor = planner._prepare_batch(
        s.pairs, PlanBudget(), s.endpoints, s.element_size, s.process_node, None
    )
    requests = [r for p in prepared for r in p.requests]
    names = [p.name for p in prepared for _ in p.requests]
    poisoned = [planner._renamed(r, _Poison()) for r in requests]  # type: ignore[arg-type]
    for policy in (balanced, lpt, first_holder, split_balanced, split_balanced_policy(min_split_bytes=64)):
        handed = planner._for_policy(policy, requests, names)
        assert all(a is b for a, b in zip(handed, requests)), "read-only policies get no copies"
        named = tuple(map(planner._renamed, requests, names))
        assert policy(handed) == policy(named) == policy(poisoned)


def test_any_other_policy_gets_copies_named_for_each_parameter() -> None:
    target = contiguous_split_map((8, 8), [4, 4], 0)
    source = replicate(contiguous_split_map((8, 8), [4, 4], 0), 2)
    pairs = {f"p{i}": (_fresh(target), _fresh(source)) for i in range(3)}
    seen: list[Any] = []

    def policy(requests: Any) -> list[int]:
        seen.extend(requests)
        answers = [max(c.source_rank for c in r.candidates) for r in requests]  # the second replica
        for r in requests:  # forcing a field of a copy must change nothing the planner checks
            object.__setattr__(r, "candidates", ())
        return answers

    plans = plan_transfers(pairs, replica_policy=policy)
    assert [r.parameter for r in seen] == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert len({id(r) for r in seen}) == 6
    assert plans["p0"].segments == plans["p1"].segments == plans["p2"].segments


def test_layouts_alike_in_shape_and_locations_are_each_validated_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seven layouts alike in shapes and locations (different cuts), three parameters each: each
    distinct (target, source) layout is validated once, every parameter gets its own layout's
    plan, and with the memo off every parameter is validated (the count can tell them apart)."""
    from refplan import planner

    source = replicate(contiguous_split_map((8, 4), [8], 0), 2)
    batch = {f"{copy}.{cut}": (contiguous_split_map((8, 4), [cut, 8 - cut], 0), _fresh(source))
             for copy in range(3) for cut in range(1, 8)}
    normalized: list[str] = []
    real = planner.normalize

    def counting(param_map: Any, side: str, *args: Any) -> Any:
        normalized.append(side)
        return real(param_map, side, *args)

    monkeypatch.setattr(planner, "normalize", counting)
    fast, slow = _both(lambda: _plan_bytes(plan_transfers(batch)))
    assert fast == slow and fast[0] == "ok"
    assert len(normalized) == 2 * 7 + 2 * 21  # fast: once per distinct layout; slow: per parameter
    plans = fast[1]
    assert all(plans[f"{copy}.{cut}"] == plans[f"0.{cut}"] for copy in range(3) for cut in range(1, 8))
