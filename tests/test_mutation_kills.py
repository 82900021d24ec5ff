# ruff: noqa: E501  (the expected messages are kept one per line, whole, so a diff shows which changed)
"""Tests that kill mutants of the checker and the oracle which the other suites let survive.

``make mutation`` (mutmut over ``refplan/check.py`` and ``refplan/oracle/``) reported each of
these mutants as surviving; each test below fails on it. The mutants that cannot be killed (the
mutated code behaves the same) are listed with a reason in ``docs/mutation.md``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from test_check import _requests

from refplan import InvalidReplicaPolicyError, PlanBudget, ReplicaPart, ReplicaRequest
from refplan.box import Box, box_in_shard, decode_row_major, volume
from refplan.check import check_answers
from refplan.errors import InvalidMapError, UnsupportedLayoutError
from refplan.limits import fast_paths
from refplan.maps import AffinePiece as P
from refplan.maps import ParamAffineMap as M
from refplan.maps import contiguous_split_map
from refplan.oracle.layout import validate_map
from refplan.oracle.segments import fast_boxes, kind, runs, structural
from refplan.oracle.verdict import BatchVerdict, TooLarge, Verdict, worst
from refplan.plan import TransferSegment
from refplan.plan import TransferSegment as S
from refplan.verify import verify_plan, verify_plans

# ---------------------------------------------------------------------------------------------
# check.check_answers: every refusal names the answer (its index), the request and what was wrong.
# The second request fails, so a message that lost the index (or named answer 0) is caught.

WHERE = "replica policy answer 1 (parameter 'param', target location 0, box [4:8, 0:6]): "


class _Unreadable(ReplicaPart):
    """A part whose ``shape`` raises when read (a hostile subclass)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "shape":
            raise KeyError("shape")
        return object.__getattribute__(self, name)


def _part(origin: Any, shape: Any, location: Any) -> ReplicaPart:
    return ReplicaPart(origin, shape, location)


