"""What the Python API does with a caller's odd or mistaken arguments that no file can carry: a
scalar parameter's element copied as a segment with axes, integers too long for ``str`` (more than
4 300 digits: JSON readers refuse them, a Python caller can pass them), endpoints in a maps file's
shape, parameter names of mixed types, and a ``fallback_elements`` that is not a count.

Each case once raised a bare ``IndexError``, ``ValueError``, ``AttributeError`` or ``TypeError``
from deep inside the oracle, the planner or the executor (found by probing the API, 2026-12-06);
each now gets a verdict, or an error of the right class that says what is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from refplan import (
    AffinePiece,
    AffineTransferError,
    InvalidMapError,
    InvalidReplicaPolicyError,
    ParamAffineMap,
    PlanBudget,
    ReplicaPart,
    TransferEndpoints,
    TransferPlan,
    TransferSegment,
    contiguous_split_map,
    plan_transfer,
    plan_transfers,
    replicate,
    verify_plan,
    verify_plans,
)
from refplan.errors import show_int, show_ints, show_list
from refplan.execute import TransferRejectedError, execute_transfer
from refplan.oracle.stream import verify_stream

HUGE = 10**5000  # str() refuses it: more than sys.get_int_max_str_digits() (4 300) digits


def _scalar_maps() -> tuple[ParamAffineMap, ParamAffineMap]:
    target = ParamAffineMap((), {0: ()}, {0: [AffinePiece((), 0, (), 0, (), {0})]})
    source = ParamAffineMap((), {5: (), 6: ()}, {5: [AffinePiece((), 0, (), 0, (), {5, 6})],
                                                  6: [AffinePiece((), 0, (), 0, (), {5, 6})]})
    return target, source


def _seg(
    source: int, shape: tuple[int, ...], s_strides: tuple[int, ...], t_strides: tuple[int, ...]
) -> TransferSegment:
    return TransferSegment(source, 0, s_strides, 0, 0, t_strides, shape)


@pytest.mark.parametrize(("plan", "status", "needle"), [
    ([_seg(5, (1,), (1,), (1,))], "ok", "verified"),
    ([_seg(6, (1, 1), (1, 1), (1, 1))], "ok", "verified"),
    ([_seg(5, (1, 1, 1), (7, 7, 7), (3, 3, 3))], "ok", "verified"),  # strides on extent-1 axes address nothing
    ([_seg(5, (1, 1), (1, 1), (1, 1)), _seg(6, (1,), (1,), (1,))], "invalid", "written more than once"),
    ([_seg(5, (2,), (0,), (0,))], "invalid", "more than once"),
    ([_seg(5, (2,), (1,), (0,))], "invalid", "outside its 1 elements"),
    ([], "invalid", "never written"),
])
def test_a_scalar_copied_as_a_segment_with_axes_is_judged(
    plan: list[TransferSegment], status: str, needle: str
) -> None:
    """A scalar's shards have no axes; a segment of one element written with axes ((1,), (1, 1)) is
    a copy of it (element 0 to element 0), and went to the element-level fallback, which indexed
    the shard's last axis and raised ``IndexError``."""
    target, source = _scalar_maps()
    for verdict in (verify_plan(target, source, plan), verify_plans({"b": (target, source)}, {"b": plan}).verdicts["b"],
                    verify_plan(target.to_dict(), source.to_dict(), TransferPlan(tuple(plan), (), 1).to_dict())):
        assert verdict.status == status, verdict
        assert needle in verdict.reason, verdict.reason


def test_show_int_prints_what_str_prints_and_words_a_huge_one_by_its_length() -> None:
    for value in (0, -3, 2**62, -(2**62), 10**1000):
        assert show_int(value) == str(value)
    for values in ((), (4,), (4, -6), (2**62, 0, 1)):
        assert show_ints(values) == str(tuple(values))
        assert show_list(values) == str(list(values))
    assert show_int(HUGE) == f"<an integer of {HUGE.bit_length()} bits>"
    assert show_ints((0, -HUGE)) == f"(0, <an integer of {HUGE.bit_length()} bits>)"


