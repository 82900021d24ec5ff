"""Every constraint of the file schemas, walked against the readers (issue 25, item 6).

``spec/schemas`` promises that a document it accepts loads, and the readers promise to be as strict
as the schemas. Hand-picked bad documents left gaps (the schema's ``uniqueItems`` on a piece's
``locations`` was not enforced by ``from_dict``). Here the shipped examples are walked together with
their schema: at every place of a document, each constraint of the sub-schema that governs it is
broken in isolation (a float or a bool where an integer is required, a duplicate where items must
be unique, a required key removed, an unknown key added, one item too few or too many, a key that
is not a location number, another format tag), and both the schema and the reader must refuse it.
A second test holds the walk to the schemas: every constraint they state must have been broken at
least once, so a constraint added to a schema without a reader check fails here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from refplan.errors import InvalidMapError
from refplan.files import parse_maps, parse_plans

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = {p.name.split(".")[0]: json.loads(p.read_text(encoding="utf-8"))
           for p in sorted((ROOT / "spec" / "schemas").glob("*.schema.json"))}
REGISTRY = referencing.Registry().with_resources(
    [(s["$id"], referencing.Resource.from_contents(s)) for s in SCHEMAS.values()]
)

# The keywords that constrain an instance (``properties``, ``$ref`` and ``$defs`` only route).
CONSTRAINTS = {"type", "required", "additionalProperties", "uniqueItems", "minimum", "maximum", "minItems", "items",
               "prefixItems", "pattern", "const", "oneOf", "propertyNames"}


def _documents() -> list[tuple[str, str, Any, Callable[[Any], Any]]]:
    """(schema, top definition, document, reader): the shipped examples, and the maps example with
    its other ``element_size`` form, so both branches of that ``oneOf`` are walked."""
    maps = json.loads((ROOT / "spec" / "examples" / "maps.json").read_text(encoding="utf-8"))
    plans = json.loads((ROOT / "spec" / "examples" / "plans.json").read_text(encoding="utf-8"))
    scalar = {**copy.deepcopy(maps), "element_size": 2}
    # A piece with a scale, so the ``scale`` property is walked too (a valid file may carry one).
    scaled = copy.deepcopy(maps)
    first = sorted(scaled["parameters"])[0]
    next(iter(scaled["parameters"][first]["source"]["ranks"].values()))["pieces"][0]["scale"] = 1.0
    return [("maps", "mapsFile", maps, parse_maps), ("maps", "mapsFile", scalar, parse_maps),
            ("maps", "mapsFile", scaled, parse_maps), ("plans", "plansFile", plans, parse_plans)]


def _resolve(schema: dict[str, Any], node: dict[str, Any], pointer: str) -> tuple[dict[str, Any], str]:
    while "$ref" in node:
        pointer = node["$ref"]
        node = schema
        for part in pointer.removeprefix("#/").split("/"):
            node = node[part]
    return node, pointer


def _is(value: Any, kind: str) -> bool:
    return {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str), "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict), "null": lambda v: v is None,
    }[kind](value)


Path_ = tuple[Any, ...]  # keys and indices from the document's root


def _walk(schema: dict[str, Any], node: dict[str, Any], pointer: str, value: Any,
          at: Path_) -> Iterator[tuple[str, dict[str, Any], Any, Path_]]:
    """(schema pointer, sub-schema, instance value, path) for every place of the document."""
    node, pointer = _resolve(schema, node, pointer)
    yield pointer, node, value, at
    if "oneOf" in node:
        for i, branch in enumerate(node["oneOf"]):
            sub, sub_pointer = _resolve(schema, branch, f"{pointer}/oneOf/{i}")
            if "type" in sub and _is(value, sub["type"]):
                yield from _walk(schema, sub, sub_pointer, value, at)
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                yield from _walk(schema, props[key], f"{pointer}/properties/{key}", item, (*at, key))
            elif isinstance(extra, dict):
                yield from _walk(schema, extra, f"{pointer}/additionalProperties", item, (*at, key))
        if "propertyNames" in node:
            for key in value:
                yield from _walk(schema, node["propertyNames"], f"{pointer}/propertyNames", key, (*at, ("key", key)))
    if isinstance(value, list):
        prefix = node.get("prefixItems", [])
        for i, item in enumerate(value):
            if i < len(prefix):
                yield from _walk(schema, prefix[i], f"{pointer}/prefixItems/{i}", item, (*at, i))
            elif isinstance(node.get("items"), dict):
                yield from _walk(schema, node["items"], f"{pointer}/items", item, (*at, i))


def _set(doc: Any, at: Path_, new: Any) -> Any:
    """A copy of ``doc`` with the value at ``at`` replaced (a ``("key", k)`` step renames key ``k``)."""
    doc = copy.deepcopy(doc)
    parent = doc
    for step in at[:-1]:
        parent = parent[step]
    last = at[-1]
    if isinstance(last, tuple):
        old = last[1]
        parent[new] = parent.pop(old)
    else:
        parent[last] = new
    return doc


def _breaks(node: dict[str, Any], value: Any) -> Iterator[tuple[str, str, Callable[[Any], Any]]]:
    """(constraint, label, edit of the value) breaking each constraint of ``node`` alone."""
    kind = node.get("type")
    if kind == "integer":
        for bad in (1.5, True, "1", None):
            yield "type", repr(bad), lambda v, bad=bad: bad
    elif kind == "number":
        for bad in (True, "1", None):
            yield "type", repr(bad), lambda v, bad=bad: bad
    elif kind == "array":
        yield "type", "object", lambda v: {"0": v}
        yield "type", "null", lambda v: None
    elif kind == "object":
        yield "type", "array", lambda v: [v]
        yield "type", "null", lambda v: None
    elif kind == "string":  # object keys: only their pattern can be broken
        for bad in ("x1", "1.0", "1e3", "", "--1"):
            yield "pattern", repr(bad), lambda v, bad=bad: bad
    if node.get("uniqueItems") and isinstance(value, list) and value:
        yield "uniqueItems", "repeat", lambda v: [*v, v[0]]
    if "minimum" in node and _is(value, "integer"):
        yield "minimum", "below", lambda v: node["minimum"] - 1
    if "maximum" in node and _is(value, "integer"):
        yield "maximum", "above", lambda v: node["maximum"] + 1
    if "minItems" in node and isinstance(value, list):
        yield "minItems", "short", lambda v: v[: node["minItems"] - 1]
    if node.get("items") is False and isinstance(value, list):
        yield "items", "long", lambda v: [*v, 0]
    if "const" in node:
        yield "const", "other", lambda v: v.replace("/1", "/2")
    if isinstance(value, dict):
        for key in node.get("required", []):
            yield "required", key, lambda v, key=key: {k: x for k, x in v.items() if k != key}
        if node.get("additionalProperties") is False:
            yield "additionalProperties", "extra", lambda v: {**v, "zz_unknown": 1}


def _cases() -> list[tuple[str, str, Any, Callable[[Any], Any], str, str]]:
    """(id, schema name, broken document, reader, schema pointer, constraint) for every break."""
    out = []
    for name, top, doc, reader in _documents():
        schema = SCHEMAS[name]
        for pointer, node, value, at in _walk(schema, schema["$defs"][top], f"#/$defs/{top}", doc, ()):
            for constraint, label, edit in _breaks(node, value):
                if not at:
                    broken = edit(doc)
                elif isinstance(at[-1], tuple):
                    broken = _set(doc, at, edit(at[-1][1]))
                else:
                    broken = _set(doc, at, edit(value))
                ident = f"{name}:{'/'.join(map(str, at))}:{constraint}={label}"
                out.append((ident, name, broken, reader, pointer, constraint))
    return out


CASES = _cases()
# The same break at every piece of every location would be thousands of cases of one kind: each
# (schema pointer, constraint, edit) is kept at its first place in the documents.
SELECTED = list({(c[1], c[4], c[0].rsplit(":", 1)[1]): c for c in reversed(CASES)}.values())[::-1]


def _validator(name: str) -> Any:
    top = {"maps": "mapsFile", "plans": "plansFile"}[name]
    return jsonschema.Draft202012Validator({"$ref": f"{SCHEMAS[name]['$id']}#/$defs/{top}"}, registry=REGISTRY)


VALIDATORS = {name: _validator(name) for name in ("maps", "plans")}


@pytest.mark.parametrize("case", SELECTED, ids=[c[0] for c in SELECTED])
def test_each_broken_constraint_is_refused_by_schema_and_reader(case: tuple[Any, ...]) -> None:
    ident, name, broken, reader, pointer, constraint = case
    schema_errors = list(VALIDATORS[name].iter_errors(broken))
    assert schema_errors, f"the schema accepts {ident} (the walk's edit does not break {pointer} {constraint})"
    with pytest.raises(InvalidMapError):
        reader(broken)


def _stated(schema: dict[str, Any], node: Any, pointer: str) -> Iterator[tuple[str, str]]:
    """(pointer, keyword) of every constraint a schema states, on value-level sub-schemas."""
    if isinstance(node, dict):
        for key, sub in node.items():
            if key in CONSTRAINTS and not (key in ("items", "additionalProperties", "propertyNames", "oneOf",
                                                   "prefixItems") and not isinstance(sub, bool)):
                yield pointer, key
            if isinstance(sub, (dict, list)) and key != "required":
                yield from _stated(schema, sub, f"{pointer}/{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            yield from _stated(schema, sub, f"{pointer}/{i}")


# Constraints the walk cannot break on the shipped files, each with the reason.
NOT_WALKED = {
    ("maps", "#/$defs/locationKey", "type"): "JSON object keys are strings by construction",
    ("maps", "#/$defs/int", "type"): "a definition no other one uses",
    ("maps", "#/$defs/location/properties/shard_shape/oneOf/1", "type"): "the null branch: a value that is not "
    "null is the other branch's (ints) business, broken there",
}


def test_the_walk_breaks_every_constraint_the_schemas_state() -> None:
    broken = {(c[1], c[4], c[5]) for c in SELECTED}
    for name in ("maps", "plans"):
        schema = SCHEMAS[name]
        for pointer, keyword in _stated(schema, schema, "#"):
            if (name, pointer, keyword) in NOT_WALKED:
                continue
            assert (name, pointer, keyword) in broken, f"{name} {pointer} {keyword} is never broken by the walk"
    assert len(SELECTED) > 100