REFUSED: dict[str, tuple[Any, str]] = {
    "not a holder": (7, "location 7 is not one of its validated holders [1, 3]"),
    "a bool": (True, "answer True (bool) is neither an int location nor a sequence of ReplicaPart"),
    "a float": (1.5, "answer 1.5 (float) is neither an int location nor a sequence of ReplicaPart"),
    "None": (None, "answer None (NoneType) is neither an int location nor a sequence of ReplicaPart"),
    "a str location in a split": ([_part((4, 0), (4, 6), "1")], "location '1' (str) is not an int location"),
    "a split to a non-holder": ([_part((4, 0), (4, 6), 0)], "location 0 is not one of its validated holders [1, 3]"),
    "an empty split": ([], "an empty split leaves the whole box unwritten"),
    "not a part": ([_part((4, 0), (2, 6), 1), (1, 2)], "part 1 is a tuple, not a ReplicaPart"),
    "an unreadable part": (
        [_part((4, 0), (2, 6), 1), _Unreadable((6, 0), (2, 6), 1)], "part 1 cannot be read: KeyError"
    ),
    "a float origin": (
        [_part((4, 0), (4, 6), 1), _part([4.0, 0], (1, 6), 1)], "part 1: origin and shape must be sequences of int"
    ),
    "no shape": (
        [_part((4, 0), (4, 6), 1), _part((4, 0), None, 1)], "part 1: origin and shape must be sequences of int"
    ),
    "an origin with three axes": (
        [_part((4, 0), (4, 6), 1), _part((4, 0, 0), (4, 6), 1)], "part 1 has 3/2 axes, the box has 2"
    ),
    "a shape with three axes": (
        [_part((4, 0), (4, 6), 1), _part((4, 0), (4, 6, 1), 1)], "part 1 has 2/3 axes, the box has 2"
    ),
    "a zero extent": (
        [_part((4, 0), (4, 6), 1), _part((4, 0), (4, 0), 1)], "part 1 has a zero or negative extent (4, 0)"
    ),
    "a negative extent": (
        [_part((4, 0), (4, 6), 1), _part((4, 0), (-1, 6), 1)], "part 1 has a zero or negative extent (-1, 6)"
    ),
    "outside": (
        [_part((4, 0), (2, 6), 1), _part((6, 0), (4, 6), 1)], "part 1 [6:10, 0:6] lies outside the request's box"
    ),
    "a gap": (
        [_part((4, 0), (2, 6), 1), _part((6, 0), (1, 6), 3)],
        "parts hold 18 elements but the box has 24 (gap or overlap)",
    ),
    "an overlap the volume hides": (
        [_part((4, 0), (2, 6), 1), _part((5, 0), (2, 6), 3)], "parts 0 and 1 overlap in [5:6, 0:6]"
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("paths", [True, False])
def test_each_refusal_names_the_answer_and_what_was_wrong(name: str, paths: bool) -> None:
    answer, what = REFUSED[name]
    with fast_paths(paths), pytest.raises(InvalidReplicaPolicyError) as caught:
        check_answers(_requests(), [0, answer], min_split_bytes=1)
    assert str(caught.value) == WHERE + what


def _cells(location: int) -> list[ReplicaPart]:
    """The request [4:8, 0:6] as twelve (1, 2) parts: more than the pairwise limit."""
    return [ReplicaPart((4 + r, c), (1, 2), location) for r in range(4) for c in (0, 2, 4)]


@pytest.mark.parametrize("paths", [True, False])
def test_an_overlap_among_many_parts_is_the_first_pair(paths: bool) -> None:
    parts = _cells(1)
    parts[7] = ReplicaPart((4, 2), (1, 2), 3)  # a second copy of part 1; part 7's cell is the gap
    with fast_paths(paths), pytest.raises(InvalidReplicaPolicyError) as caught:
        check_answers(_requests(), [0, parts], min_split_bytes=1)
    assert str(caught.value) == WHERE + "parts 1 and 7 overlap in [4:5, 2:4]"


def test_many_parts_that_tile_are_accepted_on_both_paths() -> None:
    for paths in (True, False):
        with fast_paths(paths):
            resolved = check_answers(_requests(), [0, _cells(3)], min_split_bytes=1)
        assert len(resolved[1]) == 12 and {c.source_rank for _, c in resolved[1]} == {3}
        assert resolved[0][0][0] == _requests()[0].box


def test_small_parts_are_refused_in_elements_or_bytes() -> None:
    halves = [ReplicaPart((4, 0), (2, 6), 1), ReplicaPart((6, 0), (2, 6), 3)]
    with pytest.raises(InvalidReplicaPolicyError) as caught:
        check_answers(_requests(), [0, halves], min_split_bytes=13)
    assert str(caught.value) == (
        WHERE + "part 0 of a split is 12 elements (no element_size given), below min_split_bytes=13"
    )
    with pytest.raises(InvalidReplicaPolicyError) as caught:
        check_answers(_requests(), [0, halves], element_size={"param": 2}, min_split_bytes=25)
    assert str(caught.value) == WHERE + "part 0 of a split is 24 bytes, below min_split_bytes=25"
    resolved = check_answers(_requests(), [0, halves], element_size={"param": 2}, min_split_bytes=24)
    assert [c.source_rank for _, c in resolved[1]] == [1, 3]
    one = [ReplicaPart((4, 0), (4, 6), 3)]  # a one-part "split" is never too small
    assert check_answers(_requests(), [0, one], min_split_bytes=10**9)[1][0][1].source_rank == 3


def test_budgets_on_parts_and_segments() -> None:
    halves = [ReplicaPart((4, 0), (2, 6), 1), ReplicaPart((6, 0), (2, 6), 3)]
    with pytest.raises(InvalidReplicaPolicyError) as caught:
        check_answers(_requests(), [0, halves], min_split_bytes=1, budget=PlanBudget(max_parts_per_request=1))
    assert str(caught.value) == WHERE + "2 parts exceed max_parts_per_request=1"
    two = PlanBudget(max_parts_per_request=2)
    assert len(check_answers(_requests(), [0, halves], min_split_bytes=1, budget=two)[1]) == 2
    # Three segments in all (one whole answer, a split in two): refused below 3, accepted at 3.
    with pytest.raises(InvalidReplicaPolicyError) as caught:
        check_answers(_requests(), [0, halves], min_split_bytes=1, budget=PlanBudget(max_segments=2))
    assert str(caught.value) == WHERE + "splits make the answers need more than max_segments=2 segments"
    assert len(check_answers(_requests(), [0, halves], min_split_bytes=1, budget=PlanBudget(max_segments=3))) == 2
    # Without a split, too many segments is not the policy's doing: the checker lets it pass.
    assert len(check_answers(_requests(), [0, 3], budget=PlanBudget(max_segments=0))) == 2


class _Answers(Sequence[Any]):
    """A policy's own sequence type, optionally broken in ``len`` or in what it holds."""

    def __init__(self, items: list[Any], claimed: int | None = None, broken: str | None = None) -> None:
        self.items = items
        self.claimed = len(items) if claimed is None else claimed
        self.broken = broken

    def __len__(self) -> int:
        if self.broken == "len":
            raise ValueError("len <is> broken")
        return self.claimed

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]

    def __iter__(self) -> Iterator[Any]:
        if self.broken == "iter":
            raise RuntimeError("")
        return iter(self.items)


class _Silent(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class _Raising(_Answers):
    def __iter__(self) -> Iterator[Any]:
        raise _Silent()


def test_answers_of_every_shape() -> None:
    reqs = _requests()
    for answers, message in [
        ("ab", "replica policy returned a str; expected a sequence of 2 answers"),
        ({0: 1}, "replica policy returned a dict; expected a sequence of 2 answers"),
        ([1], "replica policy returned 1 answers for 2 requests; exactly one answer per request is required"),
        (
            _Answers([0, 1], broken="len"),
            "replica policy returned a _Answers that cannot be read: ValueError: len <is> broken",
        ),
        (_Answers([0, 1], broken="iter"), "replica policy returned a _Answers that cannot be read: RuntimeError"),
        (_Raising([0, 1]), "replica policy returned a _Raising that cannot be read: _Silent"),
        (_Answers([0], claimed=2), "replica policy's _Answers claimed 2 answers but held 1"),
    ]:
        with pytest.raises(InvalidReplicaPolicyError) as caught:
            check_answers(reqs, answers)
        assert str(caught.value) == message
    resolved = check_answers(reqs, _Answers([2, 3]))
    assert [c.source_rank for ((_, c),) in resolved] == [2, 3]
    resolved = check_answers(reqs, (0, [ReplicaPart((4, 0), (4, 6), 1)]))
    assert [[c.source_rank for _, c in r] for r in resolved] == [[0], [1]]


class _Parts(list[Any]):
    """A split as a list subclass (accepted), optionally broken in ``len`` or iteration."""

    broken: str | None = None

    def __len__(self) -> int:
        if self.broken == "len":
            raise ValueError("len <is> broken")
        return super().__len__()

    def __iter__(self) -> Iterator[Any]:
        if self.broken == "iter":
            raise RuntimeError("")
        return super().__iter__()


def test_a_split_of_a_list_subclass() -> None:
    reqs = _requests()
    split = _Parts([ReplicaPart((4, 0), (2, 6), 1), ReplicaPart((6, 0), (2, 6), 3)])
    resolved = check_answers(reqs, [0, split], min_split_bytes=1)
    assert [c.source_rank for _, c in resolved[1]] == [1, 3]
    for broken, message in [
        ("len", "the split cannot be read: ValueError: len <is> broken"),
        ("iter", "the split cannot be read: RuntimeError"),
    ]:
        split.broken = broken
        with pytest.raises(InvalidReplicaPolicyError) as caught:
            check_answers(reqs, [0, split], min_split_bytes=1)
        assert str(caught.value) == WHERE + message
    assert "_Answers" in repr(type(_Answers([])))  # a custom Sequence is not a split:
    with pytest.raises(InvalidReplicaPolicyError, match=r"\(_Answers\) is neither an int location"):
        check_answers(reqs, [0, _Answers([ReplicaPart((4, 0), (4, 6), 1)])])


def test_requests_keep_their_order() -> None:
    reqs: list[ReplicaRequest] = _requests()
    resolved = check_answers(reqs, [2, 1])
    assert [r[0][0] for r in resolved] == [reqs[0].box, reqs[1].box]
    assert [r[0][1].source_rank for r in resolved] == [2, 1]


# ---------------------------------------------------------------------------------------------
# oracle.verdict: the report a user reads (text, JSON, exit code) is the oracle's whole answer.


def test_a_verdict_reads_back_every_field() -> None:
    v = Verdict("invalid", "w", "why", 2, 5, (1, 2), (3, 4), None, 7, 9)
    assert str(v) == "invalid: parameter 'w': why [target location 2; offset 5; logical (1, 2); segments 3, 4]"
    assert v.to_dict() == {
        "status": "invalid", "parameter": "w", "reason": "why", "target_location": 2, "target_offset": 5,
        "logical_coordinate": [1, 2], "segments": [3, 4], "map_error": None, "checked_segments": 7,
        "fallback_elements": 9,
    }
    assert not v.ok and Verdict("ok").ok
    assert v.with_parameter("z") == Verdict("invalid", "z", "why", 2, 5, (1, 2), (3, 4), None, 7, 9)
    assert str(Verdict("ok", "p", "fine", segments=(1,))) == "ok: parameter 'p': fine [segment 1]"
    assert str(Verdict("ok", None, "fine", target_offset=0)) == "ok: fine [offset 0]"
    bad_map = Verdict("invalid_map", None, "r", map_error="InvalidMapError: bad")
    assert str(bad_map) == "invalid_map: InvalidMapError: bad"
    assert str(Verdict("invalid_map", None, "r")) == "invalid_map: r"
    assert str(Verdict("invalid", None, "r", map_error="m")) == "invalid: r"
    assert Verdict("ok", "p", logical_coordinate=()).to_dict()["logical_coordinate"] == []
    assert str(Verdict("ok", None, "fine", target_location=0, logical_coordinate=())) == (
        "ok: fine [target location 0; logical ()]"
    )


def test_a_batch_verdict_reports_counts_worst_status_and_exit_code() -> None:
    bad = Verdict("invalid", "w", "why", 2, 5, (1, 2), (3, 4), None, 7, 9)
    batch = BatchVerdict("invalid", {"b": bad, "a": Verdict("ok", "a", "fine")})
    assert str(batch) == (
        "2 parameter(s): 1 ok, 1 invalid -> invalid\n  ok: parameter 'a': fine\n"
        "  invalid: parameter 'w': why [target location 2; offset 5; logical (1, 2); segments 3, 4]"
    )
    assert batch.counts() == {"ok": 1, "unverifiable": 0, "invalid": 1, "invalid_map": 0}
    assert batch.to_dict() == {
        "status": "invalid", "counts": batch.counts(),
        "parameters": {"a": Verdict("ok", "a", "fine").to_dict(), "b": bad.to_dict()},
    }
    assert list(batch.to_dict()["parameters"]) == ["a", "b"]
    assert str(BatchVerdict("ok")) == "0 parameter(s): none -> ok"
    assert BatchVerdict("ok").ok and not batch.ok
    assert [BatchVerdict(s).exit_code for s in ("ok", "invalid", "invalid_map", "unverifiable")] == [0, 1, 2, 3]
    assert worst([]) == "ok"
    assert worst(["ok", "unverifiable", "ok"]) == "unverifiable"
    assert worst(["unverifiable", "invalid", "unverifiable"]) == "invalid"
    assert worst(["invalid_map", "invalid"]) == "invalid_map"
    assert worst(["invalid", "invalid_map", "ok"]) == "invalid_map"


# ---------------------------------------------------------------------------------------------
# oracle.layout: every map rule refuses with its own error class and a message naming the side,
# the location, the piece and the box.


def two(p0: P, p1: P, shards: dict[int, tuple[int, ...]] | None = None, logical: tuple[int, ...] = (4, 3)) -> M:
    """Two locations of a (4, 3) F, rows 0-1 at location 0 and rows 2-3 at location 1."""
    return M(logical, shards or {0: (2, 3), 1: (2, 3)}, {0: [p0], 1: [p1]})

A = P((2, 3), 0, (3, 1), 0, (3, 1), [0])
B = P((2, 3), 6, (3, 1), 0, (3, 1), [1])
MAP_CASES: dict[str, M] = {
    "a negative logical extent": M((4, -3), {}, {}),
    "a shard with other axes": two(A, B, {0: (2, 3), 1: (6,)}),
    "a negative shard extent": two(A, B, {0: (2, 3), 1: (-2, 3)}),
    "a piece with other axes": two(A, P((6,), 6, (1,), 0, (1,), [1])),
    # beside a non-empty piece, so that R4 (the location holds none) does not come first, as it
    # does in spec/validation.md's order and the planner's
    "a negative piece extent": M((4, 3), {0: (2, 3), 1: (2, 3)},
                                 {0: [A], 1: [P((2, -3), 6, (3, 1), 0, (3, 1), [1]), B]}),
    "a location holding only a negative piece": two(A, P((2, -3), 6, (3, 1), 0, (3, 1), [1])),
    "a piece without a shard": M((4, 3), {0: (2, 3)}, {0: [A], 1: [B]}),
    "no holder": two(A, P((2, 3), 6, (3, 1), 0, (3, 1), [])),
    "a scale": two(A, P((2, 3), 6, (3, 1), 0, (3, 1), [1], 2.0)),
    "a short stride vector": two(A, P((2, 3), 6, (3,), 0, (3, 1), [1])),
    "permuted source strides": two(A, P((2, 3), 6, (1, 3), 0, (3, 1), [1])),
    "other dest strides": two(A, P((2, 3), 6, (3, 1), 0, (4, 1), [1])),
    "a source offset past F": two(A, P((2, 3), 12, (3, 1), 0, (3, 1), [1])),
    "a logical box past F": two(A, P((2, 3), 7, (3, 1), 0, (3, 1), [1])),
    "a dest offset past the shard": two(A, P((2, 3), 6, (3, 1), 6, (3, 1), [1])),
    "a local box past the shard": two(A, P((2, 3), 6, (3, 1), 1, (3, 1), [1])),
    "a negative source offset": two(A, P((2, 3), -1, (3, 1), 0, (3, 1), [1])),
    "a negative dest offset": two(A, P((2, 3), 6, (3, 1), -3, (3, 1), [1])),
    "shared shard addresses": M((4, 3), {0: (4, 3)}, {0: [
        P((2, 3), 0, (3, 1), 0, (3, 1), [0]), P((2, 3), 6, (3, 1), 3, (3, 1), [0])]}),
    "shared shard addresses, same rows": M((2, 4), {0: (2, 2)}, {0: [
        P((2, 2), 0, (4, 1), 0, (2, 1), [0]), P((2, 1), 2, (4, 1), 1, (2, 1), [0]), P((2, 1), 3, (4, 1), 0, (2, 1), [0])]}),
    "overlapping logical pieces": M((4, 3), {0: (4, 3)}, {0: [
        P((2, 3), 0, (3, 1), 0, (3, 1), [0]), P((2, 3), 3, (3, 1), 6, (3, 1), [0])]}),
    "a shard the pieces do not fill": two(A, P((1, 3), 6, (3, 1), 0, (3, 1), [1])),
    "more holders declared": two(A, P((2, 3), 6, (3, 1), 0, (3, 1), [0, 1])),
    "a holder missing": M((4, 3), {0: (2, 3), 1: (2, 3), 2: (2, 3)}, {0: [A], 1: [B], 2: [P((2, 3), 6, (3, 1), 0, (3, 1), [1])]}),
    "a holder of part of a box": M((2, 3), {0: (2, 3), 1: (1, 3), 2: (1, 3)}, {
        0: [P((2, 3), 0, (3, 1), 0, (3, 1), [0, 1])], 1: [P((1, 3), 0, (3, 1), 0, (3, 1), [0, 1])],
        2: [P((1, 3), 3, (3, 1), 0, (3, 1), [0, 2])]}),
    "replicas cut differently": M((2, 3), {0: (2, 3), 1: (1, 3), 2: (1, 3)}, {
        0: [P((2, 3), 0, (3, 1), 0, (3, 1), [0, 1, 2])], 1: [P((1, 3), 0, (3, 1), 0, (3, 1), [0, 1])],
        2: [P((1, 3), 3, (3, 1), 0, (3, 1), [0, 2])]}),
    "one replica in two pieces": M((2, 3), {0: (2, 3), 1: (2, 3)}, {
        0: [P((2, 3), 0, (3, 1), 0, (3, 1), [0, 1])],
        1: [P((1, 3), 0, (3, 1), 0, (3, 1), [0, 1]), P((1, 3), 3, (3, 1), 3, (3, 1), [0, 1])]}),
    "a row held by nobody": M((4, 3), {0: (2, 3), 1: (1, 3)}, {0: [A], 1: [P((1, 3), 6, (3, 1), 0, (3, 1), [1])]}),
}

SOURCE_ERRORS: dict[str, tuple[type[Exception], str]] = {
    'a negative logical extent': (InvalidMapError, 'source map: logical shape (4, -3) has a negative extent'),
    'a shard with other axes': (UnsupportedLayoutError, 'source map, location 1: shard shape (6,) has a different number of axes than the logical shape (4, 3)'),
    'a negative shard extent': (InvalidMapError, 'source map, location 1: shard shape (-2, 3) has a negative extent'),
    'a piece with other axes': (InvalidMapError, 'source map, location 1, piece 0: shape (6,) does not have the 2 axes of (4, 3)'),
    'a negative piece extent': (InvalidMapError, 'source map, location 1, piece 0: shape (2, -3) has a negative extent'),
    'a location holding only a negative piece': (InvalidMapError, 'source map, location 1: a nonempty shard (2, 3) must hold at least one non-empty piece'),
    'a piece without a shard': (InvalidMapError, 'source map, location 1, piece 0: location 1 lists a non-empty piece but has no shard shape'),
    'no holder': (InvalidMapError, 'source map, location 1, piece 0: names no holder (empty locations)'),
    'a scale': (UnsupportedLayoutError, 'source map, location 1, piece 0: scale 2.0 != 1; a byte copy cannot rescale'),
    'a short stride vector': (InvalidMapError, 'source map, location 1, piece 0: stride vector length does not match the 2 axes of the piece'),
    'permuted source strides': (UnsupportedLayoutError, "source map, location 1, piece 0: source strides (1, 3) are not the row-major strides of (4, 3) on the piece's axes (a permutation or a gap)"),
    'other dest strides': (UnsupportedLayoutError, 'source map, location 1, piece 0: dest strides (4, 1) are not the row-major strides of shard (2, 3)'),
    'a source offset past F': (InvalidMapError, 'source map, location 1, piece 0: source offset 12 is not a coordinate of (4, 3)'),
    'a logical box past F': (InvalidMapError, 'source map, location 1, piece 0: logical box [2:4, 1:4] lies outside the logical parameter (4, 3)'),
    'a dest offset past the shard': (InvalidMapError, 'source map, location 1, piece 0: dest offset 6 is not a coordinate of shard (2, 3)'),
    'a local box past the shard': (InvalidMapError, 'source map, location 1, piece 0: local box [0:2, 1:4] lies outside the shard (2, 3)'),
    'a negative source offset': (InvalidMapError, 'source map, location 1, piece 0: source offset -1 is not a coordinate of (4, 3)'),
    'a negative dest offset': (InvalidMapError, 'source map, location 1, piece 0: dest offset -3 is not a coordinate of shard (2, 3)'),
    'shared shard addresses': (InvalidMapError, 'source map, location 0: pieces 0 and 1 hold the same shard addresses (local boxes [0:2, 0:3] and [1:3, 0:3] share [1:2, 0:3])'),
    'shared shard addresses, same rows': (InvalidMapError, 'source map, location 0: pieces 0 and 1 hold the same shard addresses (local boxes [0:2, 0:2] and [0:2, 1:2] share [0:2, 1:2])'),
    'overlapping logical pieces': (InvalidMapError, 'source map, location 0: pieces 0 and 1 hold overlapping logical pieces (logical boxes [0:2, 0:3] and [1:3, 0:3] share [1:2, 0:3])'),
    'a shard the pieces do not fill': (InvalidMapError, 'source map, location 1: the pieces account for 3 of the 6 elements of shard (2, 3)'),
    'more holders declared': (InvalidMapError, 'source map, location 1, piece 0: logical box [2:4, 0:3] declares locations [0, 1], but the locations holding part of it are [1] (different locations)'),
    'a holder missing': (InvalidMapError, 'source map, location 1, piece 0: logical box [2:4, 0:3] declares locations [1], but the locations holding part of it are [1, 2] (different locations)'),
    'a holder of part of a box': (InvalidMapError, 'source map, location 0, piece 0: logical box [0:2, 0:3] declares locations [0, 1], but the locations holding part of it are [0, 1, 2] (different locations)'),
    'replicas cut differently': (InvalidMapError, 'source map: location 1 is declared a holder of logical box [0:2, 0:3] but does not hold all of it (3 of 6 elements)'),
    'a row held by nobody': (InvalidMapError, 'source map: source pieces cover 9 of the 12 elements of F; [3:4, 0:3] is held by nobody'),
    "one replica in two pieces": (
        UnsupportedLayoutError,
        "source map: logical boxes [0:1, 0:3] and [0:2, 0:3] overlap without being equal (replicas cut at different "
        "piece boundaries); box copies cannot choose between them",
    ),
}
TARGET_ONLY: dict[str, tuple[type[Exception], str] | None] = {
    "one replica in two pieces": None,  # a target may hold overlapping boxes: it is read by nobody
    "a row held by nobody": (
        InvalidMapError, "target map: target pieces do not cover F; [3:4, 0:3] is held by no target location"
    ),
}


@pytest.mark.parametrize("name", sorted(MAP_CASES))
@pytest.mark.parametrize("side", ["source", "target"])
def test_each_map_rule_refuses_with_its_class_and_message(name: str, side: str) -> None:
    expected = SOURCE_ERRORS[name] if side == "source" or name not in TARGET_ONLY else TARGET_ONLY[name]
    if expected is None:
        assert validate_map(MAP_CASES[name], side).side == side
        return
    cls, message = expected
    if side == "target":
        message = message.replace("source map", "target map")
    with pytest.raises(cls) as caught:
        validate_map(MAP_CASES[name], side)
    assert type(caught.value) is cls and str(caught.value) == message


def test_empty_pieces_hold_nothing_and_are_skipped() -> None:
    empty = P((0, 3), 12, (3, 1), 6, (3, 1), [0])  # one past the end: still fine (R12)
    layout = validate_map(M((4, 3), {0: (2, 3), 1: (2, 3)}, {0: [A, empty], 1: [B]}), "source")
    assert [(h.location, h.index) for loc in sorted(layout.held) for h in layout.held[loc]] == [(0, 0), (1, 0)]
    assert layout.held[0][0].logical == Box((0, 0), (2, 3)) and layout.held[1][0].local == Box((0, 0), (2, 3))
    assert layout.shards == {0: (2, 3), 1: (2, 3)} and layout.logical_shape == (4, 3)
    # R5 and R9 hold for empty pieces too, as in the planner: a location listing only an empty
    # piece declares a shard shape, and an empty piece names a holder.
    shardless = M((4, 3), {0: (2, 3), 1: (2, 3)}, {0: [A], 1: [B], 5: [empty]})
    with pytest.raises(InvalidMapError, match=r"^target map, location 5: lists pieces \(none non-empty\) but has no "):
        validate_map(shardless, "target")
    holderless = P((0, 3), 12, (3, 1), 6, (3, 1), [])
    with pytest.raises(InvalidMapError, match=r"^source map, location 0, piece 1: names no holder"):
        validate_map(M((4, 3), {0: (2, 3), 1: (2, 3)}, {0: [A, holderless], 1: [B]}), "source")


def test_size_one_axes_take_any_stride() -> None:
    row = M((1, 3), {0: (1, 3)}, {0: [P((1, 3), 0, (99, 1), 0, (7, 1), [0])]})
    assert validate_map(row, "source").held[0][0].local == Box((0, 0), (1, 3))


def test_maps_too_large_for_exact_arithmetic_are_unverifiable() -> None:
    huge = 1 << 62
    for m in (
        M((huge, 1), {}, {}),
        M((4, 3), {0: (huge, 1)}, {}),
    ):
        with pytest.raises(TooLarge):
            validate_map(m, "source")
    good = two(A, B)
    verdict = verify_plan(good, M((1 << 31, 1 << 31), {}, {}), [])
    assert verdict.status == "invalid_map"  # shapes differ: a map error before size matters
    verdict = verify_plan(M((huge, 1), {}, {}), M((huge, 1), {}, {}), [])
    assert verdict.status == "unverifiable" and verdict.reason == (
        "source map: logical shape (4611686018427387904, 1) has 4611686018427387904 elements, at least 2**62 (the "
        "oracle addresses fewer)"
    )


def test_a_remembered_layout_is_per_side() -> None:
    """The same map content is valid as a target and invalid as a source: the memo must not
    hand one side's layout to the other."""
    overlapping = MAP_CASES["one replica in two pieces"]
    good = M((2, 3), {0: (2, 3)}, {0: [P((2, 3), 0, (3, 1), 0, (3, 1), [0])]})
    plan = [TransferSegment(0, 0, (3, 1), 0, 0, (3, 1), (2, 3))]
    result = verify_plans({"a": (overlapping, good), "b": (good, overlapping)}, {"a": [], "b": plan})
    assert result.verdicts["b"].status == "invalid_map", result
    assert result.verdicts["a"].status == "invalid", result  # judged: an empty plan writes nothing
    again = verify_plans({"a": (good, good), "b": (good, good)}, {"a": plan, "b": plan})
    assert again.ok, again


# ---------------------------------------------------------------------------------------------
# oracle.segments: each structural fault is answered with the segment, the place and the element.

SPLIT = contiguous_split_map((4, 3), [2, 2], 0)
FIRST = S(0, 0, (3, 1), 0, 0, (3, 1), (2, 3))
SECOND = S(1, 0, (3, 1), 1, 0, (3, 1), (2, 3))
SEGMENT_FAULTS: dict[str, tuple[S, str, int | None, int | None, tuple[int, ...] | None, int]] = {
    'unknown source': (S(5, 0, (3, 1), 1, 0, (3, 1), (2, 3)), 'segment 1: reads from source location 5, which has no shard in the source map', 1, None, None, 0),
    'unknown target': (S(1, 0, (3, 1), 5, 0, (3, 1), (2, 3)), 'segment 1: writes to target location 5, which has no shard in the target map', 5, None, None, 0),
    'short strides': (S(1, 0, (3,), 1, 0, (3, 1), (2, 3)), 'segment 1: stride vector length does not match shape (2, 3)', 1, None, None, 0),
    'short target strides': (S(1, 0, (3, 1), 1, 0, (3,), (2, 3)), 'segment 1: stride vector length does not match shape (2, 3)', 1, None, None, 0),
    'zero extent': (S(1, 0, (3, 1), 1, 0, (3, 1), (2, 0)), 'segment 1: shape (2, 0) has an extent that is not positive (an executor refuses it)', 1, None, None, 0),
    'negative stride': (S(1, 2, (3, -1), 1, 0, (3, 1), (2, 3)), 'segment 1: negative strides are not executable (as_strided refuses them)', 1, None, None, 0),
    'negative target stride': (S(1, 0, (3, 1), 1, 2, (3, -1), (2, 3)), 'segment 1: negative strides are not executable (as_strided refuses them)', 1, None, None, 0),
    'read past': (S(1, 1, (3, 1), 1, 0, (3, 1), (2, 3)), 'segment 1: reads addresses 1..6 of source location 1, outside its 6 elements (shard (2, 3))', 1, 5, (3, 2), 0),
    'read before': (S(1, -1, (3, 1), 1, 0, (3, 1), (2, 3)), 'segment 1: reads addresses -1..4 of source location 1, outside its 6 elements (shard (2, 3))', 1, 0, (2, 0), 0),
    'write past': (S(1, 0, (3, 1), 1, 1, (3, 1), (2, 3)), 'segment 1: writes addresses 1..6 of target location 1, outside its 6 elements (shard (2, 3))', 1, 6, None, 0),
    'write before': (S(1, 0, (3, 1), 1, -2, (3, 1), (2, 3)), 'segment 1: writes addresses -2..3 of target location 1, outside its 6 elements (shard (2, 3))', 1, -2, None, 0),
    'zero target stride': (S(1, 0, (3, 1), 1, 0, (0, 1), (2, 3)), 'segment 1: target strides (0, 1) repeat a zero stride on an axis of extent > 1, so it writes one address more than once', 1, 0, (2, 0), 0),
    'not a box target': (S(1, 0, (3, 1), 1, 0, (1, 2), (2, 3)), 'target location 1, offset 1 needs logical (2, 1), but segment 1 reads source location 1 at offset 3, which holds logical (3, 0) (logical (2, 1) is held by source location(s) [1])', 1, 1, (2, 1), 6),
}


@pytest.mark.parametrize("name", sorted(SEGMENT_FAULTS))
@pytest.mark.parametrize("paths", [True, False])
def test_each_segment_fault_is_named_with_its_element(name: str, paths: bool) -> None:
    seg, reason, location, offset, logical, expanded = SEGMENT_FAULTS[name]
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, SPLIT, [FIRST, seg], parameter="w")
    assert verdict == Verdict(
        "invalid", "w", reason, location, offset, logical, (1,), None, 2, expanded
    ), verdict


@pytest.mark.parametrize("paths", [True, False])
def test_a_correct_plan_is_ok_with_its_counts(paths: bool) -> None:
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, SPLIT, [FIRST, SECOND])
        transposed = verify_plan(SPLIT, SPLIT, [FIRST, S(1, 0, (1, 3), 1, 0, (1, 3), (3, 2))])
    assert verdict == Verdict(
        "ok", None, "2 segment(s) verified: every target element is written exactly once with its own logical "
        "element, read from a source location that holds it", checked_segments=2,
    )
    # The same copy through a transposed view on both sides: not a box, expanded (6 elements) and ok.
    assert transposed.status == "ok" and transposed.fallback_elements == 6 and transposed.checked_segments == 2


