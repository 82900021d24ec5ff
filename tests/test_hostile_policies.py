"""Replica policies written to fool the answer checks, and policy arguments given wrong.

"A policy can be wrong, but it cannot make a plan wrong: it can only get it refused." Each test
failed before its fix (an outside review, 2026-12-06): code a policy controls ran while its
answers were checked (a part's ``logical_origin`` can be a ``tuple`` subclass) and shortened the
answers under the checks (a plan with requests left unwritten) or grew a split past
``max_parts_per_request``; refusing a split of k overlapping parts listed all k**2 overlapping
pairs first; an infinite link cost crashed the split policy; and ``process_node`` or a
non-callable ``replica_policy`` got a bare ``TypeError`` from inside, or blamed the policy.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from refplan import (
    InvalidMapError,
    InvalidReplicaPolicyError,
    PlanBudget,
    ReplicaPart,
    TransferEndpoints,
    contiguous_split_map,
    plan_transfer,
    plan_transfers,
    replicate,
    replicated_map,
    verify_plan,
)
from refplan.policies import split_balanced_policy
from refplan.policies.cost import LinkCost

SOURCE = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)  # two regions, two holders each
TARGET = contiguous_split_map((8, 4), [2, 2], 1)


def test_answers_shortened_while_they_are_checked_leave_no_request_unwritten() -> None:
    state: dict[str, list[Any]] = {}

    class Origin(tuple):  # type: ignore[type-arg]
        def __iter__(self) -> Any:  # read by the checks: drops every later answer of the list
            del state["answers"][1:]
            return super().__iter__()

    def policy(requests: Any) -> list[Any]:
        first = requests[0]
        answers: list[Any] = [[ReplicaPart(Origin(first.logical_origin), first.shape,
                                           first.candidates[0].source_rank)]]
        answers += [r.candidates[0].source_rank for r in requests[1:]]
        state["answers"] = answers
        return answers

    plan = plan_transfer(TARGET, SOURCE, replica_policy=policy)
    assert verify_plan(TARGET, SOURCE, plan).status == "ok"
    assert len(state["answers"]) == 1  # the policy did shorten its list; the checks had a copy


def test_a_split_grown_while_it_is_checked_is_planned_as_it_was_checked() -> None:
    state: dict[str, Any] = {"done": False}

    class Origin(tuple):  # type: ignore[type-arg]
        def __iter__(self) -> Any:  # replaces part 1 by three one-row parts: four in all
            if not state["done"]:
                state["done"] = True
                parts = state["parts"]
                o, s, loc = parts[1].logical_origin, parts[1].shape, parts[1].source_location
                parts[1:] = [ReplicaPart((o[0] + i, o[1]), (1, s[1]), loc) for i in range(3)]
            return super().__iter__()

    def policy(requests: Any) -> list[Any]:
        out: list[Any] = []
        for i, r in enumerate(requests):
            if i == 0:
                (a, b), (h, w) = r.logical_origin, r.shape
                locs = [c.source_rank for c in r.candidates]
                parts = [ReplicaPart(Origin((a, b)), (1, w), locs[0]), ReplicaPart((a + 1, b), (h - 1, w), locs[1])]
                state["parts"] = parts
                out.append(parts)
            else:
                out.append(r.candidates[0].source_rank)
        return out

    with pytest.raises(InvalidReplicaPolicyError, match="the split changed while it was checked: 2 parts when "
                                                        "it was read, 4 after"):
        plan_transfer(TARGET, SOURCE, PlanBudget(max_parts_per_request=2), replica_policy=policy,
                      min_split_bytes=0)
    assert len(state["parts"]) == 4  # grown after the count was read: refused, never planned as four


def test_a_million_copies_of_one_part_are_refused_at_the_first_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a budget that allows them, each of a million identical parts was checked before the
    volume sum refused them (20 s, a fuzz finding); a repeat is now refused on sight, reading the
    policy's list in place (no copy of it)."""
    import refplan.check

    reads = []
    real = refplan.check._int_tuple

    def counted(value: Any) -> Any:
        reads.append(1)
        return real(value)

    monkeypatch.setattr(refplan.check, "_int_tuple", counted)
    million = [ReplicaPart((0,), (1,), 0)] * 1_000_000
    target, source = replicated_map((10**6,), 1), replicated_map((10**6,), 2)
    with pytest.raises(InvalidReplicaPolicyError, match=r"parts 0 and 1 overlap"):
        plan_transfer(target, source, PlanBudget(max_parts_per_request=2**63), replica_policy=lambda r: [million],
                      min_split_bytes=0)
    assert len(reads) == 4  # two parts read (origin and shape each), not a million


def _split_of(parts: list[ReplicaPart]) -> Any:
    return lambda requests: [parts]


