"""The JSON Schemas in ``spec/schemas`` hold for every JSON file shipped and every map written.

- every schema is a valid Draft 2020-12 schema;
- every JSON file under ``spec/``, ``refplan/`` and ``tests/data`` validates against the schema its
  ``"format"`` names (``refplan.maps/1``, ``refplan.plans/1``, ``refplan.conformance/1``,
  ``refplan.conformance-input/1``); a file with no known format fails, so nothing ships
  unvalidated;
- the builders of ``refplan.maps`` write maps (``to_dict``, after a JSON round trip), maps files
  (``files.dump_maps``) and, through the planner, plans files (``files.dump_plans``) that validate;
- the schemas are not vacuous: typical malformed documents are rejected.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import shard_box_origin

from refplan.files import MapsBatch, dump_maps, dump_plans, parse_maps
from refplan.maps import (
    ParamAffineMap,
    block_gather_map,
    contiguous_split_map,
    replicate,
    replicated_map,
    segmented_map,
    sub_param_map,
)
from refplan.requests import TransferEndpoints

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "spec" / "schemas"
PACKAGED_SCHEMAS = ROOT / "refplan" / "schemas"  # installed copies of SCHEMAS (tests/test_packaging.py)
SHIPPED_DIRS = (ROOT / "spec", ROOT / "refplan", ROOT / "tests" / "data")

FORMATS = {
    "refplan.maps/1": ("urn:refplan:schema:maps", "mapsFile"),
    "refplan.plans/1": ("urn:refplan:schema:plans", "plansFile"),
    "refplan.conformance/1": ("urn:refplan:schema:conformance-case", "caseFile"),
    "refplan.conformance-input/1": ("urn:refplan:schema:conformance-case", "input"),
}


def _schemas() -> dict[str, Any]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(SCHEMAS.glob("*.schema.json"))}


def _registry() -> Any:
    return referencing.Registry().with_resources(
        [(s["$id"], referencing.Resource.from_contents(s)) for s in _schemas().values()]
    )


def validator(schema_id: str, definition: str | None = None) -> Any:
    ref = schema_id if definition is None else f"{schema_id}#/$defs/{definition}"
    return jsonschema.Draft202012Validator({"$ref": ref}, registry=_registry())


def errors(doc: Any, schema_id: str, definition: str | None = None) -> list[str]:
    return [
        f"{e.json_path}: {e.message[:300]}"
        for e in sorted(validator(schema_id, definition).iter_errors(doc), key=lambda e: e.json_path)
    ]


def test_schemas_are_valid_draft_2020_12() -> None:
    schemas = _schemas()
    assert set(schemas) == {"maps.schema.json", "plans.schema.json", "conformance-case.schema.json"}
    for name, schema in schemas.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"].startswith("urn:refplan:schema:"), name


def _shipped() -> list[Path]:
    found: list[Path] = []
    for base in SHIPPED_DIRS:
        if base.is_dir():
            found += [p for p in sorted(base.rglob("*.json")) if p.parent not in (SCHEMAS, PACKAGED_SCHEMAS)]
    return found


def test_some_json_files_are_shipped() -> None:
    names = {p.name for p in _shipped()}
    assert {"maps.json", "plans.json", "cases.json"} <= names, names


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_json_file_validates(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    fmt = doc.get("format") if isinstance(doc, dict) else None
    assert fmt in FORMATS, f"{path}: no known \"format\" (one of {sorted(FORMATS)}), so no schema applies"
    assert not errors(doc, *FORMATS[fmt]), errors(doc, *FORMATS[fmt])[:10]


# ---------------------------------------------------------------------------------------------
# What refplan writes.


BUILDERS: dict[str, Callable[[], ParamAffineMap]] = {
    "replicated": lambda: replicated_map((5, 6), 3),
    "replicated_scaled": lambda: replicated_map((4, 4), 2, scale=0.5),
    "row_split": lambda: contiguous_split_map((11, 8), [6, 5], 0),
    "column_split": lambda: contiguous_split_map((8, 24), [8, 8, 8], 1),
    "sub_params": lambda: sub_param_map((12, 8), (8, 4), [[4, 4], [2, 2]], 0),
    "sub_params_zero_width": lambda: sub_param_map((12, 8), (8, 4), [[8, 0], [2, 2]], 0),
    "bigcode": lambda: segmented_map((48, 8), [(32, False), (16, True)], 0, 4, [[8, 8, 8, 8]]),
    "yuan_gather": lambda: block_gather_map((8, 64), {0: [0, 2, 4, 6], 1: [1, 3, 5, 7]}, 8, 1),
    "tp_dp": lambda: replicate(contiguous_split_map((8, 6), [4, 4], 0), 2),
    "scalar": lambda: replicated_map((), 2),
    "3d": lambda: contiguous_split_map((4, 3, 5), [2, 2], 0),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builder_maps_validate_after_a_json_round_trip(name: str) -> None:
    built = BUILDERS[name]()
    doc = json.loads(json.dumps(built.to_dict()))
    assert not errors(doc, "urn:refplan:schema:maps", "map"), errors(doc, "urn:refplan:schema:maps", "map")
    assert not errors(doc, "urn:refplan:schema:maps")
    assert ParamAffineMap.from_dict(doc) == built


def test_maps_and_plans_files_written_by_refplan_validate() -> None:
    pairs = {
        "w": (contiguous_split_map((8, 6), [2, 2, 2], 1), replicate(contiguous_split_map((8, 6), [4, 4], 0), 2)),
        "b": (segmented_map((48, 8), [(32, False), (16, True)], 0, 4, [[8, 8, 8, 8]]),
              segmented_map((48, 8), [(32, False), (16, True)], 0, 2, [[16, 16]])),
    }
    batch = MapsBatch(
        pairs, TransferEndpoints({0: 0, 1: 1, 2: 0, 3: 1}, {0: 0, 1: 1, 2: 2, 3: 3}), {0: 0, 1: 0, 2: 1, 3: 1},
        {"w": 4, "b": 2},
    )
    doc = json.loads(json.dumps(dump_maps(batch)))
    assert not errors(doc, *FORMATS["refplan.maps/1"]), errors(doc, *FORMATS["refplan.maps/1"])
    assert parse_maps(doc).pairs.keys() == pairs.keys()

    planner = pytest.importorskip("refplan.planner")
    plans = planner.plan_transfers(pairs, endpoints=batch.endpoints, element_size=batch.element_size)
    doc = json.loads(json.dumps(dump_plans(plans)))
    assert not errors(doc, *FORMATS["refplan.plans/1"]), errors(doc, *FORMATS["refplan.plans/1"])
    for plan in plans.values():
        single = json.loads(json.dumps(plan.to_dict()))
        assert not errors(single, "urn:refplan:schema:plans", "plan")


def test_conformance_inputs_validate() -> None:
    corpus = pytest.importorskip("refplan.conformance.corpus")
    cases = corpus.load_cases()
    assert cases
    for case in cases:
        doc = json.loads(json.dumps(case.input_doc()))
        assert not errors(doc, *FORMATS["refplan.conformance-input/1"]), (case.id, errors(doc, *FORMATS[doc["format"]]))


# ---------------------------------------------------------------------------------------------
# The schemas reject what they should.


def _map() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(contiguous_split_map((4, 4), [2, 2], 0).to_dict()))
    return doc


def _mutated(mutate: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    doc = copy.deepcopy(_map())
    mutate(doc)
    return doc


BAD_MAPS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "missing ranks": lambda d: d.pop("ranks"),
    "extra top-level key": lambda d: d.update(version=1),
    "non-integer location key": lambda d: d["ranks"].update(x=d["ranks"]["0"]),
    "piece without dest": lambda d: d["ranks"]["0"]["pieces"][0].pop("dest"),
    "dest is not [offset, strides]": lambda d: d["ranks"]["0"]["pieces"][0].update(dest=[0]),
    "fractional extent": lambda d: d["ranks"]["0"]["pieces"][0].update(shape=[2.5, 4]),
    "boolean offset": lambda d: d["ranks"]["0"]["pieces"][0].update(source=[True, [4, 1]]),
    "repeated location": lambda d: d["ranks"]["0"]["pieces"][0].update(locations=[0, 0]),
    "scale as a string": lambda d: d["ranks"]["0"]["pieces"][0].update(scale="0.5"),
    "location without pieces": lambda d: d["ranks"]["0"].pop("pieces"),
}


@pytest.mark.parametrize("what", sorted(BAD_MAPS))
def test_malformed_maps_are_rejected(what: str) -> None:
    assert errors(_mutated(BAD_MAPS[what]), "urn:refplan:schema:maps", "map"), what


def test_malformed_files_plans_and_cases_are_rejected() -> None:
    maps_file = {"format": "refplan.maps/1", "parameters": {"w": {"target": _map(), "source": _map()}}}
    assert not errors(maps_file, *FORMATS["refplan.maps/1"])
    for bad in (
        {**maps_file, "format": "refplan.maps/2"},
        {**maps_file, "element_size": {"w": 0}},
        {**maps_file, "endpoints": {"source": {"0": 0}}},
        {"format": "refplan.maps/1", "parameters": {"w": {"target": _map()}}},
    ):
        assert errors(bad, *FORMATS["refplan.maps/1"]), bad

    segment = {"shape": [2, 4], "source": [0, 0, [4, 1]], "target": [1, 8, [4, 1]]}
    plans_file = {"format": "refplan.plans/1", "parameters": {"w": {"logical_shape": [4, 4], "segments": [segment]}}}
    assert not errors(plans_file, *FORMATS["refplan.plans/1"])
    for seg in ({**segment, "source": [0, [4, 1]]}, {**segment, "logical_origin": [0, 0]}, {"shape": [2, 4]}):
        bad = {"format": "refplan.plans/1", "parameters": {"w": {"logical_shape": [4, 4], "segments": [seg]}}}
        assert errors(bad, *FORMATS["refplan.plans/1"]), seg

    case = {
        "id": "demo/ok", "why": "one line", "tags": [], "parameters": maps_file["parameters"],
        "expect": {"outcome": "refuse", "error": "InvalidMapError", "message": "same shard addresses"},
    }
    case_file = {"format": "refplan.conformance/1", "family": "demo", "description": "", "cases": [case]}
    assert not errors(case_file, *FORMATS["refplan.conformance/1"])
    for bad_case in (
        {**case, "why": "two\nlines"},
        {**case, "expect": {"outcome": "refuse"}},
        {**case, "expect": {"outcome": "refuse", "error": "ValueError"}},
        {**case, "expect": {"outcome": "maybe"}},
        {**case, "expect": {"outcome": "accept", "error": "InvalidMapError"}},
        {**case, "answers": [0]},  # answers need the requests they index into
        {**case, "budget": {"max_widgets": 3}},
        {**case, "expect": {"outcome": "accept"}, "requests": [], "answers": [True]},  # accepted: well formed
        {**case, "parameters": {}},
    ):
        bad = {**case_file, "cases": [bad_case]}
        assert errors(bad, *FORMATS["refplan.conformance/1"]), bad_case
    hostile = {**case, "requests": [{"parameter": "w", "target_location": 0, "logical_origin": [0, 0],
                                      "shape": [2, 4], "candidates": [0]}], "answers": [True]}
    assert not errors({**case_file, "cases": [hostile]}, *FORMATS["refplan.conformance/1"])


# ---------------------------------------------------------------------------------------------
# The example cases in spec/examples say what the planner really does.


def _answers(raw: Any) -> Any:
    from refplan.requests import ReplicaPart

    return [a if not isinstance(a, list) else [ReplicaPart(tuple(p["logical_origin"]), tuple(p["shape"]),
                                                           p["source_location"]) for p in a] for a in raw]


@pytest.mark.parametrize("index", range(4))
def test_example_cases_have_the_outcome_they_claim(index: int) -> None:
    planner = pytest.importorskip("refplan.planner")
    verify = pytest.importorskip("refplan.verify")
    import refplan.errors

    doc = json.loads((ROOT / "spec" / "examples" / "cases.json").read_text(encoding="utf-8"))
    case = doc["cases"][index]
    pairs = {name: (ParamAffineMap.from_dict(p["target"]), ParamAffineMap.from_dict(p["source"]))
             for name, p in case["parameters"].items()}
    kwargs: dict[str, Any] = {}
    if "min_split_bytes" in case:
        kwargs["min_split_bytes"] = case["min_split_bytes"]
    if "answers" in case:
        scripted = _answers(case["answers"])

        def policy(requests: Any) -> Any:
            got = [{"parameter": r.parameter, "target_location": r.target_location,
                    "logical_origin": list(r.logical_origin), "shape": list(r.shape),
                    "candidates": list(r.locations)} for r in requests]
            assert got == case["requests"]
            return scripted

        kwargs["replica_policy"] = policy
    expect = case["expect"]
    if expect["outcome"] == "refuse":
        with pytest.raises(getattr(refplan.errors, expect["error"]), match=f"(?i){expect['message']}"):
            planner.plan_transfers(pairs, **kwargs)
        return
    plans = planner.plan_transfers(pairs, **kwargs)
    for name, plan in plans.items():
        assert verify.verify_plan(*pairs[name], plan).ok
    pinned = expect.get("sources", [])
    for name in sorted({source["parameter"] for source in pinned}):
        # Exact: the pins of a parameter name a source location for every element it moves, and
        # the plan reads each element from exactly the location its pin names.
        served = _served_by(plans[name], pairs[name][0])
        want: dict[tuple[int, tuple[int, ...]], int] = {}
        for source in (s for s in pinned if s["parameter"] == name):
            box = (tuple(source["logical_origin"]), tuple(source["shape"]))
            for point in itertools.product(*(range(o, o + e) for o, e in zip(*box))):
                want[(source["target_location"], point)] = source["source_location"]
        assert served == want


def _served_by(plan: Any, target: ParamAffineMap) -> dict[tuple[int, tuple[int, ...]], int]:
    """(target location, logical point) → the source location the plan reads it from.

    Found from the plan's target side and the target map alone: a segment's first target address
    decodes to a shard coordinate, the target piece whose local box holds it gives the logical
    point there, and the segment's elements follow row-major from it.
    """
    out: dict[tuple[int, tuple[int, ...]], int] = {}
    for seg in plan.segments:
        shard = target.shard_shapes[seg.target_rank]
        start = shard_box_origin(seg.target_offset, seg.shape, shard)
        assert start is not None, seg
        for p in target.pieces_by_rank[seg.target_rank]:
            local = shard_box_origin(p.dest_offset, p.shape, shard)
            logical = shard_box_origin(p.source_offset, p.shape, target.logical_shape)
            assert local is not None and logical is not None, p
            if all(lo <= c < lo + e for lo, c, e in zip(local, start, p.shape)):
                first = tuple(g + c - lo for g, c, lo in zip(logical, start, local))
                break
        else:
            raise AssertionError(f"segment {seg} writes outside every target piece")
        for index in itertools.product(*(range(e) for e in seg.shape)):
            key = (seg.target_rank, tuple(f + j for f, j in zip(first, index)))
            assert key not in out, f"{key} written twice"
            out[key] = seg.source_rank
    return out
