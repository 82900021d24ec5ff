"""refplan's own policies plan slab layouts by rows, without request objects (``planner._row_answers``).

``balanced``, ``lpt`` and ``first_holder`` have row forms (``policies.simple.ROW_FORMS``): the same
rule, fed (holders, processes, target process) keys and loads instead of requests. The planner
uses them when every parameter of a batch is a slab layout, checks their answers, and makes each
segment from its slab. Nothing may differ from the requests' path:

- each row form answers exactly as its policy on the requests those rows describe, for any
  requests (drawn general layouts too);
- plans (segments, statistics) and refusals are the same as when the same policy runs on request
  objects (a wrapper the planner does not know, which takes the requests' path), and the oracle
  judges them exact;
- a batch with parameters off the slab path is answered by rows all the same: those parameters'
  requests are read as rows (``_Units._place_all``'s reading), so the one call answers the whole
  batch as the policy would, and their answers still go through ``check_answers``;
- a row answer that is not one of its request's holders (or not an ``int``, or missing) is
  refused as ``check_answers`` refuses it, naming the answer, parameter, target location and box.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import Reached, examples, piece, pmap
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_replicated_fast_path import _batches, _dicts
from test_small_fast_path import _planned, _slab_batches

from refplan import plan_transfers, planner, verify_plans
from refplan.errors import InvalidReplicaPolicyError, PolicyRaisedError
from refplan.maps import ParamAffineMap, contiguous_split_map, replicate
from refplan.planner import collect_requests
from refplan.policies import balanced, first_holder, lpt
from refplan.policies.simple import ROW_FORMS, request_load, uses_processes
from refplan.requests import ReplicaAnswer, ReplicaRequest, TransferEndpoints, holder_locations
from refplan.strategies import map_batches

OWN = {"balanced": balanced, "lpt": lpt, "first_holder": first_holder}
Batch = dict[str, tuple[ParamAffineMap, ParamAffineMap]]


def _foreign(policy: Callable[[Sequence[ReplicaRequest]], list[ReplicaAnswer]]) -> Callable[..., Any]:
    """The same policy behind a function the planner does not know: planned by requests."""
    def wrapped(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
        return policy(requests)
    return wrapped


@contextmanager
def _counted(mixed: list[bool] | None = None) -> Iterator[list[bool]]:
    """Whether each batch answered by rows passed the rows' check (then it is planned by rows);
    ``mixed`` gets, per batch, whether some of its parameters were off the slab path."""
    calls: list[bool] = []
    original = planner._row_answers

    def spy(*args: Any) -> Any:
        got = original(*args)
        calls.append(got[1])
        if mixed is not None:
            mixed.append(any(p.rows is None for p in args[0]))
        return got

    planner._row_answers = spy  # type: ignore[assignment]
    try:
        yield calls
    finally:
        planner._row_answers = original  # type: ignore[assignment]


def _rows_of(requests: list[ReplicaRequest]) -> tuple[list[Any], list[int], bool]:
    """The rows of ``requests`` as ``_Units._place_all`` reads them."""
    by_process = uses_processes(requests)
    keys = [(holder_locations(r), r.candidate_processes, r.target_process if by_process else None) for r in requests]
    return keys, [request_load(r) for r in requests], by_process


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(map_batches(max_parameters=3, max_holders=3), _slab_batches().map(lambda d: d[0])),
       st.booleans(), st.booleans())
def test_row_forms_answer_as_their_policies(batch: Batch, bound: bool, sized: bool) -> None:
    ends = None
    if bound:
        ends = TransferEndpoints({loc: loc % 3 for loc in range(64)}, {loc: loc % 4 for loc in range(64)})
    try:
        requests = collect_requests(batch, endpoints=ends, element_size=2 if sized else None)
    except Exception:  # a drawn batch the planner refuses has no requests to answer
        return
    keys, sizes, by_process = _rows_of(requests)
    for policy in OWN.values():
        assert ROW_FORMS[policy](keys, sizes, by_process) == policy(requests)


def test_row_forms_are_exactly_the_own_read_only_policies() -> None:
    assert set(ROW_FORMS) == set(OWN.values()) == set(planner._READ_ONLY_POLICIES)
    assert dict(planner._ROW_FORMS) == ROW_FORMS
    # Empty batches, and by_process on no rows at all, answer nothing.
    for form in ROW_FORMS.values():
        assert form([], [], True) == [] and form([], [], False) == []


def test_balanced_rows_serves_local_copies_then_spreads_load() -> None:
    """A hand-checked case: holders (0, 1) in processes (5, 6); the first request (20 bytes) has
    its target in process 6, so it is a local copy from location 1; then 10 bytes go to the less
    loaded process 5 (location 0), and 4 bytes to process 5 again (10 < 20)."""
    keys = [((0, 1), (5, 6), 6), ((0, 1), (5, 6), 9), ((0, 1), (5, 6), 9)]
    assert ROW_FORMS[balanced](keys, [20, 10, 4], True) == [1, 0, 0]
    # Per location (no processes): nothing is local; largest first: 20 to 0, 10 to 1, 4 to 1.
    assert ROW_FORMS[balanced](keys, [20, 10, 4], False) == [0, 1, 1]
    assert ROW_FORMS[lpt](keys, [20, 10, 4], True) == [0, 1, 1]  # no local preference
    assert ROW_FORMS[first_holder](keys, [20, 10, 4], True) == [0, 0, 0]


def test_drawn_slab_batches_plan_by_rows_as_by_requests() -> None:
    """Plans (every segment and statistic) or refusals equal between the rows' path and the same
    policy on requests; the oracle judges the plans exact. Counted: enough batches go by rows."""
    reached = Reached()

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(_slab_batches(), _batches()), st.sampled_from(sorted(OWN)))
    def both(drawn: tuple[Batch, dict[str, Any]], name: str) -> None:
        batch, kwargs = drawn
        mixed: list[bool] = []
        with _counted(mixed) as calls:
            rows = _planned(batch, **kwargs, replica_policy=OWN[name])
        requests = _planned(batch, **kwargs, replica_policy=_foreign(OWN[name]))
        assert _dicts(rows) == _dicts(requests)
        assert (rows[0] == "ok") == (requests[0] == "ok")
        if rows[0] != "ok":
            reached.hit("refused by both")
            return
        assert verify_plans(batch, rows[1][0]).status == "ok"
        if calls == [True]:
            reached.hit("planned by rows, judged exact")
            if mixed == [True]:
                reached.hit("some parameters by rows, others by requests, judged exact")

    both()
    reached.at_least("planned by rows, judged exact", max(1, examples() // 3))
    reached.at_least("some parameters by rows, others by requests, judged exact", max(1, examples() // 20))


def _two_pieces() -> ParamAffineMap:
    """F = (4, 2) held by location 0 as two pieces, rows swapped: not a slab map, so planned by
    requests."""
    return pmap((4, 2), {0: (4, 2)}, {
        0: [piece((2, 2), 4, (2, 1), 0, (2, 1), [0]), piece((2, 2), 0, (2, 1), 4, (2, 1), [0])],
    })


def _mixed_batch() -> Batch:
    """Two slab layouts around one that is not (``_two_pieces``): boxes [0,2) held by 0 and 2,
    [2,4) by 1 and 3, read by target locations 0 and 1 for "a" and "c"; "b" is read from 0 alone."""
    source = replicate(contiguous_split_map((4, 2), [2, 2], 0), 2)
    target = contiguous_split_map((4, 2), [1, 3], 0)
    return {"a": (target, source), "b": (contiguous_split_map((4, 2), [4], 0), _two_pieces()), "c": (target, source)}


def test_a_parameter_off_the_slab_path_is_answered_by_rows_with_the_rest() -> None:
    """One row-form call answers the whole batch; the parameter off the slab path is read as rows
    from its requests. Plans equal the requests' path's (where the same policy sees every request
    object), and the oracle judges them exact, with and without endpoints."""
    batch = _mixed_batch()
    for ends in (TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3}, {0: 4, 1: 5}), None):
        for policy in OWN.values():
            mixed: list[bool] = []
            with _counted(mixed) as calls:
                plans = plan_transfers(batch, endpoints=ends, element_size=2, replica_policy=policy)
            assert calls == [True] and mixed == [True]
            assert plans == plan_transfers(batch, endpoints=ends, element_size=2, replica_policy=_foreign(policy))
            assert verify_plans(batch, plans).status == "ok"
            # The loads of "b" count: without it, "a" and "c" may be answered otherwise.
            ac = {k: batch[k] for k in "ac"}
            with _counted() as calls:
                slabs = plan_transfers(ac, endpoints=ends, element_size=2, replica_policy=policy)
            assert calls == [True]
            assert slabs == plan_transfers(ac, endpoints=ends, element_size=2, replica_policy=_foreign(policy))


@pytest.mark.parametrize(("bad", "what"), [
    (3, "answer 3 (parameter 'b', target location 0, box [0:2, 0:2]): location 1 is not one of its validated "
        "holders [0]"),
    (7, "answer 7 (parameter 'c', target location 1, box [2:4, 0:2]): location 0 is not one of its validated "
        "holders [1, 3]"),
])
def test_a_bad_row_answer_in_a_mixed_batch_is_named_as_on_the_requests_path(bad: int, what: str) -> None:
    """A wrong answer for the parameter off the slab path, or for a slab parameter after it: the
    refusal names the answer's index in the whole batch, as any policy giving those answers gets."""
    batch = _mixed_batch()
    good = ROW_FORMS[balanced]

    def answers(keys: Any, sizes: Any, by_process: bool) -> list[int]:
        got = good(keys, sizes, by_process)
        got[bad] = 1 if got[bad] == 0 else 0  # 3: 0 -> 1; 7: 1 or 3 -> 0 (never a holder there)
        return got

    saved = planner._ROW_FORMS
    planner._ROW_FORMS = ((balanced, answers),)
    try:
        with _counted() as calls, pytest.raises(InvalidReplicaPolicyError) as refused:
            plan_transfers(batch)
    finally:
        planner._ROW_FORMS = saved
    assert calls == [False]
    assert what in str(refused.value)
    given_rows = answers(*_rows_of(collect_requests(batch)))
    with pytest.raises(InvalidReplicaPolicyError) as same:
        plan_transfers(batch, replica_policy=lambda requests: given_rows)
    assert str(refused.value) == str(same.value)