def _pair() -> tuple[ParamAffineMap, ParamAffineMap]:
    return contiguous_split_map((4, 6), [3, 3], 1), replicate(contiguous_split_map((4, 6), [2, 2], 0), 2)


def _plan_dict_with(field: str, index: int, value: int) -> dict[str, Any]:
    target, source = _pair()
    doc = plan_transfer(target, source).to_dict()
    entry = doc["segments"][0]
    if field == "shape":
        entry["shape"][index] = value
    elif index < 2:
        entry[field][index] = value
    else:
        entry[field][2][0] = value
    return doc


def _map_with_location(value: int) -> ParamAffineMap:
    return ParamAffineMap((4, 6), {0: (4, 6)}, {0: [AffinePiece((4, 6), 0, (6, 1), 0, (6, 1), {0})], value: []})


def _map_with_empty_piece(value: int) -> ParamAffineMap:
    return ParamAffineMap((4, 6), {0: (4, 6)}, {0: [AffinePiece((4, 6), 0, (6, 1), 0, (6, 1), {0}),
                                                    AffinePiece((0, value), 0, (6, 1), 0, (6, 1), {0})]})


def _map_with_piece(**fields: Any) -> ParamAffineMap:
    piece = AffinePiece((4, 6), 0, (6, 1), 0, (6, 1), {0})._replace(**fields)
    return ParamAffineMap((4, 6), {0: (4, 6)}, {0: [piece]})


def _huge_cases() -> list[tuple[str, Callable[[int], Any]]]:
    target, source = _pair()
    plan = plan_transfer(target, source)
    whole = ParamAffineMap((4, 6), {0: (4, 6)}, {0: [AffinePiece((4, 6), 0, (6, 1), 0, (6, 1), {0})]})

    def raw(field: str, value: int) -> list[TransferSegment]:
        first = plan.segments[0]
        changed = {"shape": (value, *first.shape[1:])} if field == "shape" else {field: value}
        return [dataclasses.replace(first, **changed), *plan.segments[1:]]

    return [
        ("a map keyed by it", lambda v: ParamAffineMap((4, 6), {0: (4, 6), v: (4, 6)}, {0: [], v: []})),
        ("verify_plan: a map location", lambda v: verify_plan(target, _map_with_location(v), [])),
        ("plan_transfer: a map location", lambda v: plan_transfer(target, _map_with_location(v))),
        ("verify_plan: an empty piece's extent", lambda v: verify_plan(_map_with_empty_piece(v), source, [])),
        ("plan_transfer: an empty piece's extent", lambda v: plan_transfer(_map_with_empty_piece(v), source)),
        ("verify_plan: a piece's source offset", lambda v: verify_plan(_map_with_piece(source_offset=v), whole, [])),
        ("verify_plan: a piece's dest offset", lambda v: verify_plan(whole, _map_with_piece(dest_offset=v), [])),
        ("verify_plan: a piece's source stride", lambda v: verify_plan(_map_with_piece(source_strides=(v, 1)), whole,
                                                                        [])),
        ("verify_plan: a piece's dest stride", lambda v: verify_plan(whole, _map_with_piece(dest_strides=(v, 1)), [])),
        ("plan_transfer: a piece's source offset", lambda v: plan_transfer(whole, _map_with_piece(source_offset=v))),
        ("verify_plan: a piece's holder", lambda v: verify_plan(whole, _map_with_piece(locations={0, v}), [])),
        ("plan_transfer: a piece's holder", lambda v: plan_transfer(whole, _map_with_piece(locations={0, v}))),
        ("verify_plan: the logical shape", lambda v: verify_plan(ParamAffineMap((v, 0), {0: (v, 0)}, {0: []}),
                                                                 whole, [])),
        ("plan_transfer: the logical shape", lambda v: plan_transfer(ParamAffineMap((v, 0), {0: (v, 0)}, {0: []}),
                                                                     whole)),
        ("verify_plan: a plan dict's source location", lambda v: verify_plan(target, source,
                                                                              _plan_dict_with("source", 0, v))),
        ("verify_plan: a plan dict's target offset", lambda v: verify_plan(target, source,
                                                                            _plan_dict_with("target", 1, v))),
        ("verify_plan: a plan dict's stride", lambda v: verify_plan(target, source, _plan_dict_with("source", 2, v))),
        ("verify_plan: a plan dict's extent", lambda v: verify_plan(target, source, _plan_dict_with("shape", 0, v))),
        ("TransferPlan.from_dict: a location", lambda v: TransferPlan.from_dict(_plan_dict_with("target", 0, v))),
        ("verify_plan: a segment's source location", lambda v: verify_plan(target, source, raw("source_rank", v))),
        ("verify_plan: a segment's target location", lambda v: verify_plan(target, source, raw("target_rank", v))),
        ("verify_plan: a segment's offset", lambda v: verify_plan(target, source, raw("source_offset", v))),
        ("verify_plan: a segment's extent", lambda v: verify_plan(target, source, raw("shape", v))),
        ("verify_plans: a segment's location", lambda v: verify_plans({"w": (target, source)},
                                                                      {"w": raw("source_rank", v)})),
        ("verify_stream: a segment's location", lambda v: verify_stream({"w": (target, source)},
                                                                        [("w", raw("target_rank", v))])),
    ]


