"""Byte-driven choices: the part of a fuzz input that is not JSON.

Harnesses that need more than a document (the planner's replica policy, the oracle's plan
mutations, the CLI's command line) read those choices from a ``Ctl`` over trailing bytes. The
same bytes mean the same choices under atheris (which mutates them, guided by coverage) and under
hypothesis (which draws and shrinks them), and an exhausted ``Ctl`` answers 0 — the benign
choice — so short inputs exercise the common path.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from refplan.errors import InvalidMapError
from refplan.plan import PlanBudget, TransferPlan, TransferSegment
from refplan.requests import ReplicaPart, ReplicaRequest

__all__ = ["Ctl", "FuzzPolicy", "Mutated", "budget_from", "mutate_plan", "random_segments", "split_input"]

T = TypeVar("T")

HUGE = (2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64, 10**18, 10**30, -(2**63), -1)
"""Integers that overflow int64, sit on MAX_COORDINATE, or are negative."""


def split_input(data: bytes) -> tuple[bytes, bytes]:
    """``JSON text \\0 control bytes``: raw JSON never holds a NUL byte, so it is a safe separator."""
    head, _, tail = data.partition(b"\0")
    return head, tail


class Ctl:
    """Choices read from bytes; 0 once the bytes run out."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        value = self.data[self.pos]
        self.pos += 1
        return value

    def below(self, n: int) -> int:
        """An integer in ``[0, n)``; one byte for n <= 256, two beyond."""
        if n <= 1:
            return 0
        raw = self.byte() if n <= 256 else (self.byte() << 8) | self.byte()
        return raw % n

    def flag(self) -> bool:
        return bool(self.byte() & 1)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.below(len(options))]

    def small(self) -> int:
        """A small signed integer, biased to 0 and ±1."""
        return self.pick((0, 1, -1, 2, -2, 3, 7, 8, 64, -64, 1000))

    def integer(self, old: int) -> int:
        """A replacement for ``old``: near it, zero, negated, doubled or huge."""
        kind = self.below(6)
        if kind == 0:
            return old + self.small()
        if kind == 1:
            return 0
        if kind == 2:
            return -old
        if kind == 3:
            return old * 2 + 1
        if kind == 4:
            return self.pick(HUGE)
        return self.byte() - 128


# ---------------------------------------------------------------------------------------------
# The replica policy under fuzz


def _guillotine(ctl: Ctl, request: ReplicaRequest, pieces: int) -> list[ReplicaPart]:
    """A valid split of the request's box into up to ``pieces`` parts with holders chosen by ``ctl``."""
    boxes = [(list(request.logical_origin), list(request.shape))]
    for _ in range(pieces - 1):
        k = ctl.below(len(boxes))
        origin, extent = boxes[k]
        axes = [a for a, e in enumerate(extent) if e > 1]
        if not axes:
            break
        axis = ctl.pick(axes)
        cut = 1 + ctl.below(extent[axis] - 1) if extent[axis] <= 1 << 16 else extent[axis] // 2
        first = (list(origin), list(extent))
        first[1][axis] = cut
        second = (list(origin), list(extent))
        second[0][axis] += cut
        second[1][axis] -= cut
        boxes[k] = first
        boxes.append(second)
    holders = [c.source_rank for c in request.candidates]
    return [ReplicaPart(tuple(o), tuple(e), ctl.pick(holders)) for o, e in boxes]


def _corrupt(ctl: Ctl, parts: list[ReplicaPart], request: ReplicaRequest) -> Any:
    """A split the exact checks must refuse (or, for a few kinds, one they must still accept)."""
    part = parts[ctl.below(len(parts))]
    kind = ctl.below(14)
    if kind == 0:
        return [*parts, part]  # overlap (duplicate part)
    if kind == 1 and len(parts) > 1:
        return parts[:-1]  # gap
    if kind == 2:
        axis = ctl.below(len(part.shape))
        origin = list(part.logical_origin)
        origin[axis] += ctl.small() or 1
        return [ReplicaPart(tuple(origin), part.shape, part.source_location) if p is part else p for p in parts]
    if kind == 3:
        shape = list(part.shape)
        if shape:
            shape[ctl.below(len(shape))] = ctl.pick((0, -1, shape[0] + 1, 2**63))
        return [ReplicaPart(part.logical_origin, tuple(shape), part.source_location) if p is part else p for p in parts]
    if kind == 4:
        return [ReplicaPart(part.logical_origin[:-1], part.shape[:-1], part.source_location)]  # wrong ndim
    if kind == 5:
        bad = ctl.pick((True, 1.0, "0", None, -1, 10**30, max(request.locations) + 1))
        return [ReplicaPart(p.logical_origin, p.shape, bad) if p is part else p for p in parts]  # type: ignore[arg-type]
    if kind == 6:
        as_floats = tuple(float(v) for v in part.logical_origin)
        return [ReplicaPart(as_floats, part.shape, part.source_location)]  # type: ignore[arg-type]
    if kind == 7:
        return [*parts, 3]  # a non-part among parts
    if kind == 8:
        return set(parts)  # not a sequence
    if kind == 9:
        return tuple(parts)  # a tuple is a fine sequence: still valid
    if kind == 10:
        return _MILLION if ctl.flag() else [part] * 1025  # enormous part lists
    if kind == 11:
        return [ReplicaPart(list(p.logical_origin), list(p.shape), p.source_location) for p in parts]  # type: ignore[arg-type]
    if kind == 12:
        return []
    return [ReplicaPart(p.logical_origin, p.shape, p.source_location) for p in reversed(parts)]  # order: still valid