def test_unbound_locations_are_refused_as_on_the_requests_path() -> None:
    source = replicate(contiguous_split_map((4, 2), [2, 2], 0), 2)
    target = contiguous_split_map((4, 2), [1, 3], 0)
    batch: Batch = {"w": (target, source)}
    for ends, nodes in (
        (TransferEndpoints({0: 0, 1: 1, 2: 2}, {0: 4, 1: 5}), None),  # source 3 unbound
        (TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3}, {0: 4}), None),  # target 1 unbound
        (TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3}, {0: 4, 1: 5}), {0: 0, 1: 0, 2: 0, 3: 0, 4: 1}),  # process 5
        (TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3}, {0: 4, 1: 5}), {0: 0, 1: 0, 2: 0, 4: 1, 5: 1}),  # process 3
    ):
        with pytest.raises(Exception) as rows:
            plan_transfers(batch, endpoints=ends, process_node=nodes)
        with pytest.raises(Exception) as requests:
            plan_transfers(batch, endpoints=ends, process_node=nodes, replica_policy=_foreign(balanced))
        assert type(rows.value) is type(requests.value) and str(rows.value) == str(requests.value)


@pytest.mark.parametrize(("answers", "what"), [
    (lambda n: [1] * n, "answer 0 (parameter 'a', target location 0, box [0:1, 0:2]): location 1 is not one of "
                        "its validated holders [0, 2]"),
    (lambda n: [0, 2, 5, 0, 2, 1][:n], "answer 2 (parameter 'a', target location 1, box [2:4, 0:2]): "
                                       "location 5 is not one of its validated holders [1, 3]"),
    (lambda n: [True] + [0] * (n - 1), "answer 0 (parameter 'a', target location 0, box [0:1, 0:2]): answer True "
                                       "(bool) is neither an int location nor a sequence of ReplicaPart"),
    (lambda n: [0, 0, 1, 0, 0, 0.0][:n], "answer 5 (parameter 'b', target location 1, box [2:4, 0:2]): answer "
                                         "0.0 (float) is neither"),
    (lambda n: [0] * (n - 1), "replica policy returned 5 answers for 6 requests"),
    (lambda n: {0: 0}, "replica policy returned a dict; expected a sequence of 6 answers"),
])
def test_row_answers_are_checked(answers: Callable[[int], Any], what: str) -> None:
    """A row form's answers are checked before any segment exists; one that fails is refused by
    ``check_answers`` itself, with the text any policy giving those answers gets."""
    source = replicate(contiguous_split_map((4, 2), [2, 2], 0), 2)  # box [0,2) held by 0 and 2, [2,4) by 1, 3
    target = contiguous_split_map((4, 2), [1, 3], 0)
    batch: Batch = {"a": (target, source), "b": (target, source)}
    saved = planner._ROW_FORMS
    planner._ROW_FORMS = ((balanced, lambda keys, sizes, by_process: answers(len(keys))),)
    try:
        with _counted() as calls, pytest.raises(InvalidReplicaPolicyError) as refused:
            plan_transfers(batch)
    finally:
        planner._ROW_FORMS = saved
    assert calls == [False]  # answered by rows, refused by the check
    assert what in str(refused.value)
    with pytest.raises(InvalidReplicaPolicyError) as same:
        plan_transfers(batch, replica_policy=lambda requests: answers(len(requests)))
    assert str(refused.value) == str(same.value)
    assert plan_transfers(batch) == plan_transfers(batch, replica_policy=_foreign(balanced))