_HUGE_CASES = _huge_cases()


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("case", range(len(_HUGE_CASES)), ids=[name for name, _call in _HUGE_CASES])
def test_an_integer_too_long_to_print_is_refused_by_name_never_by_str(case: int, sign: int) -> None:
    """Each call raised ``ValueError: Exceeds the limit (4300 digits) for integer string conversion``
    while wording its own refusal (or, for the first, while naming a field it was about to check)."""
    _name, call = _HUGE_CASES[case]
    try:
        out = call(sign * HUGE)
    except AffineTransferError as exc:
        assert "4300" not in str(exc)
        return
    status = getattr(out, "status", None)
    if status is None:  # the constructor: nothing is wrong until the map is validated
        assert isinstance(out, ParamAffineMap)
        return
    assert status in ("invalid", "invalid_map"), out
    text = repr(out)  # the reason, and for invalid maps the map's error
    assert " bits>" in text or "above 2**62" in text, text


@pytest.mark.parametrize("field", ["source_rank", "target_rank", "source_offset", "shape", "source_strides"])
@pytest.mark.parametrize("sign", [1, -1])
def test_the_executor_refuses_an_integer_too_long_to_print_by_name(field: str, sign: int) -> None:
    target = source = contiguous_split_map((4, 6), [4], 0)
    plan = plan_transfer(target, source)
    first = plan.segments[0]
    value = sign * HUGE
    changed: dict[str, Any] = {
        "shape": {"shape": (value, *first.shape[1:])},
        "source_strides": {"source_strides": (value, *first.source_strides[1:])},
    }.get(field, {field: value})
    bad = TransferPlan((dataclasses.replace(first, **changed),), plan.logical_shape, plan.moved_elements)
    targets = {0: torch.full((24,), -1.0)}
    with pytest.raises(TransferRejectedError) as info:
        execute_transfer(bad, {0: torch.arange(24.0)}, targets, TransferEndpoints({0: 0}, {0: 0}), dtype=torch.float32)
    assert "unexpected" not in str(info.value) and "4300" not in str(info.value), info.value
    assert torch.equal(targets[0], torch.full((24,), -1.0))