@pytest.mark.parametrize("paths", [True, False])
def test_a_view_that_reads_out_of_order_is_caught_element_by_element(paths: bool) -> None:
    """Writes that are one row, reads that jump: the element-level runs must follow both sides."""
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, SPLIT, [FIRST, S(1, 0, (1, 2), 1, 0, (3, 1), (2, 3))])
    assert verdict == Verdict(
        "invalid", None,
        "target location 1, offset 1 needs logical (2, 1), but segment 1 reads source location 1 at offset 2, which "
        "holds logical (2, 2) (logical (2, 1) is held by source location(s) [1])",
        1, 1, (2, 1), (1,), None, 2, 6,
    ), verdict
    with fast_paths(paths):  # the same reads, written in the matching order: a correct transpose
        verdict = verify_plan(SPLIT, SPLIT, [FIRST, S(1, 0, (1, 3), 1, 0, (1, 3), (3, 2))])
    assert verdict.ok, verdict


def test_non_box_segments_beyond_the_budget_are_unverifiable() -> None:
    odd = S(1, 0, (1, 3), 1, 0, (1, 3), (3, 2))
    verdict = verify_plan(SPLIT, SPLIT, [FIRST, odd], fallback_elements=5)
    assert verdict == Verdict(
        "unverifiable", None,
        "segment 1 is not a box in its target: strides (1, 3) are not the row-major strides of shard (2, 3); the 1 "
        "non-box segment(s) total 6 elements, more than the element-level fallback budget of 5",
        1, None, None, (1,), None, 2, 0,
    ), verdict
    assert verify_plan(SPLIT, SPLIT, [FIRST, odd], fallback_elements=6).ok
    # A double write among the checked rows is still a concrete counterexample.
    verdict = verify_plan(SPLIT, SPLIT, [FIRST, FIRST, odd], fallback_elements=0)
    assert verdict.status == "invalid" and verdict.segments == (0, 1), verdict