def test_row_answers_check_accepts_what_check_answers_accepts() -> None:
    """Answers the rows' own check does not take (a tuple) go to ``check_answers``, which
    accepts them as from any policy: the same plans."""
    source = replicate(contiguous_split_map((4, 2), [2, 2], 0), 2)
    batch: Batch = {"w": (contiguous_split_map((4, 2), [1, 3], 0), source)}
    want = plan_transfers(batch, replica_policy=_foreign(balanced))
    saved = planner._ROW_FORMS
    planner._ROW_FORMS = ((balanced, lambda keys, sizes, by_process: tuple(ROW_FORMS[balanced](keys, sizes, False))),)  # type: ignore[assignment]
    try:
        assert plan_transfers(batch) == want
    finally:
        planner._ROW_FORMS = saved


def test_a_row_form_that_raises_is_the_policys_error() -> None:
    def broken(keys: Any, sizes: Any, by_process: bool) -> Any:
        raise KeyError("lost")

    batch: Batch = {"w": (contiguous_split_map((4,), [2, 2], 0), contiguous_split_map((4,), [4], 0))}
    saved = planner._ROW_FORMS
    planner._ROW_FORMS = ((balanced, broken),)
    try:
        with pytest.raises(PolicyRaisedError, match="replica policy raised KeyError: 'lost'") as raised:
            plan_transfers(batch)
    finally:
        planner._ROW_FORMS = saved
    assert isinstance(raised.value.__cause__, KeyError)


