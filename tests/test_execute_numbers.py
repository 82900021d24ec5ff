"""Numbers a plan carries, checked before the verdict by arithmetic (issue 26, item 3).

A stride of 2**63 on an extent-1 axis passed every range check (those multiply a stride by
extent − 1) and overflowed in ``torch.as_strided`` only while bytes were moving: the sender
failed to post and its receiver waited out the whole timeout, partly written. Plan files refuse
such numbers where they enter (``TransferPlan.from_dict``, the maps' 2**62 cap); the executor
refuses, on every process, any stride or last byte that torch's int64 arithmetic cannot hold in
bytes of the parameter's dtype. One process suffices: the check is one every process makes
identically (the collective path is ``test_execute.py``'s ``hostile_plans`` scenario).
"""

from __future__ import annotations

import pytest
import torch
from conftest import AnsweringSegment, answering

from refplan import TransferEndpoints, TransferSegment
from refplan.errors import InvalidMapError
from refplan.execute import TransferRejectedError, execute_transfer
from refplan.maps import contiguous_split_map
from refplan.plan import TransferPlan
from refplan.planner import plan_transfers

pytestmark = pytest.mark.timeout(60)

ENDS = TransferEndpoints({0: 0}, {0: 0})


def _plan_dict(shape: list[int], source: list[object], target: list[object]) -> dict[str, object]:
    return {"logical_shape": [4], "segments": [{"shape": shape, "source": source, "target": target}]}


@pytest.mark.parametrize(
    ("shape", "source", "target", "where"),
    [
        ([1, 4], [0, 0, [2**63, 1]], [0, 0, [4, 1]], "$.segments[0].source[2][0]: stride 9223372036854775808"),
        ([1, 4], [0, 0, [4, 1]], [0, 0, [4, -(2**62) - 1]], "$.segments[0].target[2][1]: stride"),
        ([4], [0, 2**62 + 1, [1]], [0, 0, [1]], "$.segments[0].source[1]: offset"),
        ([2**63, 1], [0, 0, [1, 1]], [0, 0, [1, 1]], "$.segments[0].shape[0]: extent"),
    ],
)
def test_plan_files_refuse_numbers_past_the_cap(
    shape: list[int], source: list[object], target: list[object], where: str
) -> None:
    with pytest.raises(InvalidMapError, match="above 2\\*\\*62") as info:
        TransferPlan.from_dict(_plan_dict(shape, source, target))
    assert str(info.value).startswith(where), str(info.value)


def test_plan_files_accept_the_cap_itself() -> None:
    plan = TransferPlan.from_dict(_plan_dict([1, 4], [0, 2**62, [2**62, 1]], [0, 0, [4, 1]]))
    assert plan.segments[0].source_strides == (2**62, 1) and plan.segments[0].source_offset == 2**62


