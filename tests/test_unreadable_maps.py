"""Maps whose own code raises while they are read: a ``ParamAffineMap`` subclass, or a map of
``AffinePiece`` subclasses (both allowed: such a map gets a content of its own and shares nothing),
whose properties are the caller's code. The oracle promises never to raise on input, so such a map
is an ``invalid_map`` verdict ("cannot be read", naming the side), as a segment that cannot be read
is a malformed plan; the planner refuses it with ``InvalidMapError`` naming the parameter and the
side, the map's own exception chained as ``__cause__`` (as a policy's is ``PolicyRaisedError``'s).
Both raised the map's bare ``RuntimeError`` from deep inside before.

And a verdict is never lent from such a map to another parameter: its content is read afresh for
each parameter that gives it, so a reading that changes is judged as it reads then.
"""

from __future__ import annotations

from typing import Any

import pytest

from refplan import (
    AffinePiece,
    InvalidMapError,
    ParamAffineMap,
    contiguous_split_map,
    plan_transfer,
    plan_transfers,
    verify_plan,
    verify_plans,
)
from refplan.maps import MapContent

TARGET = contiguous_split_map((4, 6), [2, 2], 0)
SOURCE = contiguous_split_map((4, 6), [4], 0)
PLAN = plan_transfers({"w": (TARGET, SOURCE)})["w"]
_DEST_OFFSET = AffinePiece.FIELDS.index("dest_offset")


class _Raising(AffinePiece):
    """A piece whose ``dest_offset`` is the caller's code, and raises."""

    __slots__ = ()

    @property
    def dest_offset(self) -> int:  # type: ignore[override]
        raise RuntimeError("no offset today")


class _ShapelessMap(ParamAffineMap):
    """A map subclass whose ``logical_shape`` raises."""

    @property
    def logical_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        raise RuntimeError("no shape today")


def _with_pieces(m: ParamAffineMap, cls: type[AffinePiece]) -> ParamAffineMap:
    pieces = {loc: tuple(cls(*p) for p in held) for loc, held in m.pieces_by_rank.items()}
    return ParamAffineMap(m.logical_shape, m.shard_shapes, pieces)


def _unreadable_maps() -> list[tuple[str, Any]]:
    raising = _with_pieces(TARGET, _Raising)
    assert type(raising.content) is not MapContent  # a content of its own, as the maps module says
    return [
        ("no offset today", raising),
        ("no shape today", _ShapelessMap(TARGET.logical_shape, TARGET.shard_shapes, TARGET.pieces_by_rank)),
    ]


@pytest.mark.parametrize("words, bad", _unreadable_maps(), ids=["piece-subclass", "map-subclass"])
def test_the_oracle_gives_a_verdict_for_a_map_that_cannot_be_read(words: str, bad: Any) -> None:
    for verdict, side in (
        (verify_plan(bad, SOURCE, PLAN, parameter="w"), "target"),
        (verify_plan(SOURCE, bad, PLAN, parameter="w"), "source"),
        (verify_plans({"w": (bad, SOURCE)}, {"w": PLAN}).verdicts["w"], "target"),
        (verify_plans({"w": (SOURCE, bad)}, {"w": PLAN}).verdicts["w"], "source"),
    ):
        _assert_unreadable(verdict, side, words)


def _assert_unreadable(verdict: Any, side: str, words: str) -> None:
    assert (verdict.status, verdict.parameter) == ("invalid_map", "w"), verdict
    assert verdict.map_error == f"{side} map cannot be read: RuntimeError: {words}"
    assert verdict.reason == "a map cannot be read, so the plan was not judged"


@pytest.mark.parametrize("words, bad", _unreadable_maps(), ids=["piece-subclass", "map-subclass"])
def test_segment_counterexamples_of_a_map_that_cannot_be_read_are_none(words: str, bad: Any) -> None:
    """``refplan verify --all``'s per-segment judgements: none for maps that cannot be read (the
    plan's verdict says why), as for maps that are refused."""
    from refplan.verify import segment_counterexamples

    assert segment_counterexamples(bad, SOURCE, PLAN) == ([], 0)
    assert segment_counterexamples(SOURCE, bad, PLAN) == ([], 0)