def test_plan_transfers_names_endpoints_given_as_a_dict_and_names_of_mixed_types() -> None:
    target, source = _pair()
    with pytest.raises(TypeError, match="endpoints must be a TransferEndpoints"):
        plan_transfer(target, source, endpoints={"source": {i: i for i in range(4)}, "target": {0: 4, 1: 5}})
    with pytest.raises(TypeError, match="endpoints must be a TransferEndpoints"):
        plan_transfers({"w": (target, source)}, endpoints=[{0: 0}, {0: 0}])  # type: ignore[arg-type]
    with pytest.raises(InvalidMapError, match="parameter names must be strings"):
        plan_transfers({1: (target, source), "a": (target, source)})  # type: ignore[dict-item]


@pytest.mark.parametrize(("value", "error"), [(None, TypeError), ("10", TypeError), (2.5, TypeError),
                                              (True, TypeError), (-1, ValueError)])
def test_fallback_elements_must_be_a_count(value: Any, error: type[Exception]) -> None:
    """Read only once a segment needed the element-level fallback: ``None`` and ``"10"`` raised a
    bare ``TypeError`` from a comparison there, and 2.5 or ``True`` were compared as numbers."""
    target = ParamAffineMap((4,), {0: (4,)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), {0})]})
    source = ParamAffineMap((4,), {3: (4,)}, {3: [AffinePiece((4,), 0, (1,), 0, (1,), {3})]})
    plan = [TransferSegment(3, 0, (2, 1), 0, 0, (2, 1), (2, 2))]  # not a box: the fallback judges it
    with pytest.raises(error, match="fallback_elements must be a non-negative int"):
        verify_plan(target, source, plan, fallback_elements=value)
    with pytest.raises(error, match="fallback_elements must be a non-negative int"):
        verify_plans({"w": (target, source)}, {"w": plan}, fallback_elements=value)
    with pytest.raises(error, match="fallback_elements must be a non-negative int"):
        verify_stream({"w": (target, source)}, [("w", plan)], fallback_elements=value)
    assert verify_plan(target, source, plan, fallback_elements=np.int64(0)).status == "unverifiable"
    assert verify_plan(target, source, plan, fallback_elements=np.int64(16)).status == "ok"


def _policy(kind: str, value: int) -> Callable[[Any], list[Any]]:
    def answer(requests: Any) -> list[Any]:
        out: list[Any] = []
        for r in requests:
            origin, shape, holder = tuple(r.logical_origin), tuple(r.shape), r.candidates[0].source_rank
            out.append(value if kind == "int" else [ReplicaPart(
                (value, *origin[1:]) if kind == "origin" else origin,
                (value, *shape[1:]) if kind == "shape" else shape,
                value if kind == "location" else holder,
            )])
        return out
    return answer


@pytest.mark.parametrize("kind", ["int", "location", "origin", "shape"])
@pytest.mark.parametrize("sign", [1, -1])
def test_a_policy_answer_too_long_to_print_is_refused_by_name(kind: str, sign: int) -> None:
    target, source = _pair()
    with pytest.raises(InvalidReplicaPolicyError) as info:
        plan_transfer(target, source, replica_policy=_policy(kind, sign * HUGE))
    assert " bits>" in str(info.value), info.value


@pytest.mark.parametrize(("call", "value", "error"), [
    (lambda v: plan_transfer(*_pair(), element_size=v), HUGE, ValueError),
    (lambda v: plan_transfer(*_pair(), element_size=v), -HUGE, ValueError),
    (lambda v: PlanBudget(max_pieces_per_map=v), -HUGE, AffineTransferError),
], ids=["element_size", "-element_size", "PlanBudget"])
def test_arguments_too_long_to_print_are_refused_by_name(
    call: Callable[[int], Any], value: int, error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        call(value)
    assert " bits>" in str(info.value), info.value


def test_endpoints_with_a_location_too_long_to_print_still_plan() -> None:
    """Endpoints may bind locations no map has (they are ignored); naming one as a process's table
    entry formatted it eagerly and raised ``ValueError``."""
    target, source = _pair()
    ends = TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3, HUGE: 4}, {0: 0, 1: 1})
    assert plan_transfer(target, source, endpoints=ends).moved_elements == 24