def test_plans_in_every_accepted_form_and_malformed_ones() -> None:
    as_dicts = [FIRST.to_dict(), SECOND.to_dict()]
    for plan in (as_dicts, {"segments": as_dicts}, {"logical_shape": [4, 3], "segments": as_dicts}, (FIRST, SECOND)):
        assert verify_plan(SPLIT, SPLIT, plan).ok, plan
    for plan, reason in [
        ({"logical_shape": [4, 3]}, "malformed plan: plan: expected {logical_shape, segments}"),
        ({"logical_shape": [4, True], "segments": []}, "malformed plan: plan.logical_shape: expected a list of integers"),
        ({"logical_shape": "43", "segments": []}, "malformed plan: plan.logical_shape: expected a list of integers"),
        ({"logical_shape": [4.0, 3], "segments": []}, "malformed plan: plan.logical_shape: expected a list of integers"),
        ("plan", "malformed plan: plan: expected a TransferPlan, a plan dict or a list of segments, got str"),
        (7, "malformed plan: plan: expected a TransferPlan, a plan dict or a list of segments, got int"),
        ({"logical_shape": [3, 4], "segments": as_dicts}, "the plan describes logical shape (3, 4), the maps (4, 3)"),
    ]:
        verdict = verify_plan(SPLIT, SPLIT, plan, parameter="w")
        assert (verdict.status, verdict.reason, verdict.parameter) == ("invalid", reason, "w"), verdict
    verdict = verify_plan(SPLIT, SPLIT, [FIRST.to_dict(), {"shape": [2, 3]}])
    assert verdict.status == "invalid" and verdict.reason.startswith("malformed plan: segments[1]"), verdict


