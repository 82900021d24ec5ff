"""Hostile input, case by case: each asserts its documented outcome (error class, or a plan) AND
that it comes back within a second (``fast``); those that declare huge tensors also assert the
peak traced memory stays under a few MiB (``small_peak``). ``fuzz/README.md`` has the same cases
as a table.

Tests marked ``xfail(strict=True)`` pin bugs found here in modules this suite does not own; each
reason says what is wrong. Inputs that crashed a fuzz harness are at the end ("regressions").
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from refplan import (
    AffinePiece,
    AffineTransferError,
    InvalidMapError,
    InvalidReplicaPolicyError,
    ParamAffineMap,
    PlanBudget,
    ReplicaPart,
    ReplicaRequest,
    TransferEndpoints,
    UnsupportedLayoutError,
    contiguous_split_map,
    replicate,
    replicated_map,
)
from refplan.cli import main as cli_main
from refplan.errors import PolicyRaisedError
from refplan.files import MapsBatch, dump_maps, load_json, loads_json, parse_maps, parse_plans
from refplan.plan import MAPS_FORMAT, TransferPlan, TransferSegment
from refplan.planner import plan_transfer, plan_transfers
from refplan.verify import verify_plan

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECOND = 1.0
WALL_SLACK = 10
MIB = 1 << 20


def fast(fn: Callable[[], Any], seconds: float = SECOND) -> Any:
    """``fn()`` (returned, or its exception re-raised) after asserting it took under ``seconds``.

    The bound is on CPU time, so a test stays meaningful on a shared two-core CI runner where
    wall time can stretch several-fold; wall time must stay within ``WALL_SLACK`` times the bound
    too, so a call that blocks or sleeps instead of computing is still caught.
    """
    start, cpu = time.perf_counter(), time.process_time()
    try:
        return fn()
    finally:
        used, elapsed = time.process_time() - cpu, time.perf_counter() - start
        assert used < seconds, f"took {used:.2f} s of CPU, bound {seconds} s"
        assert elapsed < seconds * WALL_SLACK, f"took {elapsed:.2f} s of wall time, bound {seconds * WALL_SLACK} s"


def refused(cls: type[BaseException], fn: Callable[[], Any], match: str | None = None,
            seconds: float = SECOND) -> BaseException:
    """Assert ``fn`` raises ``cls`` (or a subclass) matching ``match``, within ``seconds``."""
    with pytest.raises(cls, match=match) as info:
        fast(fn, seconds)
    return info.value


def small_peak(fn: Callable[[], Any], limit: int = 4 * MIB) -> Any:
    """``fn()`` with its peak traced allocation (numpy included) asserted under ``limit``.

    Returns the result, or the ``AffineTransferError`` it raised (so refusals are measured too).
    """

    def call() -> Any:
        try:
            return fn()
        except AffineTransferError as exc:
            return exc

    call()  # warm caches and lazy imports: the bound is about the call, not first-use setup
    tracemalloc.start()
    try:
        result = call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peak traced memory {peak / MIB:.1f} MiB"
    return result


def maps_text(pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]], **extra: Any) -> str:
    doc = dump_maps(MapsBatch(pairs))
    doc.update(extra)
    return json.dumps(doc)


def load(text: str | bytes) -> MapsBatch:
    return parse_maps(loads_json(text, "maps"))


def one_piece(**fields: Any) -> dict[str, Any]:
    """A maps document for F (4, 4) held whole by location 0, with piece fields overridden."""
    piece: dict[str, Any] = {"shape": [4, 4], "source": [0, [4, 1]], "dest": [0, [4, 1]], "locations": [0]}
    piece.update(fields)
    whole = {"logical_shape": [4, 4], "ranks": {"0": {"shard_shape": [4, 4], "pieces": [piece]}}}
    good = replicated_map((4, 4), 1).to_dict()
    return {"format": MAPS_FORMAT, "parameters": {"w": {"target": good, "source": whole}}}


def plan_doc(doc: Any) -> dict[str, TransferPlan]:
    return plan_transfers(parse_maps(doc).pairs)


# ---------------------------------------------------------------------------------------------
# Huge declared tensors: refused, or planned without per-element work.

N18 = 10**18


def test_replicated_1e18_elements_plans_in_ms_with_tiny_memory() -> None:
    target, source = replicated_map((N18,), 4), replicated_map((N18,), 2)
    plan = fast(lambda: small_peak(lambda: plan_transfer(target, source)))
    assert len(plan.segments) == 4 and plan.moved_elements == 4 * N18
    assert fast(lambda: small_peak(lambda: verify_plan(target, source, plan))).status == "ok"


def test_1e9_by_1e9_split_2_to_4_plans_in_ms() -> None:
    n = 10**9
    source = contiguous_split_map((n, n), [n // 2, n // 2], 0)
    target = contiguous_split_map((n, n), [n // 4] * 4, 1)
    plan = fast(lambda: small_peak(lambda: plan_transfer(target, source)))
    assert len(plan.segments) == 8 and plan.moved_elements == n * n
    assert fast(lambda: small_peak(lambda: verify_plan(target, source, plan))).status == "ok"


def test_1e18_elements_with_a_tiny_piece_set_is_refused() -> None:
    # A valid-looking 4-element piece claiming to be all of a 10^18-element source: refused by
    # volume sums and box arithmetic, never by walking elements.
    tiny = ParamAffineMap((N18,), {0: (4,)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])]})
    err = fast(lambda: small_peak(lambda: plan_transfer(replicated_map((N18,), 1), tiny)))
    assert type(err) is InvalidMapError and "cover" in str(err)
    assert fast(lambda: small_peak(lambda: verify_plan(replicated_map((N18,), 1), tiny, []))).status == "invalid_map"


def test_extent_above_2_62_is_refused() -> None:
    big = replicated_map((2**70,), 1)
    refused(InvalidMapError, lambda: plan_transfer(big, big), match="above 2\\*\\*62")
    assert fast(lambda: verify_plan(big, big, [])).status == "unverifiable"


def test_extent_of_exactly_2_62_plans_and_the_oracle_calls_it_unverifiable() -> None:
    source = contiguous_split_map((2**62,), [2**62], 0)
    target = contiguous_split_map((2**62,), [2**61, 2**61], 0)
    plan = fast(lambda: plan_transfer(target, source))
    assert plan.moved_elements == 2**62
    assert fast(lambda: verify_plan(target, source, plan)).status == "unverifiable"  # numel >= 2**62


def test_volume_above_2_62_is_refused() -> None:
    big = replicated_map((2**40, 2**40), 2)
    refused(AffineTransferError, lambda: plan_transfer(big, replicated_map((2**40, 2**40), 1)))


# ---------------------------------------------------------------------------------------------
# Negative, zero and huge strides and offsets (map pieces).


@pytest.mark.parametrize(("fields", "cls", "match"), [
    ({"source": [-4, [4, 1]]}, InvalidMapError, "not a coordinate"),
    ({"dest": [-1, [4, 1]]}, InvalidMapError, "not a coordinate"),
    ({"source": [16, [4, 1]]}, InvalidMapError, "not a coordinate"),
    ({"source": [2**63, [4, 1]]}, InvalidMapError, "above 2\\*\\*62"),
    ({"dest": [10**30, [4, 1]]}, InvalidMapError, "above 2\\*\\*62"),
    ({"source": [0, [-4, 1]]}, UnsupportedLayoutError, "strides"),
    ({"source": [0, [0, 1]]}, UnsupportedLayoutError, "strides"),
    ({"dest": [0, [4, 0]]}, UnsupportedLayoutError, "strides"),
    ({"source": [0, [2**63, 1]]}, InvalidMapError, "above 2\\*\\*62"),
    ({"source": [0, [1, 4]]}, UnsupportedLayoutError, "strides"),  # a transpose
    ({"dest": [0, [1, 1]]}, UnsupportedLayoutError, "strides"),  # self-overlapping: 0,1,1,2,...
    ({"shape": [-4, 4]}, InvalidMapError, "negative|nonempty shard"),
    ({"shape": [4, 4, 1]}, InvalidMapError, "axes"),
    ({"source": [0, [4]]}, InvalidMapError, "stride vector length"),
    ({"locations": []}, InvalidMapError, "no holder"),
    ({"locations": [0, 7]}, InvalidMapError, "different locations"),
])
def test_bad_offsets_strides_and_extents(fields: dict[str, Any], cls: type[Exception], match: str) -> None:
    doc = one_piece(**fields)
    refused(cls, lambda: plan_doc(doc), match=match)
    verdict = fast(lambda: verify_plan(*parse_maps(doc).pairs["w"], []))
    assert verdict.status == "invalid_map"


def test_any_stride_on_a_size_1_axis_and_garbage_in_empty_pieces_are_accepted() -> None:
    rows = [AffinePiece((1, 4), 4 * r, (-5, 1), 4 * r, (2**62, 1), [0]) for r in range(4)]
    empty = AffinePiece((0, 4), -(2**62), (-1, 0), 2**62, (0, -1), [0])  # R12: skipped
    source = ParamAffineMap((4, 4), {0: (4, 4)}, {0: [*rows, empty]})
    target = replicated_map((4, 4), 2)
    plan = fast(lambda: plan_transfer(target, source))
    assert fast(lambda: verify_plan(target, source, plan)).ok


# ---------------------------------------------------------------------------------------------
# Values of the wrong type where integers belong (JSON as Python's json parses it).

WRONG = ["true", "1.0", '"1"', "null", "NaN", "Infinity", "-Infinity", "4e0", "[]", "{}"]


@pytest.mark.parametrize("value", WRONG)
@pytest.mark.parametrize("field", ["logical_shape", "shard_shape", "shape", "offset", "stride", "location"])
def test_non_integers_where_integers_belong(field: str, value: str) -> None:
    good = replicated_map((4,), 1).to_dict()
    rank = good["ranks"][0]
    piece = rank["pieces"][0]
    marker = "__X__"
    if field == "logical_shape":
        good["logical_shape"] = [marker]
    elif field == "shard_shape":
        rank["shard_shape"] = [marker]
    elif field == "shape":
        piece["shape"] = [marker]
    elif field == "offset":
        piece["source"] = [marker, [1]]
    elif field == "stride":
        piece["dest"] = [0, [marker]]
    else:
        piece["locations"] = [marker]
    text = json.dumps({"format": MAPS_FORMAT, "parameters": {"w": {"target": good, "source": good}}})
    text = text.replace(f'"{marker}"', value)
    refused(InvalidMapError, lambda: load(text), match="expected")


@pytest.mark.parametrize("value", WRONG)
def test_non_integers_in_plans_and_tables(value: str) -> None:
    seg = '{"shape": [4], "source": [0, 0, [1]], "target": [0, __X__, [1]]}'
    plans = '{"format": "refplan.plans/1", "parameters": {"w": {"logical_shape": [4], "segments": [' + seg + "]}}}"
    refused(InvalidMapError, lambda: parse_plans(loads_json(plans.replace("__X__", value))), match="expected")
    base = json.loads(maps_text({"w": (replicated_map((4,), 1), replicated_map((4,), 1))}))
    for key, table in (
        ("endpoints", '{"source": {"0": __X__}, "target": {"0": 0}}'),
        ("process_node", '{"0": __X__}'),
        ("element_size", '{"w": __X__}'),
    ):
        text = json.dumps({**base, key: "__T__"}).replace('"__T__"', table.replace("__X__", value))
        refused(InvalidMapError, lambda text=text: load(text))


def test_scale_that_is_not_a_usable_number() -> None:
    refused(InvalidMapError, lambda: load(json.dumps(one_piece(scale="1"))), match="scale")
    refused(InvalidMapError, lambda: load(json.dumps(one_piece(scale=True))), match="scale")
    refused(InvalidMapError, lambda: load(json.dumps(one_piece(scale=10**400))), match="scale")  # was OverflowError
    for text in ("NaN", "Infinity", "2"):
        doc = json.dumps(one_piece(scale=0.5)).replace("0.5", text)
        refused(UnsupportedLayoutError, lambda doc=doc: plan_transfers(load(doc).pairs), match="scale")
    refused(InvalidMapError, lambda: load(json.dumps(one_piece(scale=0))), match="zero scale")


def test_integer_literal_with_5000_digits_is_invalid_json_not_a_crash(tmp_path: Path) -> None:
    text = maps_text({"w": (replicated_map((4,), 1), replicated_map((4,), 1))})
    text = text.replace("[4]", "[" + "9" * 5000 + "]", 1)
    refused(InvalidMapError, lambda: loads_json(text), match="not valid JSON")  # was a bare ValueError
    path = tmp_path / "maps.json"
    path.write_text(text)
    refused(InvalidMapError, lambda: load_json(path), match="not valid JSON")


# ---------------------------------------------------------------------------------------------
# Keys: locations as strings and ints, collisions, duplicates.


def test_rank_keys_as_string_and_int_colliding() -> None:
    entry = {"shard_shape": [4], "pieces": [{"shape": [4], "source": [0, [1]], "dest": [0, [1]], "locations": [0]}]}
    refused(InvalidMapError, lambda: ParamAffineMap.from_dict({"logical_shape": [4], "ranks": {"0": entry, 0: entry}}),
            match="listed twice")
    text = '{"logical_shape": [4], "ranks": {"0": E, "00": E}}'.replace("E", json.dumps(entry))
    refused(InvalidMapError, lambda: ParamAffineMap.from_dict(loads_json(text)), match="listed twice")


@pytest.mark.parametrize("key", ["--1", "+1", "1_0", "\u00b2", "\u0661", "0x1", "", "-", "1.0", "9" * 5000])
def test_rank_keys_that_are_not_ascii_decimal_integers(key: str) -> None:
    entry = {"shard_shape": [4], "pieces": []}
    refused(InvalidMapError, lambda: ParamAffineMap.from_dict({"logical_shape": [4], "ranks": {key: entry}}),
            match="not an integer")  # '--1', '²' and the 5000-digit key raised a bare ValueError; '١' was 1


def test_spaces_around_a_rank_key_are_still_accepted() -> None:
    entry = {"shard_shape": [4], "pieces": [{"shape": [4], "source": [0, [1]], "dest": [0, [1]], "locations": [3]}]}
    assert ParamAffineMap.from_dict({"logical_shape": [4], "ranks": {" 3 ": entry}}).ranks == (3,)


def test_duplicate_json_keys_are_refused_not_last_wins() -> None:
    pair = {"w": (replicated_map((4,), 1), replicated_map((4,), 1))}
    text = maps_text(pair)
    dup_param = text[:-2] + ', "w": ' + text[text.index('{"target"'):-2] + "}}"
    refused(InvalidMapError, lambda: loads_json(dup_param), match="appears twice")
    dup_rank = text.replace('"ranks": {', '"ranks": {"0": {"shard_shape": [4], "pieces": []}, ', 1)
    refused(InvalidMapError, lambda: loads_json(dup_rank), match="appears twice")
    refused(InvalidMapError, lambda: parse_maps({"format": MAPS_FORMAT, "parameters": {
        1: json.loads(text)["parameters"]["w"], "1": json.loads(text)["parameters"]["w"]}}), match="listed twice")


def test_colliding_keys_in_endpoints_and_process_node() -> None:
    text = maps_text({"w": (replicated_map((4,), 1), replicated_map((4,), 1))})
    base = json.loads(text)
    ends = {"source": {"0": 0, "00": 1}, "target": {"0": 0}}
    refused(InvalidMapError, lambda: parse_maps({**base, "endpoints": ends}), match="listed twice")
    refused(InvalidMapError, lambda: parse_maps({**base, "endpoints": {"source": {"0": 0}, "target": {"0": 0},
                                                                    "x": {}}}), match="endpoints")
    refused(InvalidMapError, lambda: parse_maps({**base, "process_node": {"1": 0, " 1": 1}}), match="listed twice")
    refused(InvalidMapError, lambda: parse_maps({**base, "process_node": {"1_0": 0}}), match="not an integer")


def test_endpoints_from_dict_refuses_colliding_locations() -> None:
    refused(InvalidMapError, lambda: TransferEndpoints.from_dict({"source": {"0": 0, "00": 1}, "target": {}}))


# ---------------------------------------------------------------------------------------------
# Deep, long and large documents.


def test_deeply_nested_json_is_invalid_map_error(tmp_path: Path) -> None:
    text = '{"format": "refplan.maps/1", "parameters": ' + "[" * 100_000 + "]" * 100_000 + "}"
    refused(InvalidMapError, lambda: loads_json(text), match="nested too deeply")
    path = tmp_path / "deep.json"
    path.write_text(text)
    refused(InvalidMapError, lambda: load_json(path), match="nested too deeply")
    parseable = '{"logical_shape": ' + "[" * 900 + "]" * 900 + ', "ranks": {}}'
    err = refused(InvalidMapError, lambda: ParamAffineMap.from_dict(loads_json(parseable)), match="integers")
    assert len(str(err)) < 300  # the message quotes a bounded repr, not 900 levels


def test_long_lists_are_refused_without_quadratic_work() -> None:
    many_axes = replicated_map((1,) * 8, 1).to_dict()
    many_axes["logical_shape"] = [1] * 300_000
    doc = {"format": MAPS_FORMAT, "parameters": {"w": {"target": many_axes, "source": many_axes}}}
    text = json.dumps(doc)
    refused(UnsupportedLayoutError, lambda: plan_transfers(load(text).pairs), match="max_ndim")
    floats = {**many_axes, "logical_shape": [0.5] * 300_000}
    err = refused(InvalidMapError, lambda: ParamAffineMap.from_dict(floats), match="integers")
    assert len(str(err)) < 300


def test_a_million_empty_pieces_are_planned_and_one_more_than_the_budget_is_refused() -> None:
    # Checked: 10**6 < max_pieces_per_map = 2**20, so a million empty pieces are *planned*; the
    # cost is linear in listed pieces (about 1-3 us each, no per-element work). Past the budget
    # the count is refused before any piece is looked at.
    real = AffinePiece((4,), 0, (1,), 0, (1,), [0])
    empty = AffinePiece((0,), 0, (1,), 0, (1,), [0])
    million = ParamAffineMap((4,), {0: (4,)}, {0: [real] + [empty] * 10**6})
    plan = fast(lambda: plan_transfer(replicated_map((4,), 1), million), seconds=10 * SECOND)
    assert len(plan.segments) == 1
    over = ParamAffineMap((4,), {0: (4,)}, {0: [real] + [empty] * PlanBudget().max_pieces_per_map})
    refused(AffineTransferError, lambda: plan_transfer(replicated_map((4,), 1), over), match="max_pieces_per_map")
    refused(AffineTransferError, lambda: plan_transfer(replicated_map((4,), 1), million, PlanBudget(
        max_pieces_per_map=1000)), match="max_pieces_per_map")


def test_many_empty_pieces_from_json_parse_and_plan_linearly() -> None:
    # From a file the JSON parse and per-piece objects dominate (a few us per piece, linear);
    # 20 000 empty pieces keep this test quick while showing nothing is per element or quadratic.
    doc = json.loads(maps_text({"w": (replicated_map((4,), 1), replicated_map((4,), 1))}))
    empty = {"shape": [0], "source": [0, [1]], "dest": [0, [1]], "locations": [0]}
    doc["parameters"]["w"]["source"]["ranks"]["0"]["pieces"] += [empty] * 20_000
    text = json.dumps(doc)
    batch = fast(lambda: load(text), seconds=3 * SECOND)
    assert batch.pairs["w"][1].piece_count() == 20_001
    assert fast(lambda: plan_transfers(batch.pairs), seconds=2 * SECOND)["w"].moved_elements == 4


def test_parameter_name_length_does_not_multiply_planning_time() -> None:
    source = contiguous_split_map((300,), [1] * 300, 0)
    target = replicated_map((300,), 1)
    start = time.process_time()
    plan_transfers({"w": (target, source)})
    short = time.process_time() - start
    start = time.process_time()
    plan_transfers({"w" * MIB: (target, source)})
    long = time.process_time() - start
    assert long - short < 0.25, f"a 1 MiB name adds {long - short:.2f} s to a 300-location plan"


def test_parameter_name_length_does_not_multiply_parsing_time() -> None:
    pieces = [{"shape": [1], "source": [i, [1]], "dest": [0, [1]], "locations": [i]} for i in range(300)]
    source = {"logical_shape": [300], "ranks": {str(i): {"shard_shape": [1], "pieces": [p]}
                                                for i, p in enumerate(pieces)}}
    doc = {"format": MAPS_FORMAT, "parameters": {"w" * (4 * MIB): {"target": source, "source": source}}}
    batch = fast(lambda: parse_maps(doc))  # messages are built lazily, so the name is not copied per piece
    assert len(batch.pairs) == 1


# ---------------------------------------------------------------------------------------------
# Duplicate and self-overlapping pieces.


def test_duplicate_pieces() -> None:
    piece = AffinePiece((4,), 0, (1,), 0, (1,), [0])
    twice = ParamAffineMap((4,), {0: (4,)}, {0: [piece, piece]})
    refused(InvalidMapError, lambda: plan_transfer(replicated_map((4,), 1), twice), match="same shard addresses")
    assert fast(lambda: verify_plan(replicated_map((4,), 1), twice, [])).status == "invalid_map"
    elsewhere = ParamAffineMap((4,), {0: (4,), 1: (4,)}, {0: [piece], 1: [piece]})  # declares only {0}
    refused(InvalidMapError, lambda: plan_transfer(replicated_map((4,), 1), elsewhere), match="different locations")


def test_self_overlapping_strided_pieces() -> None:
    # shape (2, 3) with dest strides (1, 1) visits shard addresses 0,1,2,1,2,3: it overlaps itself.
    overlap = ParamAffineMap((2, 3), {0: (2, 3)}, {0: [AffinePiece((2, 3), 0, (3, 1), 0, (1, 1), [0])]})
    refused(UnsupportedLayoutError, lambda: plan_transfer(replicated_map((2, 3), 1), overlap), match="strides")
    assert fast(lambda: verify_plan(replicated_map((2, 3), 1), overlap, [])).status == "invalid_map"


# ---------------------------------------------------------------------------------------------
# Plans the oracle must judge (never crash on).


def _identity() -> tuple[ParamAffineMap, ParamAffineMap, TransferPlan]:
    source = contiguous_split_map((6, 4), [3, 3], 0)
    target = contiguous_split_map((6, 4), [2, 2, 2], 0)
    return target, source, plan_transfer(target, source)


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("source_rank", 7, "no shard"),
    ("target_rank", -1, "no shard"),
    ("source_offset", -1, "outside"),
    ("target_offset", 2**63, "outside"),
    ("source_strides", (-4, 1), "negative strides"),
    ("target_strides", (0, 0), ""),
    ("shape", (0, 4), "not positive"),
    ("shape", (2**62, 4), "outside"),
])
def test_plans_referencing_absent_locations_or_bad_geometry_are_invalid(field: str, value: Any, reason: str) -> None:
    target, source, plan = _identity()
    bad = TransferSegment(**{**plan.segments[0].__dict__, field: value})
    verdict = fast(lambda: small_peak(lambda: verify_plan(target, source, [bad, *plan.segments[1:]])))
    assert verdict.status == "invalid" and reason in verdict.reason


@pytest.mark.parametrize("plan", [None, 3, "plan", {}, {"segments": 3}, [None], [{"shape": [True]}],
                                  {"logical_shape": [6, 4], "segments": [{"shape": [1, 1], "source": [0, 0, [4, 1]],
                                                                         "target": [0, 0, [4, "x"]]}]}])
def test_malformed_plans_are_invalid_not_exceptions(plan: Any) -> None:
    target, source, _ = _identity()
    verdict = fast(lambda: verify_plan(target, source, plan))
    assert verdict.status == "invalid" and verdict.reason.startswith("malformed plan")


# ---------------------------------------------------------------------------------------------
# Replica policies that answer hostile things.


def _tpdp() -> tuple[ParamAffineMap, ParamAffineMap]:
    return contiguous_split_map((64, 8), [2, 2, 2, 2], 1), replicate(contiguous_split_map((64, 8), [32, 32], 0), 2)


def _plan_with(policy: Callable[[Sequence[ReplicaRequest]], Any], **kw: Any) -> TransferPlan:
    target, source = _tpdp()
    return plan_transfer(target, source, replica_policy=policy, **kw)


def test_generator_answers_are_refused() -> None:
    refused(InvalidReplicaPolicyError, lambda: _plan_with(lambda rs: (r.candidates[0].source_rank for r in rs)),
            match="generator")


@pytest.mark.parametrize("exc", [ValueError("v"), KeyError("k"), RecursionError("r"), ZeroDivisionError()])
def test_policies_that_raise(exc: Exception) -> None:
    def policy(_requests: Sequence[ReplicaRequest]) -> Any:
        raise exc

    refused(InvalidReplicaPolicyError, lambda: _plan_with(policy), match="raised")


def test_a_policy_raising_a_refplan_error_is_wrapped_as_the_policy_s() -> None:
    """Issue 14: a refplan class raised by a policy must not read as the layout's or map's error."""
    raised = UnsupportedLayoutError("the policy's own refusal")

    def policy(_requests: Sequence[ReplicaRequest]) -> Any:
        raise raised

    error = refused(PolicyRaisedError, lambda: _plan_with(policy), match="own refusal")
    assert not isinstance(error, UnsupportedLayoutError) and error.__cause__ is raised


def test_policies_that_try_to_mutate_the_requests_are_refused() -> None:
    def policy(requests: Sequence[ReplicaRequest]) -> Any:
        requests[0].shape = (1, 1)  # type: ignore[misc]
        return [0] * len(requests)

    def replace_candidates(requests: Sequence[ReplicaRequest]) -> Any:
        requests[0].candidates[0].source_offset = 0  # type: ignore[misc]
        return [0] * len(requests)

    refused(InvalidReplicaPolicyError, lambda: _plan_with(policy), match="FrozenInstanceError")
    refused(InvalidReplicaPolicyError, lambda: _plan_with(replace_candidates),
            match="FrozenInstanceError|can.t set attribute")
    refused(InvalidReplicaPolicyError, lambda: _plan_with(lambda rs: rs.append(0)))  # a tuple: AttributeError


def test_a_policy_bypassing_frozen_cannot_make_the_plan_wrong() -> None:
    def sneaky(requests: Sequence[ReplicaRequest]) -> Any:
        object.__setattr__(requests[0], "shape", (1, 1))
        return [r.candidates[0].source_rank for r in requests]

    target, source = _tpdp()
    try:
        plan = plan_transfer(target, source, replica_policy=sneaky)
    except InvalidReplicaPolicyError:
        return
    assert verify_plan(target, source, plan).ok


class _Watched(list):  # type: ignore[type-arg]
    """A list that records whether anything iterated or indexed it."""

    touched = False

    def __iter__(self) -> Any:
        _Watched.touched = True
        return super().__iter__()

    def __getitem__(self, index: Any) -> Any:
        _Watched.touched = True
        return super().__getitem__(index)


def test_enormous_part_lists_are_refused_before_iterating() -> None:
    def policy(requests: Sequence[ReplicaRequest]) -> Any:
        return [_Watched([ReplicaPart(r.logical_origin, r.shape, 0)] * 1_000_000) for r in requests]

    _Watched.touched = False
    refused(InvalidReplicaPolicyError, lambda: _plan_with(policy), match="max_parts_per_request")
    assert not _Watched.touched


def test_lazy_sequences_that_claim_to_be_huge_are_refused() -> None:
    class Huge(Sequence[Any]):
        def __len__(self) -> int:
            return 10**12

        def __getitem__(self, index: Any) -> Any:
            raise AssertionError("must not be indexed")

    refused(InvalidReplicaPolicyError, lambda: _plan_with(lambda rs: Huge()), match="answers for")
    refused(InvalidReplicaPolicyError, lambda: _plan_with(lambda rs: [Huge() for _ in rs]), match="neither")


@pytest.mark.parametrize("answer", [True, 1.0, "0", None, b"0", (0,), -1, 2**63, 99])
def test_answers_that_are_not_holders(answer: Any) -> None:
    refused(InvalidReplicaPolicyError, lambda: _plan_with(lambda rs: [answer] * len(rs)))


def test_parts_with_bool_or_float_fields_are_refused() -> None:
    refused(InvalidReplicaPolicyError, lambda: _plan_with(
        lambda rs: [[ReplicaPart(r.logical_origin, r.shape, True)] for r in rs]), match="not an int")
    refused(InvalidReplicaPolicyError, lambda: _plan_with(
        lambda rs: [[ReplicaPart(tuple(float(v) for v in r.logical_origin), r.shape, 0)] for r in rs]))


def test_simulator_tolerates_huge_strides_on_size_1_axes() -> None:
    from refplan.simulate import simulate_transfer

    target = ParamAffineMap((1, 3), {0: (1, 3)}, {0: [AffinePiece((1, 3), 0, (2**62, 1), 0, (3, 1), [0])]})
    source = replicated_map((1, 3), 1)
    plan = plan_transfer(target, source)
    assert verify_plan(target, source, plan).ok
    assert simulate_transfer(target, source, plan).exact


def test_wrong_rank_piece_at_an_empty_shard_is_refused() -> None:
    target = ParamAffineMap(
        (2, 4), {0: (2, 4), 1: (0, 4)},
        {0: [AffinePiece((2, 4), 0, (4, 1), 0, (4, 1), [0])], 1: [AffinePiece((4,), 0, (1,), 0, (1,), [1])]},
    )
    refused(InvalidMapError, lambda: plan_transfer(target, replicated_map((2, 4), 1)))


def test_planner_and_oracle_agree_on_pieces_of_empty_shards() -> None:
    target = ParamAffineMap(
        (0, 4), {0: (0, 4), 1: (0, 4)},
        {0: [AffinePiece((0, 4), 0, (4, 1), 0, (4, 1), [0])], 1: [AffinePiece((0, 0, 4), 0, (4, 1), 0, (4, 1), [1])]},
    )
    source = replicated_map((0, 4), 1)
    # A piece with the wrong number of axes is wrong even where it holds no element: the planner
    # refuses the map, and the oracle, judging any plan for it, calls it an invalid map too.
    planner_error = refused(InvalidMapError, lambda: plan_transfer(target, source), match="number of axes")
    verdict = verify_plan(target, source, [])
    assert verdict.status == "invalid_map", str(verdict)
    assert "location 1, piece 0" in str(planner_error) and "location 1, piece 0" in str(verdict)
    # Without that piece both accept: the empty plan is the exact plan of an empty parameter.
    fixed = ParamAffineMap((0, 4), {0: (0, 4), 1: (0, 4)},
                           {0: [AffinePiece((0, 4), 0, (4, 1), 0, (4, 1), [0])], 1: []})
    plan = plan_transfer(fixed, source)
    assert plan.segments == ()
    assert verify_plan(fixed, source, plan).status == "ok"


class _LyingLength(list):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise TypeError("len refused")


class _RaisingItems(Sequence[Any]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        raise ValueError("item refused")


@pytest.mark.parametrize("kind", ["len", "getitem"])
def test_answer_sequences_that_raise_are_policy_errors(kind: str) -> None:
    def policy(requests: Sequence[ReplicaRequest]) -> Any:
        return _LyingLength([0] * len(requests)) if kind == "len" else _RaisingItems(len(requests))

    refused(InvalidReplicaPolicyError, lambda: _plan_with(policy))


# ---------------------------------------------------------------------------------------------
# Budgets of 0 and of 2**63.

FIELDS = ("max_ndim", "max_pieces_per_map", "max_pair_checks", "max_segments", "max_merge_passes",
          "max_plan_bytes", "max_merge_checks", "max_parts_per_request")


@pytest.mark.parametrize(("field", "cls"), [
    ("max_ndim", UnsupportedLayoutError),
    ("max_pieces_per_map", AffineTransferError),
    ("max_pair_checks", AffineTransferError),
    ("max_segments", AffineTransferError),
    ("max_plan_bytes", AffineTransferError),
    ("max_merge_checks", AffineTransferError),
])
def test_zero_budgets_refuse_cleanly(field: str, cls: type[Exception]) -> None:
    err = refused(cls, lambda: _plan_with(None, limits=PlanBudget(**{field: 0})), match=field)
    assert type(err) is cls


def test_zero_parts_and_merge_passes() -> None:
    target, source = _tpdp()
    plan = fast(lambda: plan_transfer(target, source, PlanBudget(max_merge_passes=0)))  # no coalescing
    assert verify_plan(target, source, plan).ok

    def split(requests: Sequence[ReplicaRequest]) -> Any:
        return [[ReplicaPart(r.logical_origin, r.shape, r.candidates[0].source_rank)] for r in requests]

    refused(InvalidReplicaPolicyError, lambda: _plan_with(split, limits=PlanBudget(max_parts_per_request=0)),
            match="max_parts_per_request")


def test_budgets_of_2_63_work() -> None:
    target, source = _tpdp()
    huge = fast(lambda: plan_transfer(target, source, PlanBudget(**dict.fromkeys(FIELDS, 2**63))))
    assert huge.to_dict() == plan_transfer(target, source).to_dict()


@pytest.mark.parametrize("value", [None, -1, 1.5, "8", True])
def test_budget_fields_must_be_non_negative_ints(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        PlanBudget(max_segments=value)


# ---------------------------------------------------------------------------------------------
# The CLI: exit code 2 and exactly one line on stderr, never a traceback.


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fast(lambda: cli_main(argv))
    assert "Traceback" not in err.getvalue() + out.getvalue()
    return code, out.getvalue(), err.getvalue()


def _good_maps() -> str:
    return maps_text({"w": (contiguous_split_map((8, 8), [4, 4], 1), contiguous_split_map((8, 8), [8], 0))})


@pytest.mark.parametrize("content", [
    "",
    "null",
    '{"format": "refplan.maps/1", "parameters": ' + "[" * 50_000 + "]" * 50_000 + "}",
    '{"format": "refplan.maps/1", "parameters": {"w": {"target": {"logical_shape": [' + "9" * 5000 + "]}}}}",
    '{"format": "refplan.maps/1", "format": "refplan.maps/1", "parameters": {}}',
    '{"format": "refplan.maps/1", "parameters": {"w": {"target": {"logical_shape": [NaN], "ranks": {}}}}}',
    "\ufeff{}",
    "BYTES",
])
def test_cli_plan_on_hostile_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "maps.json"
    if content == "BYTES":
        path.write_bytes(b'{"format": "\xff\xfe"}')
    else:
        path.write_text(content, encoding="utf-8")
    code, out, err = _cli(["plan", str(path)])
    assert code == 2 and not out
    assert len(err.splitlines()) == 1 and err.startswith("refplan plan: ")


def test_cli_errors_stay_one_line_when_names_hold_newlines(tmp_path: Path) -> None:
    doc = json.loads(_good_maps())
    doc["parameters"]["bad\nname\r\u2028x"] = {"target": {"logical_shape": [True], "ranks": {}}, "source": {}}
    path = tmp_path / "maps.json"
    path.write_text(json.dumps(doc))
    code, _, err = _cli(["plan", str(path)])
    assert code == 2 and len(err.splitlines()) == 1


def test_cli_verify_bare_plan_error_is_one_line(tmp_path: Path) -> None:
    maps = tmp_path / "maps.json"
    single = replicated_map((4,), 1).to_dict()
    maps.write_text(json.dumps({"format": MAPS_FORMAT, "parameters": {"a\nb": {"target": single, "source": single}}}))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"logical_shape": [4], "segments": [{"shape": [4], "source": [0, 0, [1]],
                                                                     "target": [0, 0, "x"]}]}))
    code, _, err = _cli(["verify", str(maps), str(plan)])
    assert code == 2 and len(err.splitlines()) == 1


def test_cli_unwritable_output_and_unreadable_inputs(tmp_path: Path) -> None:
    maps = tmp_path / "maps.json"
    maps.write_text(_good_maps())
    code, _, err = _cli(["plan", str(maps), "-o", str(tmp_path / "missing" / "out.json")])  # was a traceback
    assert code == 2 and len(err.splitlines()) == 1 and "cannot write" in err and "No such file or directory" in err
    code, _, err = _cli(["plan", str(maps), "-o", str(tmp_path)])  # a directory
    assert code == 2 and len(err.splitlines()) == 1
    for path in (tmp_path / "absent.json", tmp_path):
        code, _, err = _cli(["plan", str(path)])
        assert code == 2 and len(err.splitlines()) == 1 and "cannot read" in err


def test_cli_endpoints_file_with_colliding_locations(tmp_path: Path) -> None:
    maps = tmp_path / "maps.json"
    maps.write_text(_good_maps())
    ends = tmp_path / "ends.json"
    ends.write_text('{"source": {"0": 0, "00": 1}, "target": {"0": 0, "1": 1}}')
    code, _, err = _cli(["plan", str(maps), "--endpoints", str(ends)])
    assert code == 2 and "listed twice" in err and len(err.splitlines()) == 1


def test_cli_verify_plan_naming_absent_locations_exits_1(tmp_path: Path) -> None:
    maps = tmp_path / "maps.json"
    maps.write_text(_good_maps())
    batch = parse_maps(json.loads(_good_maps()))
    plan = plan_transfers(batch.pairs)["w"].to_dict()
    plan["segments"][0]["source"][0] = 99
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"format": "refplan.plans/1", "parameters": {"w": plan}}))
    code, out, err = _cli(["verify", str(maps), str(plans)])
    assert code == 1 and "invalid" in out and not err


# ---------------------------------------------------------------------------------------------
# Regressions: inputs that crashed a fuzz harness (fuzz/README.md, "Findings").

_ONE = (
    b'{"format": "refplan.maps/1", "parameters": {"w": {"target": T, "source": T}}}'.replace(
        b"T", b'{"logical_shape": [4], "ranks": {"KEY": {"shard_shape": [4], "pieces": [{"shape": [4], '
        b'"source": [0, [1]], "dest": [0, [1]], "locations": [0]SCALE}]}}}'
    )
)


def _one(key: bytes = b"0", scale: bytes = b"", shape: bytes = b"4") -> bytes:
    return _ONE.replace(b"KEY", key).replace(b"SCALE", scale).replace(b"[4]", b"[" + shape + b"]", 1)


def _saved(harness: str) -> list[tuple[str, bytes]]:
    folder = ROOT / "fuzz" / "corpus" / harness
    return [(harness, p.read_bytes()) for p in sorted(folder.glob("regression-*"))]


REGRESSIONS: list[tuple[str, bytes]] = [
    # fuzz/corpus/<harness>/regression-*: inputs a fuzz run found (see fuzz/README.md, Findings)
    *(case for harness in ("maps_loader", "plans_loader", "planner", "verify", "cli") for case in _saved(harness)),
    # inputs found by hand before the harnesses existed
    ("maps_loader", _one(key=b"--1")),  # bare ValueError from int('--1')
    ("maps_loader", _one(key="\u00b2".encode())),  # bare ValueError: '²'.isdigit() but int() refuses it
    ("maps_loader", _one(key=b"1" * 5000)),  # bare ValueError: int() digit limit
    ("maps_loader", _one(shape=b"9" * 5000)),  # bare ValueError from json: integer literal digit limit
    ("maps_loader", _one(scale=b', "scale": 1' + b"0" * 400)),  # OverflowError: int too large for float
    ("planner", _one(key=b"--1") + b"\0\x02"),
    ("cli", b"\x00" + _one(shape=b"9" * 5000) + b"\0"),  # a traceback from `refplan plan`
    ("cli", b"\x03" + _one() + b"\0" + _one(shape=b"9" * 5000)),  # ... and from `refplan verify`
]
"""Inputs that crashed a harness before the fix named in the comment (replayed, must be clean)."""


@pytest.mark.parametrize(("harness", "data"), REGRESSIONS)
def test_fuzz_regressions(harness: str, data: bytes) -> None:
    from fuzz.harnesses import HARNESSES

    fast(lambda: HARNESSES[harness].one_input(data), seconds=2 * SECOND)