_MILLION = [ReplicaPart((0,), (1,), 0)] * 1_000_000
"""Built once, outside any measured call: its 8 MB are the policy's, not the planner's."""


class _Boom(Exception):
    pass


class FuzzPolicy:
    """A replica policy whose answers — valid, wrong or hostile — are chosen by control bytes.

    It never circumvents ``frozen`` dataclasses with ``object.__setattr__`` (that known finding has
    its own regression test), and never returns sequences whose ``__len__``/``__getitem__`` raise
    (likewise); everything else a policy can do to the planner is fair game.
    """

    def __init__(self, ctl: Ctl) -> None:
        self.ctl = ctl
        self.valid = True
        """False once an answer was chosen that the checks must refuse."""

    def __call__(self, requests: Sequence[ReplicaRequest]) -> Any:
        ctl = self.ctl
        mode = ctl.below(16)
        if mode == 8:
            self.valid = False
            return (self._one(r) for r in requests)  # a generator, not a sequence
        if mode == 9:
            self.valid = False
            answers = [self._one(r) for r in requests]
            return answers[:-1] if answers and ctl.flag() else [*answers, 0]
        if mode == 10:
            self.valid = False
            raise ctl.pick((_Boom("policy bug"), KeyError("k"), RecursionError("deep"), ZeroDivisionError("z"),
                            InvalidMapError("a policy may raise refplan errors too")))
        if mode == 11:
            self.valid = False
            if requests:
                requests[0].shape = (1,)  # type: ignore[misc]  # frozen: raises FrozenInstanceError
            return [self._one(r) for r in requests]
        if mode == 12:
            self.valid = False
            return "0" * len(requests)
        if mode == 13:
            self.valid = False
            return {i: self._one(r) for i, r in enumerate(requests)}
        return [self._answer(r, mode) for r in requests]

    def _one(self, request: ReplicaRequest) -> int:
        return request.candidates[self.ctl.below(len(request.candidates))].source_rank

    def _answer(self, request: ReplicaRequest, mode: int) -> Any:
        ctl = self.ctl
        choice = ctl.below(8) if mode >= 14 else mode
        if choice <= 3:
            return self._one(request)
        if choice == 4:
            return _guillotine(ctl, request, 2 + ctl.below(3))
        if choice == 5:
            parts = _guillotine(ctl, request, 1 + ctl.below(4))
            answer = _corrupt(ctl, parts, request)
            self.valid = False
            return answer
        if choice == 6:
            self.valid = False
            bad: Any = ctl.pick((True, False, 1.0, "0", None, b"0", -1, 2**63, max(request.locations) + 1, (0,), [0]))
            return bad
        return self._one(request) if ctl.flag() else [ReplicaPart(request.logical_origin, request.shape,
                                                                   self._one(request))]


def budget_from(ctl: Ctl) -> PlanBudget | None:
    """Mostly the default budget; sometimes one limit at 0, tiny, or 2**63."""
    kind = ctl.below(8)
    if kind <= 4:
        return None
    fields = ("max_ndim", "max_pieces_per_map", "max_pair_checks", "max_segments", "max_merge_passes",
              "max_plan_bytes", "max_merge_checks", "max_parts_per_request")
    if kind == 5:
        return PlanBudget(**{ctl.pick(fields): ctl.pick((0, 1, 2, 3, 8))})
    if kind == 6:
        return PlanBudget(**dict.fromkeys(fields, 2**63))
    return PlanBudget(**{ctl.pick(fields): 2**63})


# ---------------------------------------------------------------------------------------------
# Plans under fuzz (for the oracle)


def random_segments(ctl: Ctl, ndim: int, ranks: Sequence[int], targets: Sequence[int]) -> list[TransferSegment]:
    """A few arbitrary segments over known (or unknown) locations."""
    out = []
    for _ in range(1 + ctl.below(4)):
        n = ndim if ctl.below(8) else ctl.below(4)
        shape = tuple(1 + ctl.below(6) for _ in range(n))
        s_strides = tuple(ctl.pick((0, 1, 2, 4, 8, -1)) for _ in range(n))
        t_strides = tuple(ctl.pick((0, 1, 2, 4, 8, -1)) for _ in range(n))
        out.append(TransferSegment(
            ctl.pick([*ranks, 99]) if ranks else 0, ctl.below(64), s_strides,
            ctl.pick([*targets, 99]) if targets else 0, ctl.below(64), t_strides, shape,
        ))
    return out