# ---------------------------------------------------------------------------------------------
# oracle.judge: the entry points, batches and the two judgements.


def test_map_errors_and_batches_are_reported_per_parameter() -> None:
    other = contiguous_split_map((3, 4), [2, 1], 0)
    assert verify_plan(SPLIT, other, [], parameter="w") == Verdict(
        "invalid_map", "w", "a map is invalid, so the plan was not judged",
        map_error="InvalidMapError: target map describes (4, 3), source map (3, 4): a reshape is not a transfer",
    )
    assert verify_plan({"logical_shape": [4, 3]}, SPLIT, []).map_error == (
        "InvalidMapError: target map: a map needs 'logical_shape' and 'ranks'"
    )
    assert verify_plan(SPLIT.to_dict(), SPLIT.to_dict(), [FIRST, SECOND]).ok
    batch = verify_plans({"a": (SPLIT, SPLIT), "b": (SPLIT, SPLIT)}, {"b": [FIRST, SECOND], "c": []})
    assert batch.status == "invalid" and list(batch.verdicts) == ["a", "b", "c"]
    assert batch.verdicts["a"] == Verdict("invalid", "a", "the maps describe this parameter but no plan does")
    assert batch.verdicts["b"].ok and batch.verdicts["b"].parameter == "b"
    assert batch.verdicts["c"] == Verdict("invalid", "c", "a plan for a parameter the maps do not describe")
    assert verify_plans({}, {}).status == "ok"


@pytest.mark.parametrize("paths", [True, False])
def test_gaps_and_double_writes_name_the_first_element(paths: bool) -> None:
    with fast_paths(paths):
        gap = verify_plan(SPLIT, SPLIT, [FIRST, S(1, 3, (3, 1), 1, 3, (3, 1), (1, 3))], parameter="w")
        twice = verify_plan(SPLIT, SPLIT, [FIRST, SECOND, S(1, 3, (3, 1), 1, 3, (3, 1), (1, 3))])
        empty = verify_plan(SPLIT, SPLIT, [])
    assert gap == Verdict(
        "invalid", "w", "target location 1, offset 0 is never written (the plan writes 3 of the 6 elements of shard "
        "(2, 3); unwritten box [0:1, 0:3])", 1, 0, (2, 0), (), None, 2, 0,
    ), gap
    assert twice == Verdict(
        "invalid", None, "target location 1, offset 3 is written more than once (by segments 1 and 2)",
        1, 3, (3, 0), (1, 2), None, 3, 0,
    ), twice
    assert empty.status == "invalid" and (empty.target_location, empty.target_offset) == (0, 0), empty
    assert empty.reason.endswith("(the plan writes 0 of the 6 elements of shard (2, 3); unwritten box [0:2, 0:3])")


@pytest.mark.parametrize("paths", [True, False])
def test_a_segment_that_writes_itself_twice(paths: bool) -> None:
    doubled = S(1, 0, (3, 1), 1, 0, (0, 1), (1, 3))  # extent 1 on the zero-stride axis: fine
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, SPLIT, [FIRST, doubled, S(1, 3, (3, 1), 1, 3, (3, 1), (1, 3))])
    assert verdict.ok, verdict


@pytest.mark.parametrize("paths", [True, False])
def test_a_wrong_element_from_the_other_replica_side(paths: bool) -> None:
    """Rows swapped between the two source locations: the first wrong element is named."""
    swapped = [S(1, 0, (3, 1), 0, 0, (3, 1), (2, 3)), S(0, 0, (3, 1), 1, 0, (3, 1), (2, 3))]
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, SPLIT, swapped)
    assert verdict == Verdict(
        "invalid", None,
        "target location 0, offset 0 needs logical (0, 0), but segment 0 reads source location 1 at offset 0, which "
        "holds logical (2, 0) (logical (0, 0) is held by source location(s) [0])",
        0, 0, (0, 0), (0,), None, 2, 0,
    ), verdict