def test_a_split_of_many_identical_parts_is_refused_without_listing_their_pairs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import refplan.check

    def no_pairs(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("k identical parts need no pair query: the first repeat is the pair")

    monkeypatch.setattr(refplan.check, "first_overlap", no_pairs)
    target, source = replicated_map((1024, 1024), 1), replicated_map((1024, 1024), 2)
    k = 4096
    part = ReplicaPart((0, 0), (1, 256), 0)  # 4096 of them hold the box's 2**20 elements in number
    with pytest.raises(InvalidReplicaPolicyError, match=r"parts 0 and 1 overlap in \[0:1, 0:256\]"):
        plan_transfer(target, source, PlanBudget(max_parts_per_request=1 << 20), replica_policy=_split_of([part] * k),
                      min_split_bytes=0)


def test_a_split_of_parts_sharing_a_point_is_refused_without_subtracting_boxes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Distinct parts inside the request, summing to its volume, all starting at its origin: no
    k-d cut separates them, and the check's ``covers`` subtracted them one by one in one leaf, the
    pieces multiplying beyond count (an outside probe: 128 parts of an 8-d box took 276 s and 4 GB,
    256 did not finish). Refused now by the first overlap, without a single box subtraction; an
    exact 8-d split of as many parts still plans."""
    from refplan.box import Box

    def no_subtraction(*_args: Any) -> Any:
        raise AssertionError("the split check subtracted boxes")

    monkeypatch.setattr(Box, "subtract", no_subtraction)
    shape = (4,) * 8
    target, source = replicated_map(shape, 1), replicated_map(shape, 2)
    budget = PlanBudget(max_parts_per_request=1 << 10)
    # extents 1 or 3 per axis, every combination: 256 distinct parts whose volumes sum to 4**8
    corners = [ReplicaPart((0,) * 8, tuple(1 + (k >> axis & 1) * 2 for axis in range(8)), k % 2) for k in range(256)]
    assert sum(math.prod(p.shape) for p in corners) == 4 ** 8 and len(set(corners)) == 256
    with pytest.raises(InvalidReplicaPolicyError, match=r"parts 0 and 1 overlap in \[0:1, 0:1, 0:1, 0:1, 0:1"):
        plan_transfer(target, source, budget, replica_policy=_split_of(corners), min_split_bytes=0)
    cells = [ReplicaPart((a, b, 0, 0, 0, 0, 0, 0), (1, 1, 4, 4, 4, 4, 4, 4), (a + b) % 2) for a in range(4)
             for b in range(4)]
    plan = plan_transfer(target, source, budget, replica_policy=_split_of(cells), min_split_bytes=0)
    assert verify_plan(target, source, plan).status == "ok"


def test_a_split_of_overlapping_parts_that_differ_is_refused_naming_a_pair() -> None:
    # Row 0 whole, then per row 1..63 columns 1.. and column 0, except that row 5's column-0 part
    # is two wide (it overlaps the rest of row 5) and row 63's is missing: the volumes sum to the
    # (64, 64) box's, no two parts are identical, and cell (63, 0) is written by nobody.
    target, source = replicated_map((64, 64), 1), replicated_map((64, 64), 2)
    rows = [ReplicaPart((0, 0), (1, 64), 0)] + [ReplicaPart((i, 1), (1, 63), 0) for i in range(1, 64)]
    column = [ReplicaPart((i, 0), (1, 2 if i == 5 else 1), 0) for i in range(1, 63)]
    budget = PlanBudget(max_parts_per_request=1 << 10)
    with pytest.raises(InvalidReplicaPolicyError, match=r"parts 5 and \d+ overlap in \[5:6, 1:2\]"):
        plan_transfer(target, source, budget, replica_policy=_split_of(rows + column), min_split_bytes=0)
    exact = rows + [ReplicaPart((i, 0), (1, 1), 0) for i in range(1, 64)]
    plan = plan_transfer(target, source, budget, replica_policy=_split_of(exact), min_split_bytes=0)
    assert verify_plan(target, source, plan).status == "ok"


@pytest.mark.parametrize(("alpha", "beta"), [(math.inf, 1e9), (1e-6, math.inf), (math.nan, 1e9), (1e-6, math.nan)])
def test_a_link_cost_must_be_finite(alpha: float, beta: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        LinkCost(alpha, beta)


@pytest.mark.parametrize(("alpha", "beta"), [(1e300, 1e-300), (0.0, 5e-324)])
def test_the_split_policy_plans_at_the_ends_of_the_float_range(alpha: float, beta: float) -> None:
    target = contiguous_split_map((64, 64), [16] * 4, 0)
    source = replicate(contiguous_split_map((64, 64), [32, 32], 1), 3)
    plan = plan_transfer(target, source, replica_policy=split_balanced_policy(0, alpha=alpha, beta=beta),
                         min_split_bytes=0)
    assert verify_plan(target, source, plan).status == "ok"


ENDS = TransferEndpoints({0: 0, 1: 1}, {0: 2})


@pytest.mark.parametrize(
    ("process_node", "fragment"),
    [("x", "got str"), (5, "got int"), ({0: [0]}, "0 -> [0]"), ({0: True, 1: 0, 2: 0}, "0 -> True"),
     ({0.0: 0, 1: 0, 2: 0}, "float -> int")],
)
def test_process_node_is_checked_as_an_argument(process_node: Any, fragment: str) -> None:
    pairs = {"w": (replicated_map((4, 4), 1), replicated_map((4, 4), 2))}
    with pytest.raises(TypeError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        plan_transfers(pairs, endpoints=ENDS, process_node=process_node)
    assert plan_transfers(pairs, endpoints=ENDS, process_node={0: 0, 1: 1, 2: 0})["w"].segments


def test_a_replica_policy_that_is_not_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="replica_policy must be callable"):
        plan_transfer(TARGET, SOURCE, replica_policy="lpt")  # type: ignore[arg-type]


class _NoClass:
    """A policy-made object whose ``__class__`` lookup raises, as a broken proxy's does."""

    @property  # type: ignore[misc]
    def __class__(self) -> Any:
        raise InvalidMapError("raised by the policy's own object")


class _Nameless(type):
    """A metaclass whose ``__name__`` raises: ``type(x).__name__`` in a message raised it."""

    @property  # type: ignore[override]
    def __name__(cls) -> str:
        raise InvalidMapError("raised by the policy's own class")


class _Opaque(metaclass=_Nameless):
    pass


class _OpaqueError(Exception, metaclass=_Nameless):
    pass


def _whole(requests: Any) -> list[Any]:
    return [r.candidates[0].source_rank for r in requests]


def _raises_opaque(requests: Any) -> Any:
    raise _OpaqueError("a policy bug")


@pytest.mark.parametrize(("policy", "words"), [
    (lambda rs: _NoClass(), "replica policy returned a _NoClass; expected a sequence of 4 answers"),
    (lambda rs: [_NoClass(), *_whole(rs)[1:]], r"\(_NoClass\) is neither an int location nor a sequence"),
    (lambda rs: [[_NoClass()], *_whole(rs)[1:]], "part 0 is a _NoClass, not a ReplicaPart"),
    (lambda rs: _Opaque(), "replica policy returned a _Opaque; expected"),
    (lambda rs: [[_Opaque()], *_whole(rs)[1:]], "part 0 is a _Opaque, not a ReplicaPart"),
    (lambda rs: [[ReplicaPart(rs[0].logical_origin, rs[0].shape, _Opaque())], *_whole(rs)[1:]],
     r"location <_Opaque> \(_Opaque\) is not an int location"),
    (_raises_opaque, "replica policy raised _OpaqueError: a policy bug"),
])
def test_a_policy_object_that_raises_when_its_class_is_asked_is_refused_in_the_checks_words(
    policy: Any, words: str,
) -> None:
    """Its own exception (an ``InvalidMapError``: "corrupt checkpoint, never fall back") escaped the
    planner as is, with a bare traceback, from ``isinstance`` or from ``type(x).__name__`` in a
    message (an outside probe, 2026-12-07)."""
    source = replicate(contiguous_split_map((8, 6), [4, 4], 0), 2)
    target = contiguous_split_map((8, 6), [3, 3], 1)
    with pytest.raises(InvalidReplicaPolicyError, match=words):
        plan_transfers({"w": (target, source)}, replica_policy=policy)


def test_a_split_whose_len_lies_is_read_one_part_past_the_budget_at_most() -> None:
    """A list subclass claiming 2 parts while its iterator never ends was copied without bound."""
    source = replicate(contiguous_split_map((8, 6), [4, 4], 0), 2)
    target = contiguous_split_map((8, 6), [3, 3], 1)
    yielded = []

    class Liar(list):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 2

        def __iter__(self) -> Any:
            part = ReplicaPart((0, 0), (1, 1), 0)
            while True:
                yielded.append(1)
                yield part

    with pytest.raises(InvalidReplicaPolicyError, match="1025 parts exceed max_parts_per_request=1024"):
        plan_transfers({"w": (target, source)}, replica_policy=lambda rs: [Liar(), *_whole(rs)[1:]])
    assert len(yielded) == 1025
    with pytest.raises(InvalidReplicaPolicyError, match="claimed 4 answers but held 5"):
        plan_transfers({"w": (target, source)}, replica_policy=lambda rs: type("Answers", (Liar,), {
            "__len__": lambda self: 4, "__iter__": lambda self: iter(range(10**9))})())