def _run(segment: TransferSegment, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    source = torch.arange(1, 5).to(dtype)
    target = torch.zeros(4, dtype=dtype)
    plan = TransferPlan((segment,), (4,), segment.numel)
    execute_transfer(plan, {0: source}, {0: target}, ENDS, dtype=dtype)
    return source, target


@pytest.mark.parametrize("side", ["source", "target"])
def test_stride_past_int64_on_an_extent_one_axis_is_refused_before_anything_moves(side: str) -> None:
    """Used to pass every check and fail with ``moving failed after the verdict``."""
    huge = (2**63, 1)
    segment = TransferSegment(0, 0, huge if side == "source" else (4, 1), 0, 0,
                              huge if side == "target" else (4, 1), (1, 4))
    with pytest.raises(TransferRejectedError, match=f"{side} stride {2**63} on axis 0 is"):
        _run(segment, torch.float32)


def test_byte_limits_follow_the_dtype() -> None:
    """The same element stride is fine for a 1-byte dtype and refused for an 8-byte one, whose
    bytes it would take past 2**63; the last byte of a side is bounded the same way."""
    segment = TransferSegment(0, 0, (2**60, 1), 0, 0, (4, 1), (1, 4))
    source, target = _run(segment, torch.int8)
    assert torch.equal(source, target)
    with pytest.raises(TransferRejectedError, match="2\\*\\*63"):
        _run(segment, torch.float64)
    beyond = TransferSegment(0, 0, (2**62 + 1, 1), 0, 0, (4, 1), (1, 4))  # fits int64 bytes, past the readers' cap
    with pytest.raises(TransferRejectedError, match="above 2\\*\\*62 elements"):
        _run(beyond, torch.int8)
    far = TransferSegment(0, 2**61, (1,), 0, 0, (1,), (4,))  # offset 2**61 elements of 8 bytes: 2**64 bytes
    with pytest.raises(TransferRejectedError, match="source side ends at byte"):
        _run(far, torch.float64)


def test_failures_after_the_verdict_say_targets_may_be_partly_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while moving (here forced in a local copy) says what the caller must assume."""
    from refplan.execute import TransferExecutionError, call

    def broken(*args: object, **kwargs: object) -> tuple[int, int, dict[int, int], dict[int, int]]:
        raise RuntimeError("forced")

    monkeypatch.setattr(call, "_move", broken)  # where _execute looks it up
    with pytest.raises(TransferExecutionError, match="target buffers may be partly written"):
        _run(TransferSegment(0, 0, (1,), 0, 0, (1,), (4,)), torch.float32)


def test_a_segment_subclass_is_read_once_and_what_moves_is_what_was_checked() -> None:
    """A plan's numbers are checked before the verdict and then read again to move the bytes; a
    subclass whose property answers each read differently made the two differ (checked in range,
    moved elsewhere, returned normally). Each field is read once per call, on every call (such a
    plan is never remembered between calls), and the bytes move by that one reading; with
    ``maps`` the oracle judges that same reading."""
    halves = TransferEndpoints({0: 0, 1: 0}, {0: 0})
    rows = contiguous_split_map((4, 4), [2, 2], 0)
    whole = contiguous_split_map((4, 4), [4], 0)
    plan = plan_transfers({"w": (whole, rows)}, endpoints=halves, element_size={"w": 4})["w"]
    first, second = plan.segments
    assert second.target_offset == 8
    sources = {0: torch.arange(8, dtype=torch.float32), 1: torch.arange(8, 16, dtype=torch.float32)}

    def run(*answers: object, maps: bool = False) -> torch.Tensor:
        odd = TransferPlan((first, answering(second, *answers)), (4, 4), 16)
        target = torch.full((16,), -1.0)
        AnsweringSegment.reads = 0
        try:
            execute_transfer(odd, sources, {0: target}, halves, dtype=torch.float32,
                             maps=(whole, rows) if maps else None)
        finally:
            assert AnsweringSegment.reads == 1, f"target_offset read {AnsweringSegment.reads} times"
        return target

    for _ in range(2):  # the same plan objects again: nothing of them is remembered
        assert torch.equal(run(8, 0), torch.arange(16, dtype=torch.float32))
    assert torch.equal(run(8, 0, maps=True), torch.arange(16, dtype=torch.float32))
    with pytest.raises(TransferRejectedError, match="invalid"):
        run(0, 8, maps=True)  # the one reading writes offset 0 twice: the oracle says so, nothing moves
    out = run(0, 8)  # without maps, what was read moves (the executor checks numbers, not coverage)
    assert torch.equal(out[:8], torch.arange(8, 16, dtype=torch.float32)) and bool((out[8:] == -1).all())
    with pytest.raises(TransferRejectedError, match=r"segment 1: target offset \[8\] is not an int"):
        run([8], 8)


def test_the_budget_and_the_endpoints_are_read_once_too() -> None:
    """The same rule for the call's other arguments: a ``StagingBudget`` or ``TransferEndpoints``
    subclass whose properties count their reads is read once per call (each field, each table),
    and the sync is the one those readings describe; a budget that is not positive ints is refused
    naming every field."""
    from refplan.execute import StagingBudget

    reads: dict[str, int] = {}

    def counted(name: str, value: object) -> property:
        def get(self: object) -> object:
            reads[name] = reads.get(name, 0) + 1
            return value
        return property(get)

    class Budget(StagingBudget):
        pass

    class Ends(TransferEndpoints):
        pass

    for name in ("bytes_per_peer", "total_bytes", "max_chunks", "max_rounds", "max_work"):
        setattr(Budget, name, counted(name, getattr(StagingBudget(), name)))
    halves = TransferEndpoints({0: 0, 1: 0}, {0: 0})
    Ends.source = counted("source", halves.source)  # type: ignore[assignment]
    Ends.target = counted("target", halves.target)  # type: ignore[assignment]
    rows = contiguous_split_map((4, 4), [2, 2], 0)
    whole = contiguous_split_map((4, 4), [4], 0)
    plan = plan_transfers({"w": (whole, rows)}, endpoints=halves, element_size={"w": 4})["w"]
    sources = {0: torch.arange(8, dtype=torch.float32), 1: torch.arange(8, 16, dtype=torch.float32)}
    budget, ends = object.__new__(Budget), object.__new__(Ends)
    for _ in range(2):
        reads.clear()
        target = torch.full((16,), -1.0)
        execute_transfer(plan, sources, {0: target}, ends, dtype=torch.float32, budget=budget)
        assert torch.equal(target, torch.arange(16, dtype=torch.float32))
        assert reads == dict.fromkeys(
            ("bytes_per_peer", "total_bytes", "max_chunks", "max_rounds", "max_work", "source", "target"), 1
        ), reads
    with pytest.raises(TransferRejectedError, match=r"got StagingBudget\(bytes_per_peer=0, total_bytes="):
        execute_transfer(plan, sources, {0: torch.zeros(16)}, halves, dtype=torch.float32,
                         budget=StagingBudget(bytes_per_peer=0))


def test_the_dtypes_are_read_once_per_call_and_the_digest_names_the_dtype_checked() -> None:
    """``dtypes`` of a ``Mapping`` type other than ``dict`` is read once per call, one lookup per
    parameter: the batch key, the checks and the digest each looked a dtype up (three readings on
    a first call), so a mapping answering float32 and then int32 had the processes agree on a
    digest naming one dtype while they checked and moved by another. One that cannot be read is
    refused by name, never an unexpected error."""
    from collections.abc import Iterator, Mapping

    from refplan.execute import execute_transfers

    reads: list[str] = []

    class Answering(Mapping[str, torch.dtype]):
        def __getitem__(self, name: str) -> torch.dtype:
            reads.append(name)
            return torch.float32 if len(reads) == 1 else torch.int32

        def __iter__(self) -> Iterator[str]:
            return iter(["w"])

        def __len__(self) -> int:
            return 1

    rows = contiguous_split_map((4, 4), [2, 2], 0)
    whole = contiguous_split_map((4, 4), [4], 0)
    halves = TransferEndpoints({0: 0, 1: 0}, {0: 0})
    plans = plan_transfers({"w": (whole, rows)}, endpoints=halves, element_size={"w": 4})
    sources = {"w": {0: torch.arange(8, dtype=torch.float32), 1: torch.arange(8, 16, dtype=torch.float32)}}
    for call in range(2):
        reads.clear()
        target = torch.full((16,), -1.0)
        execute_transfers(plans, sources, {"w": {0: target}}, halves, dtypes=Answering())
        assert reads == ["w"], (call, reads)
        assert torch.equal(target, torch.arange(16, dtype=torch.float32))

    class Unreadable(Answering):
        def __getitem__(self, name: str) -> torch.dtype:
            raise RuntimeError("no")

    with pytest.raises(TransferRejectedError, match=r"dtypes cannot be read: RuntimeError: no"):
        execute_transfers(plans, sources, {"w": {0: torch.zeros(16)}}, halves, dtypes=Unreadable())