# ---------------------------------------------------------------------------------------------
# oracle.segments' two array routines against plain per-element / per-segment statements.


def _reference_runs(seg: S, s_shard: tuple[int, ...], t_shard: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """Maximal runs, element by element: sort (write, read) coordinate pairs by write address and
    join an element to the previous run when both coordinates step by one on the last axis."""
    pairs = []
    for index in itertools.product(*(range(e) for e in seg.shape)):
        w = seg.target_offset + sum(i * s for i, s in zip(index, seg.target_strides))
        r = seg.source_offset + sum(i * s for i, s in zip(index, seg.source_strides))
        pairs.append((w, decode_row_major(w, t_shard), decode_row_major(r, s_shard)))
    pairs.sort(key=lambda p: p[0])
    out: list[list[Any]] = []
    for _, wc, rc in pairs:
        if out:
            last_w, last_r, length = out[-1]
            if (wc[:-1] == last_w[:-1] and wc[-1] == last_w[-1] + length
                    and rc[:-1] == last_r[:-1] and rc[-1] == last_r[-1] + length):
                out[-1][2] += 1
                continue
        out.append([wc, rc, 1])
    return [(tuple(wc), tuple(rc), length) for wc, rc, length in out]


@pytest.mark.parametrize("seed", range(60))
def test_runs_are_the_maximal_rows_of_both_sides(seed: int) -> None:
    rng = random.Random(seed)
    ndim = rng.choice([1, 2, 3])
    s_shard = tuple(rng.randint(1, 4) for _ in range(ndim))
    t_shard = tuple(rng.randint(1, 4) for _ in range(ndim))
    shape = tuple(rng.randint(1, 3) for _ in range(ndim))
    def fits(shard: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        for _ in range(50):
            strides = tuple(rng.choice([0, 1, 2, 3, 4, 6, 12]) for _ in range(ndim))
            reach = sum((e - 1) * s for e, s in zip(shape, strides))
            room = volume(shard) - reach
            if room > 0:
                return rng.randrange(room), strides
        return 0, (0,) * ndim  # every element at address 0: always inside
    read, write = fits(s_shard), fits(t_shard)
    seg = S(0, read[0], read[1], 0, write[0], write[1], shape)
    w, r, ext = runs(seg, s_shard, t_shard)
    got = [(tuple(a), tuple(b), int(e[-1])) for a, b, e in zip(w.tolist(), r.tolist(), ext.tolist())]
    assert got == _reference_runs(seg, s_shard, t_shard)
    assert ext.shape == (len(got), ndim) and bool(np.all(ext[:, :-1] == 1))


@pytest.mark.parametrize("seed", range(40))
def test_fast_boxes_accepts_exactly_the_box_segments(seed: int) -> None:
    rng = random.Random(seed)
    full = {0: (4, 6), 1: (4, 6)}
    src = validate_map(M((4, 6), full, {loc: [P((4, 6), 0, (6, 1), 0, (6, 1), [0, 1])] for loc in full}), "source")
    tgt = validate_map(M((4, 6), {0: (4, 6)}, {0: [P((4, 6), 0, (6, 1), 0, (6, 1), [0])]}), "target")
    segments = []
    for _ in range(rng.randint(1, 40)):
        shape = (rng.randint(1, 4), rng.randint(1, 6))
        strides = [(6, 1), (6, 1), (6, 1), (7, 1), (1, 4), (0, 1), (6, -1), (6,)]
        segments.append(S(rng.choice([0, 1, 1, 2]), rng.randint(-2, 26), rng.choice(strides),
                          rng.choice([0, 0, 0, 3]), rng.randint(-2, 26), rng.choice(strides), shape))
    index_of: dict[Any, int] = {}
    kinds: list[Any] = []
    kind_segment: list[S] = []
    kind_of: list[int] = []
    for seg in segments:
        key = (seg.source_rank, seg.target_rank, seg.shape, seg.source_strides, seg.target_strides)
        if key not in index_of:
            index_of[key] = len(kinds)
            kinds.append(kind(seg, src, tgt))
            kind_segment.append(seg)
        kind_of.append(index_of[key])
    found = fast_boxes(segments, kind_of, kinds, kind_segment, src, tgt, 2)
    assert found is not None
    accepted, w_rows, r_rows = found
    want_w, want_r, want = [], [], []
    for i, seg in enumerate(segments):
        ok = structural(i, seg, src, tgt) is None
        w = box_in_shard(seg.target_offset, seg.shape, seg.target_strides, (4, 6)) if ok else None
        r = box_in_shard(seg.source_offset, seg.shape, seg.source_strides, (4, 6)) if ok else None
        want.append(w is not None and r is not None)
        if w is not None and r is not None:
            want_w.append(w)
            want_r.append(r)
    assert accepted.tolist() == want
    assert [tuple(x) for x in w_rows.tolist()] == want_w and [tuple(x) for x in r_rows.tolist()] == want_r


def test_map_errors_name_their_side_in_every_form() -> None:
    bad = MAP_CASES["no holder"]
    good = two(A, B)
    suffix = "location 1, piece 0: names no holder (empty locations)"
    for target, source, side in ((bad, good, "target"), (good, bad, "source")):
        for form in (lambda m: m, lambda m: m.to_dict()):
            verdict = verify_plan(form(target), form(source), [], parameter="w")
            assert verdict.map_error == f"InvalidMapError: {side} map, {suffix}", verdict
            assert (verdict.status, verdict.parameter) == ("invalid_map", "w")
            assert verdict.reason == "a map is invalid, so the plan was not judged"
    batch = verify_plans({"a": (good, bad), "b": (bad, good)}, {"a": [], "b": []})
    assert [batch.verdicts[n].map_error for n in "ab"] == [
        f"InvalidMapError: source map, {suffix}", f"InvalidMapError: target map, {suffix}"
    ]
    assert verify_plan({"logical_shape": [4, 3], "ranks": 7}, good, []).map_error.startswith(  # type: ignore[union-attr]
        "InvalidMapError: target map"
    )
    assert verify_plan(good, {"logical_shape": [4, 3], "ranks": 7}, []).map_error.startswith(  # type: ignore[union-attr]
        "InvalidMapError: source map"
    )
    huge = M((1 << 62, 1), {}, {})
    assert verify_plan(huge, huge, [], parameter="w").parameter == "w"
    assert verify_plan(good, two(A, B, {0: (2, 3), 1: (1 << 62, 1)}), []).reason == (
        "source map, location 1: shard shape (4611686018427387904, 1) has 4611686018427387904 elements, at least "
        "2**62 (the oracle addresses fewer)"
    )


SWAPPED_ROWS = M((2, 3), {0: (2, 3)}, {0: [P((1, 3), 0, (3, 1), 3, (3, 1), [0]), P((1, 3), 3, (3, 1), 0, (3, 1), [0])]})
WHOLE = M((2, 3), {0: (2, 3)}, {0: [P((2, 3), 0, (3, 1), 0, (3, 1), [0])]})


@pytest.mark.parametrize("paths", [True, False])
def test_counterexamples_translate_through_pieces_away_from_the_shard_origin(paths: bool) -> None:
    """A target whose shard stores F's rows swapped: the logical coordinate of a reported address
    goes through the piece that holds it, not through the shard's origin."""
    row = S(0, 0, (3, 1), 0, 0, (3, 1), (1, 3))
    with fast_paths(paths):
        wrong = verify_plan(SWAPPED_ROWS, WHOLE, [S(0, 0, (3, 1), 0, 0, (3, 1), (2, 3))])
        gap = verify_plan(SWAPPED_ROWS, WHOLE, [row])
        twice = verify_plan(SWAPPED_ROWS, WHOLE, [row, row])
        itself = verify_plan(SPLIT, SPLIT, [FIRST, S(1, 0, (1, 1), 1, 0, (1, 1), (2, 2))])
        right = verify_plan(SWAPPED_ROWS, WHOLE, [S(0, 3, (3, 1), 0, 0, (3, 1), (1, 3)), S(0, 0, (3, 1), 0, 3, (3, 1), (1, 3))])
    assert wrong == Verdict(
        "invalid", None,
        "target location 0, offset 0 needs logical (1, 0), but segment 0 reads source location 0 at offset 0, which "
        "holds logical (0, 0) (logical (1, 0) is held by source location(s) [0])",
        0, 0, (1, 0), (0,), None, 1, 0,
    ), wrong
    assert gap == Verdict(
        "invalid", None,
        "target location 0, offset 3 is never written (the plan writes 3 of the 6 elements of shard (2, 3); unwritten "
        "box [1:2, 0:3])", 0, 3, (0, 0), (), None, 1, 0,
    ), gap
    assert twice == Verdict(
        "invalid", None, "target location 0, offset 0 is written more than once (by segments 0 and 1)",
        0, 0, (1, 0), (0, 1), None, 2, 0,
    ), twice
    assert itself == Verdict(
        "invalid", None, "target location 1, offset 1 is written more than once (by segment 1 twice)",
        1, 1, (2, 1), (1,), None, 2, 4,
    ), itself
    assert right.ok, right


def test_layout_edges_every_piece_and_location_is_read() -> None:
    # Every replica's own declaration is checked, not only the first one's.
    one_sided = M((2, 3), {0: (2, 3), 1: (2, 3)}, {
        0: [P((2, 3), 0, (3, 1), 0, (3, 1), [0, 1])], 1: [P((2, 3), 0, (3, 1), 0, (3, 1), [1])]})
    with pytest.raises(InvalidMapError) as caught:
        validate_map(one_sided, "source")
    assert str(caught.value) == (
        "source map, location 1, piece 0: logical box [0:2, 0:3] declares locations [1], but the locations holding "
        "part of it are [0, 1] (different locations)"
    )
    # Two 0-d pieces at one location hold the same (only) address.
    scalar = M((), {0: ()}, {0: [P((), 0, (), 0, (), [0]), P((), 0, (), 0, (), [0])]})
    with pytest.raises(InvalidMapError) as caught:
        validate_map(scalar, "source")
    assert str(caught.value) == (
        "source map, location 0: pieces 0 and 1 hold the same shard addresses (local boxes [] and [] share [])"
    )
    # An empty piece before a real one is skipped, not the end of the location.
    first_empty = M((2, 3), {0: (2, 3)}, {0: [P((0, 3), 6, (3, 1), 6, (3, 1), [0]), P((2, 3), 0, (3, 1), 0, (3, 1), [0])]})
    assert [h.index for h in validate_map(first_empty, "source").held[0]] == [1]
    # A location with an empty shard and no pieces at all.
    bare = M((4, 3), {0: (4, 3), 1: (0, 3)}, {0: [P((4, 3), 0, (3, 1), 0, (3, 1), [0])]})
    assert validate_map(bare, "target").held == {0: validate_map(bare, "target").held[0], 1: []}


@pytest.mark.parametrize("paths", [True, False])
def test_a_counterexample_just_past_a_piece_belongs_to_the_next_piece(paths: bool) -> None:
    reversed_rows = M((2, 3), {0: (2, 3)}, {0: [P((1, 3), 3, (3, 1), 0, (3, 1), [0]), P((1, 3), 0, (3, 1), 3, (3, 1), [0])]})
    with fast_paths(paths):
        verdict = verify_plan(reversed_rows, WHOLE, [S(0, 3, (3, 1), 0, 0, (3, 1), (1, 3))])
    assert verdict == Verdict(
        "invalid", None,
        "target location 0, offset 3 is never written (the plan writes 3 of the 6 elements of shard (2, 3); unwritten "
        "box [1:2, 0:3])", 0, 3, (0, 0), (), None, 1, 0,
    ), verdict


@pytest.mark.parametrize("paths", [True, False])
def test_source_and_target_footprints_are_bounded_by_their_own_shards(paths: bool) -> None:
    rows = contiguous_split_map((4, 3), [1, 1, 1, 1], 0)  # source shards (1, 3), target shards (2, 3)
    past = S(0, 3, (3, 1), 0, 0, (3, 1), (1, 3))
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, rows, [past])
    assert verdict == Verdict(
        "invalid", None, "segment 0: reads addresses 3..5 of source location 0, outside its 3 elements (shard (1, 3))",
        0, 2, (0, 2), (0,), None, 1, 0,
    ), verdict


def test_expanded_elements_add_up_over_segments() -> None:
    transposed = [S(0, 0, (1, 3), 0, 0, (1, 3), (3, 2)), S(1, 0, (1, 3), 1, 0, (1, 3), (3, 2))]
    verdict = verify_plan(SPLIT, SPLIT, transposed)
    assert verdict.ok and verdict.fallback_elements == 12 and verdict.checked_segments == 2, verdict


# ---------------------------------------------------------------------------------------------
# Second round (issue 15): the survivors of the first `make mutation` that a test can tell apart.


@pytest.mark.parametrize("paths", [True, False])
def test_a_footprint_past_the_end_from_offset_zero_names_its_last_element(paths: bool) -> None:
    """Offset 0 is in range, the end is not: the element reported is the last one read."""
    rows = contiguous_split_map((4, 3), [1, 1, 1, 1], 0)  # source shards (1, 3)
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, rows, [S(0, 0, (3, 1), 0, 0, (3, 1), (2, 3))])
    assert verdict == Verdict(
        "invalid", None, "segment 0: reads addresses 0..5 of source location 0, outside its 3 elements (shard (1, 3))",
        0, 5, (1, 2), (0,), None, 1, 0,
    ), verdict


