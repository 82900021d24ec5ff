"""The oracle against an outside probe (thirty-seventh session): ways it answered wrongly.

Each test failed before its fix: an ``ok`` for a wrong plan through an int whose ``__int__``
differs from its value; every verdict a true object; a segment object with a stride past the
2**62 cap judged ``ok`` while the same plan as a dict or file is refused; the caller's own
exceptions escaping ``verify_plan`` as bare tracebacks.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from refplan import ParamAffineMap, contiguous_split_map, verify_plan, verify_plans
from refplan.plan import TransferPlan, TransferSegment
from refplan.testing import assert_plan_valid


class _Sneaky(int):
    """Value 0, but ``int()`` says 2: the integer rule is ``__index__``'s value."""

    def __int__(self) -> int:
        return 2


SOURCE = contiguous_split_map((4,), [2, 2], 0)
TARGET = contiguous_split_map((4,), [4], 0)


def _segments(offset: Any) -> list[dict[str, Any]]:
    # The second segment's target offset is 0 by value: both write [0, 2), [2, 4) is never written.
    return [{"shape": [2], "source": [0, 0, [1]], "target": [0, 0, [1]]},
            {"shape": [2], "source": [1, 0, [1]], "target": [0, offset, [1]]}]


def test_an_int_whose_int_differs_from_its_value_is_judged_at_its_value() -> None:
    wrong = _segments(_Sneaky(0))
    assert verify_plan(TARGET, SOURCE, json.loads(json.dumps(wrong))).status == "invalid"  # as any file reads it
    assert verify_plan(TARGET, SOURCE, wrong).status == "invalid"
    objects = [TransferSegment(0, 0, (1,), 0, 0, (1,), (2,)), TransferSegment(1, 0, (1,), 0, _Sneaky(0), (1,), (2,))]
    assert verify_plan(TARGET, SOURCE, objects).status == "invalid"
    assert verify_plan(TARGET, SOURCE, TransferPlan(tuple(objects), (4,), 4)).status == "invalid"
    assert verify_plans({"w": (TARGET, SOURCE)}, {"w": wrong}).status == "invalid"
    with pytest.raises(AssertionError):
        assert_plan_valid(TARGET, SOURCE, wrong)
    assert verify_plan(TARGET, SOURCE, _segments(2)).ok  # the right plan, for contrast


def test_a_map_key_is_read_by_the_integer_rule() -> None:
    entry = TARGET.to_dict()
    entry["ranks"] = {_Sneaky(0): entry["ranks"][0]}
    assert ParamAffineMap.from_dict(entry).ranks == (0,)


def test_a_verdict_is_true_only_when_ok() -> None:
    invalid = verify_plan(TARGET, SOURCE, _segments(0))
    assert invalid.status == "invalid" and not invalid
    assert verify_plan(TARGET, SOURCE, _segments(2))
    batch = verify_plans({"w": (TARGET, SOURCE)}, {"w": _segments(0)})
    assert not batch and verify_plans({"w": (TARGET, SOURCE)}, {"w": _segments(2)})


def test_a_segment_object_past_the_cap_is_refused_as_its_dict_is() -> None:
    source = contiguous_split_map((2, 4), [1, 1], 0)
    target = contiguous_split_map((2, 4), [2], 0)
    huge = 2**64 + 4  # on an extent-1 axis: never stepped, so no range check bounds it
    for stride in (huge, -huge, 2**62 + 1):
        segments = (TransferSegment(0, 0, (stride, 1), 0, 0, (4, 1), (1, 4)),
                    TransferSegment(1, 0, (stride, 1), 0, 4, (4, 1), (1, 4)))
        plan = TransferPlan(segments, (2, 4), 8)
        for form in (plan, list(segments), plan.to_dict()):
            verdict = verify_plan(target, source, form)
            assert verdict.status == "invalid" and "above 2**62" in verdict.reason, verdict
    fine = (TransferSegment(0, 0, (2**62, 1), 0, 0, (4, 1), (1, 4)),
            TransferSegment(1, 0, (4, 1), 0, 4, (4, 1), (1, 4)))
    assert verify_plan(target, source, TransferPlan(fine, (2, 4), 8)).ok  # at the cap: accepted, as a file's


class _RaisingIter(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("iter")


class _RaisingIndex:
    def __index__(self) -> int:
        raise RuntimeError("index")


@pytest.mark.parametrize("where", ["shape", "strides", "offset", "logical_shape"])
def test_the_callers_own_exception_is_a_malformed_plan_not_a_traceback(where: str) -> None:
    segments = _segments(2)
    plan: dict[str, Any] = {"logical_shape": [4], "segments": segments}
    if where == "shape":
        segments[1]["shape"] = _RaisingIter([2])
    elif where == "strides":
        segments[1]["target"] = [0, 2, _RaisingIter([1])]
    elif where == "offset":
        segments[1]["target"] = [0, _RaisingIndex(), [1]]
    else:
        plan["logical_shape"] = _RaisingIter([4])
    verdict = verify_plan(TARGET, SOURCE, plan)
    assert verdict.status == "invalid" and "malformed plan" in verdict.reason, verdict


def test_a_bug_in_refplans_own_reading_stays_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the caller's objects' exceptions are a malformed plan: one raised inside refplan's own
    code (here made to fail in refplan.box) is a bug of ours, and judging a correct plan "invalid"
    for it would blame the plan (a review of the change)."""
    import refplan.plan
    from refplan.box import volume

    monkeypatch.setattr(refplan.plan, "_capped", lambda *args: volume(None))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        verify_plan(TARGET, SOURCE, _segments(2))


class _LyingDict(dict):  # type: ignore[type-arg]
    def __contains__(self, key: object) -> bool:
        return True  # says "segments" is there; the lookup itself (C) then raises KeyError


class _CallsBack(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        from refplan.box import volume

        volume(2)  # type: ignore[arg-type]  # the caller's own method, failing inside refplan
        return super().__iter__()


def test_the_callers_failures_stay_malformed_plans_whatever_frame_raised() -> None:
    """Whether an exception is the caller's is decided by the input (anything not plain), not by
    the innermost frame: a C-level lookup has none, and a caller's method may call into refplan
    (a second review)."""
    assert verify_plan(TARGET, SOURCE, _LyingDict(logical_shape=[4])).status == "invalid"
    plan = {"logical_shape": [4], "segments": _segments(2)}
    plan["segments"][1]["shape"] = _CallsBack([2])
    verdict = verify_plan(TARGET, SOURCE, plan)
    assert verdict.status == "invalid" and "malformed plan" in verdict.reason, verdict