def _weighted_batch(with_general: bool) -> tuple[Batch, dict[str, int]]:
    """Three whole parameters held by locations 0 and 1 (processes 0, 1), read by location 0
    (process 2): 100 x 1, 30 x 4 and 50 x 2 bytes, so that loads in bytes and in elements order
    them differently; with ``with_general``, a fourth parameter off the slab path."""
    batch: Batch = {}
    sizes = {"a": 1, "c": 4, "d": 2}
    for name, n in (("a", 100), ("c", 30), ("d", 50)):
        batch[name] = (contiguous_split_map((n,), [n], 0), replicate(contiguous_split_map((n,), [n], 0), 2))
    if with_general:
        batch["b"] = (contiguous_split_map((4, 2), [4], 0), _two_pieces())
        sizes["b"] = 2
    return batch, sizes


@pytest.mark.parametrize("with_general", [False, True])
def test_loads_are_weighed_in_bytes_by_rows_as_by_requests(with_general: bool) -> None:
    """Rows carry each request's load in bytes (elements times the parameter's element size), a
    slab layout's and (``with_general``) those read from a parameter's requests alike."""
    batch, sizes = _weighted_batch(with_general)
    ends = TransferEndpoints({0: 0, 1: 1}, {0: 2})
    for name, policy in OWN.items():
        with _counted() as calls:
            rows = plan_transfers(batch, endpoints=ends, element_size=sizes, replica_policy=policy)
        assert calls == [True]
        assert rows == plan_transfers(batch, endpoints=ends, element_size=sizes, replica_policy=_foreign(policy))
        if name != "first_holder":
            # The case is one where weighing by elements would choose otherwise.
            chosen = {n: plan.segments[0].source_rank for n, plan in rows.items() if n != "b"}
            by_elements = plan_transfers(batch, endpoints=ends, element_size=dict.fromkeys(sizes, 1),
                                         replica_policy=policy)
            assert chosen != {n: plan.segments[0].source_rank for n, plan in by_elements.items() if n != "b"}