@pytest.mark.parametrize("paths", [True, False])
def test_a_write_past_the_end_names_the_target_location_not_the_source(paths: bool) -> None:
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, SPLIT, [S(1, 0, (3, 1), 0, 3, (3, 1), (2, 3))])
    assert verdict == Verdict(
        "invalid", None, "segment 0: writes addresses 3..8 of target location 0, outside its 6 elements (shard (2, 3))",
        0, 8, None, (0,), None, 1, 0,
    ), verdict


@pytest.mark.parametrize("paths", [True, False])
def test_a_segment_that_wraps_is_named_with_its_side_and_offset(paths: bool) -> None:
    """Row-major strides, but the box runs past the end of a row: the report says which side and
    from which offset (over the fallback budget, so the reason is the verdict's)."""
    budget = "; the 1 non-box segment(s) total 2 elements, more than the element-level fallback budget of 0"
    for seg, why in [
        (S(1, 0, (3, 1), 1, 2, (3, 1), (1, 2)), "target: offset 2 with shape (1, 2) wraps past the edge of shard (2, 3)"),
        (S(1, 2, (3, 1), 1, 0, (3, 1), (1, 2)), "source: offset 2 with shape (1, 2) wraps past the edge of shard (2, 3)"),
    ]:
        with fast_paths(paths):
            verdict = verify_plan(SPLIT, SPLIT, [FIRST, seg], fallback_elements=0)
        assert verdict == Verdict(
            "unverifiable", None, f"segment 1 is not a box in its {why}{budget}", 1, None, None, (1,), None, 2, 0,
        ), verdict


# A shard whose pieces are not slabs along any axis, though their starts along axis 0 look like
# it (each piece's extent fits before the next start when measured from the shard's first row):
# the cut must use the k-d query and still find every piece.
#   rows 0-1: A (both columns); row 2: B | D; row 3: B | C; row 4: E | C
STAIRS = M((5, 2), {0: (5, 2)}, {0: [
    P((2, 2), 0, (2, 1), 0, (2, 1), [0]),  # A
    P((2, 1), 4, (2, 1), 4, (2, 1), [0]),  # B
    P((1, 1), 5, (2, 1), 5, (2, 1), [0]),  # D
    P((2, 1), 7, (2, 1), 7, (2, 1), [0]),  # C
    P((1, 1), 8, (2, 1), 8, (2, 1), [0]),  # E
]})
ROWS_OF_TWO = contiguous_split_map((5, 2), [1, 1, 1, 1, 1], 0)


@pytest.mark.parametrize("paths", [True, False])
def test_pieces_that_only_look_like_slabs_are_cut_exactly(paths: bool) -> None:
    by_row = [S(r, 0, (2, 1), 0, 2 * r, (2, 1), (1, 2)) for r in range(5)]
    with fast_paths(paths):
        assert verify_plan(STAIRS, ROWS_OF_TWO, by_row).ok
        assert verify_plan(ROWS_OF_TWO, STAIRS, [S(0, 2 * r, (2, 1), r, 0, (2, 1), (1, 2)) for r in range(5)]).ok
        wrong = verify_plan(STAIRS, ROWS_OF_TWO, [*by_row[:4], S(3, 0, (2, 1), 0, 8, (2, 1), (1, 2))])
    assert wrong == Verdict(
        "invalid", None,
        "target location 0, offset 8 needs logical (4, 0), but segment 4 reads source location 3 at offset 0, which "
        "holds logical (3, 0) (logical (4, 0) is held by source location(s) [4])",
        0, 8, (4, 0), (4,), None, 5, 0,
    ), wrong