def _refine(ctl: Ctl, seg: TransferSegment) -> list[TransferSegment]:
    """Cut a segment in two along one axis: the same copies, so a correct plan stays correct."""
    axes = [a for a, e in enumerate(seg.shape) if e > 1]
    if not axes:
        return [seg]
    axis = ctl.pick(axes)
    cut = 1 + ctl.below(min(seg.shape[axis] - 1, 255))
    first = list(seg.shape)
    first[axis] = cut
    second = list(seg.shape)
    second[axis] -= cut
    return [
        TransferSegment(seg.source_rank, seg.source_offset, seg.source_strides, seg.target_rank,
                        seg.target_offset, seg.target_strides, tuple(first)),
        TransferSegment(seg.source_rank, seg.source_offset + cut * seg.source_strides[axis], seg.source_strides,
                        seg.target_rank, seg.target_offset + cut * seg.target_strides[axis], seg.target_strides,
                        tuple(second)),
    ]


_JUNK: tuple[Any, ...] = (True, None, 1.5, float("nan"), float("inf"), "1", [], {}, [[1]])
"""Values that are not integers where the plan's dict form needs one."""


@dataclass(frozen=True)
class Mutated:
    """A mutated plan and what the oracle must say about it.

    ``plan`` is in one of the forms ``verify_plan`` accepts (or a malformed one). ``exact`` is
    True when only exactness-preserving edits were made (cutting a segment in two); then the
    verdict must be ``ok``, or ``ok``/``unverifiable`` when ``permuted`` (a segment rewritten with
    its axes reversed is the same copy but no longer a box). ``malformed`` means the plan does not
    parse as segments: the verdict must be ``invalid``, never an exception.
    """

    plan: Any
    exact: bool
    permuted: bool
    malformed: bool


def mutate_plan(ctl: Ctl, plan: TransferPlan) -> Mutated:
    """Apply up to three edits to ``plan`` and return it in a form chosen by ``ctl``."""
    segs = list(plan.segments)
    exact = True
    permuted = False
    for _ in range(ctl.below(4)):
        if not segs:
            break
        i = ctl.below(len(segs))
        op = ctl.below(8)
        seg = segs[i]
        if op == 0:
            segs[i:i + 1] = _refine(ctl, seg)
        elif op == 1:
            del segs[i]
            exact = False
        elif op == 2:
            segs.insert(i, seg)
            exact = False
        elif op == 3:
            name, value = ctl.pick(list(seg.__dict__.items()))
            if isinstance(value, tuple):
                if value:
                    k = ctl.below(len(value))
                    value = (*value[:k], ctl.integer(value[k]), *value[k + 1:])
                else:
                    value = (ctl.small(),)
            else:
                value = ctl.integer(value)
            segs[i] = TransferSegment(**{**seg.__dict__, name: value})
            exact = exact and segs[i] == seg
        elif op == 4:
            other = segs[ctl.below(len(segs))]
            segs[i] = TransferSegment(**{**seg.__dict__, "source_rank": other.source_rank})
            exact = exact and segs[i] == seg
        elif op == 5:
            if len(seg.shape) >= 2:
                segs[i] = TransferSegment(
                    seg.source_rank, seg.source_offset, seg.source_strides[::-1], seg.target_rank,
                    seg.target_offset, seg.target_strides[::-1], seg.shape[::-1],
                )
                permuted = True
        else:
            segs.extend(random_segments(ctl, len(plan.logical_shape), [s.source_rank for s in segs],
                                        [s.target_rank for s in segs]))
            exact = False
    form = ctl.below(8)
    if form == 0:
        return Mutated(TransferPlan(tuple(segs), plan.logical_shape, sum(s.numel for s in segs)), exact, permuted,
                       False)
    if form == 1:
        return Mutated(segs, exact, permuted, False)
    doc = TransferPlan(tuple(segs), plan.logical_shape, 0).to_dict()
    if form == 2 and doc["segments"]:
        seg_doc = ctl.pick(doc["segments"])
        key = ctl.pick(("shape", "source", "target"))
        junk = copy.deepcopy(ctl.pick(_JUNK))
        where = ctl.below(3)
        if where == 0:
            seg_doc[key] = junk
        elif where == 1:
            del seg_doc[key]
        elif key == "shape":
            seg_doc[key] = [*seg_doc[key], junk]
        else:
            seg_doc[key][-1] = [*seg_doc[key][-1], junk]
        return Mutated(doc, False, permuted, True)
    if form == 3:
        shape: Any = ctl.pick(([*plan.logical_shape, 1], [], [True], "x", [1.0]))
        doc["logical_shape"] = shape
        well_formed = isinstance(shape, list) and all(type(v) is int for v in shape)
        same = well_formed and tuple(shape) == tuple(plan.logical_shape)
        return Mutated(doc, exact and same, permuted, not well_formed)
    if form == 4:
        return Mutated(doc["segments"], exact, permuted, False)
    if form == 5:
        return Mutated(ctl.pick((None, 3, "plan", {"segments": 3}, [None], {}, [[]])), False, False, True)
    return Mutated(doc, exact, permuted, False)