def test_a_dict_form_whose_values_cannot_be_read_is_invalid_map() -> None:
    class Unlistable(list[int]):
        def __iter__(self) -> Any:
            raise RuntimeError("no iteration today")

    class Lengthless(dict[str, Any]):
        def __len__(self) -> int:
            raise RuntimeError("no length today")

    as_dict = TARGET.to_dict()
    as_dict["logical_shape"] = Unlistable([4, 6])
    for verdict, side in (
        (verify_plan(as_dict, SOURCE, PLAN, parameter="w"), "target"),
        (verify_plan(SOURCE, as_dict, PLAN, parameter="w"), "source"),
    ):
        _assert_unreadable(verdict, side, "no iteration today")
    # Read first to tell a batch given as a map (``verify_plans``' arguments) from one map.
    lengthless = Lengthless(TARGET.to_dict())
    for verdict, side in (
        (verify_plan(lengthless, SOURCE, PLAN, parameter="w"), "target"),
        (verify_plan(SOURCE, lengthless, PLAN, parameter="w"), "source"),
    ):
        _assert_unreadable(verdict, side, "no length today")


@pytest.mark.parametrize("words, bad", _unreadable_maps(), ids=["piece-subclass", "map-subclass"])
def test_the_planner_refuses_a_map_that_cannot_be_read_naming_parameter_and_side(words: str, bad: Any) -> None:
    for call, side, name in (
        (lambda: plan_transfers({"w": (bad, SOURCE)}), "target", "w"),
        (lambda: plan_transfers({"ok": (TARGET, SOURCE), "w": (SOURCE, bad)}), "source", "w"),
        (lambda: plan_transfer(bad, SOURCE), "target", "param"),
    ):
        with pytest.raises(InvalidMapError) as caught:
            call()
        assert str(caught.value) == f"parameter {name!r}: the {side} map cannot be read: RuntimeError: {words}"
        assert isinstance(caught.value.__cause__, RuntimeError)
    # Both maps are the caller's code: either may have raised, and the refusal says so.
    with pytest.raises(InvalidMapError) as caught:
        plan_transfers({"w": (bad, _with_pieces(SOURCE, _Raising))})
    assert str(caught.value) == f"parameter 'w': the target or the source map cannot be read: RuntimeError: {words}"


def test_a_bug_reading_plain_maps_is_not_relabelled_as_the_maps_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain maps (exact classes, shared content) are values: an exception while reading them is
    refplan's own failure and must surface as it is, in the planner and in the oracle."""
    from refplan import planner
    from refplan.oracle import judge

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("refplan bug")

    monkeypatch.setattr(planner, "_prepare", broken)
    with pytest.raises(RuntimeError, match="refplan bug"):
        plan_transfers({"w": (TARGET, SOURCE)})
    monkeypatch.setattr(judge, "validated", broken)  # segment_counterexamples reads the maps by it
    monkeypatch.setattr(judge, "validated_parts", broken)  # a verdict, in spec/validation.md's order
    with pytest.raises(RuntimeError, match="refplan bug"):
        verify_plan(TARGET, SOURCE, PLAN)
    from refplan.verify import segment_counterexamples

    with pytest.raises(RuntimeError, match="refplan bug"):
        segment_counterexamples(TARGET, SOURCE, PLAN)
    # The same failure while reading a map that is not plain is the map's (its code may be what raised).
    odd = _with_pieces(TARGET, type("Tagged", (AffinePiece,), {"__slots__": ()}))
    verdict = verify_plan(odd, odd, PLAN)
    assert verdict.status == "invalid_map"
    assert verdict.map_error == "source map cannot be read: RuntimeError: refplan bug"
    with pytest.raises(InvalidMapError, match="the target map cannot be read: RuntimeError: refplan bug"):
        plan_transfers({"w": (odd, SOURCE)})


def test_a_verdict_is_never_lent_from_a_map_whose_content_is_its_own() -> None:
    """Two parameters give the very same map object (of piece subclasses) and the very same plan
    object: the second is judged on what the map reads then, not handed the first's verdict
    (``judge._remember`` files only verdicts on shared contents). Here the pieces answer truthfully
    for the first judgement and shift every shard offset by one after it."""
    reads = [0]
    truthful = [0]

    class Shifting(AffinePiece):
        __slots__ = ()

        @property
        def dest_offset(self) -> int:  # type: ignore[override]
            reads[0] += 1
            value: int = tuple.__getitem__(self, _DEST_OFFSET)
            return value if reads[0] <= truthful[0] else value + 1

    shifting = _with_pieces(TARGET, Shifting)
    truthful[0] = 10**9
    assert verify_plan(shifting, SOURCE, PLAN).status == "ok"
    truthful[0], reads[0] = reads[0], 0  # truthful for exactly one judgement's reads
    batch = verify_plans({"a": (shifting, SOURCE), "b": (shifting, SOURCE)}, {"a": PLAN, "b": PLAN})
    assert batch.verdicts["a"].status == "ok"
    assert batch.verdicts["b"].status == "invalid_map"
    assert "outside the shard" in (batch.verdicts["b"].map_error or "")