# Past 2**53 elements a float64 can no longer count them one by one: volumes must stay integers.
BIG = (1 << 53) + 3
BIG_PIECES = M((BIG,), {0: (BIG,)}, {0: [
    P((1 << 53,), 0, (1,), 0, (1,), [0]),
    *(P((1,), (1 << 53) + k, (1,), (1 << 53) + k, (1,), [0]) for k in range(3)),
]})
BIG_WHOLE = M((BIG,), {0: (BIG,)}, {0: [P((BIG,), 0, (1,), 0, (1,), [0])]})


@pytest.mark.parametrize("paths", [True, False])
def test_volumes_past_two_to_the_53_are_counted_exactly(paths: bool) -> None:
    whole = S(0, 0, (1,), 0, 0, (1,), (BIG,))
    with fast_paths(paths):
        assert verify_plan(BIG_PIECES, BIG_WHOLE, [whole]).ok
        assert verify_plan(BIG_WHOLE, BIG_PIECES, [whole]).ok
        short = verify_plan(BIG_WHOLE, BIG_WHOLE, [S(0, 0, (1,), 0, 0, (1,), (BIG - 1,))])
    assert short == Verdict(
        "invalid", None,
        f"target location 0, offset {BIG - 1} is never written (the plan writes {BIG - 1} of the {BIG} elements of "
        f"shard ({BIG},); unwritten box [{BIG - 1}:{BIG}])",
        0, BIG - 1, (BIG - 1,), (), None, 1, 0,
    ), short


# The oracle re-checks what box.py's queries answer: a wrong answer is "unverifiable", with the
# re-check that caught it in the reason, never "ok" or a made-up counterexample.
QUADS = M((4, 4), {0: (4, 4)}, {0: [
    P((2, 2), 4 * lr + lc, (4, 1), 4 * sr + sc, (4, 1), [0])
    for (lr, lc), (sr, sc) in {(0, 0): (2, 2), (0, 2): (0, 0), (2, 0): (0, 2), (2, 2): (2, 0)}.items()
]})
HALVES = [S(0, 8 * h, (4, 1), 0, 8 * h, (4, 1), (2, 4)) for h in range(2)]


def _internal(what: str) -> str:
    return f"internal consistency check failed ({what}); not judged"


def test_a_box_query_that_misses_pairs_is_caught_by_the_volume_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    import refplan.oracle.judge as judge_module

    assert verify_plan(QUADS, QUADS, HALVES).ok
    monkeypatch.setattr(judge_module, "overlapping_pairs", lambda *args, **kwargs: set())
    # and the witnesses of a double write, which come from their own query (``box.overlap_witnesses``)
    monkeypatch.setattr(judge_module, "overlap_witnesses", lambda *args, **kwargs: np.empty((0, 2), dtype=np.int64))
    missed = verify_plan(QUADS, QUADS, HALVES)
    assert missed == Verdict(
        "unverifiable", None, _internal("the cuts of a box do not add up to the box"), checked_segments=2
    ), missed
    doubled = verify_plan(SPLIT, SPLIT, [FIRST, SECOND, FIRST])
    assert doubled == Verdict(
        "unverifiable", None, _internal("disjoint writes exceed shard 0"), checked_segments=3
    ), doubled


def test_a_box_query_that_reports_pairs_that_do_not_meet_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import refplan.oracle.judge as judge_module

    real = judge_module.overlapping_pairs

    def every_pair(boxes: Sequence[Box], *args: Any, groups: Sequence[int] | None = None, **kwargs: Any) -> Any:
        if groups is None:
            return real(boxes, *args, **kwargs)
        return {(i, j) for i, g in enumerate(groups) for j, h in enumerate(groups) if (g, h) == (0, 1)}

    monkeypatch.setattr(judge_module, "overlapping_pairs", every_pair)
    verdict = verify_plan(QUADS, QUADS, HALVES)
    assert verdict == Verdict("unverifiable", None, _internal("a reported cut is empty"), checked_segments=2), verdict


def test_a_gap_that_covers_cannot_find_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import refplan.oracle.judge as judge_module

    monkeypatch.setattr(judge_module, "covers", lambda *args, **kwargs: None)
    verdict = verify_plan(SPLIT, SPLIT, [FIRST])
    assert verdict == Verdict(
        "unverifiable", None, _internal("volume says shard 1 has a gap, covers() finds none"), checked_segments=1
    ), verdict


LINE = M((6,), {0: (6,)}, {0: [P((6,), 0, (1,), 0, (1,), [0])]})
COLUMN = M((4, 1), {0: (4, 1)}, {0: [P((4, 1), 0, (1, 1), 0, (1, 1), [0])]})


@pytest.mark.parametrize("paths", [True, False])
def test_one_axis_and_one_column_plans_with_several_writes_per_location(paths: bool) -> None:
    """Two writes at one location, on a 1-d tensor and on a one-column one: the quick
    'disjoint slabs on axis 0' test must read axis 0 and nothing else."""
    halves = [S(0, 3 * h, (1,), 0, 3 * h, (1,), (3,)) for h in range(2)]
    overlapping = [S(0, 0, (1,), 0, 0, (1,), (3,)), S(0, 2, (1,), 0, 2, (1,), (3,)), S(0, 5, (1,), 0, 5, (1,), (1,))]
    # Rows 0-1 and 1-2: as many elements as the shard, one written twice and one never.
    stacked = [S(0, 0, (1, 1), 0, 0, (1, 1), (2, 1)), S(0, 1, (1, 1), 0, 1, (1, 1), (2, 1))]
    with fast_paths(paths):
        assert verify_plan(LINE, LINE, halves).ok
        twice = verify_plan(LINE, LINE, overlapping)
        column = verify_plan(COLUMN, COLUMN, stacked)
    assert twice == Verdict(
        "invalid", None, "target location 0, offset 2 is written more than once (by segments 0 and 1)",
        0, 2, (2,), (0, 1), None, 3, 0,
    ), twice
    assert column == Verdict(
        "invalid", None, "target location 0, offset 1 is written more than once (by segments 0 and 1)",
        0, 1, (1, 0), (0, 1), None, 2, 0,
    ), column


@pytest.mark.parametrize("paths", [True, False])
def test_a_flat_copy_of_a_shard_is_expanded_not_taken_as_a_box(paths: bool) -> None:
    """A segment with one axis on a 2-d tensor (a flat copy of a whole (2, 3) shard) is not a
    box there: it goes to the element-level runs, beside ordinary box segments."""
    flat = S(1, 0, (1,), 1, 0, (1,), (6,))
    with fast_paths(paths):
        verdict = verify_plan(SPLIT, SPLIT, [FIRST, flat])
        shifted = verify_plan(SPLIT, SPLIT, [FIRST, S(1, 0, (1,), 1, 1, (1,), (5,)), S(1, 5, (1,), 1, 0, (1,), (1,))])
    assert verdict.ok and (verdict.checked_segments, verdict.fallback_elements) == (2, 6), verdict
    assert shifted == Verdict(
        "invalid", None,
        "target location 1, offset 0 needs logical (2, 0), but segment 2 reads source location 1 at offset 5, which "
        "holds logical (3, 2) (logical (2, 0) is held by source location(s) [1])",
        1, 0, (2, 0), (2,), None, 3, 6,
    ), shifted


class _AllAlike(P):
    """A piece subclass that claims to equal every other piece (a careless user type)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, P)

    def __hash__(self) -> int:
        return 0


def test_maps_of_piece_subclasses_are_validated_afresh_in_a_batch() -> None:
    """Two maps whose pieces compare equal but hold F's rows differently: the batch must not
    hand the first one's layout to the second."""
    def rows(order: Sequence[int]) -> M:
        return M((2, 3), {0: (2, 3)}, {0: [_AllAlike((1, 3), 3 * r, (3, 1), 3 * k, (3, 1), [0]) for k, r in enumerate(order)]})

    plan = [S(0, 0, (3, 1), 0, 0, (3, 1), (2, 3))]
    batch = verify_plans({"a": (rows([0, 1]), WHOLE), "b": (rows([1, 0]), WHOLE)}, {"a": plan, "b": plan})
    assert batch.verdicts["a"].ok, batch
    assert batch.verdicts["b"].status == "invalid" and batch.verdicts["b"].target_offset == 0, batch
