"""Batch files: many parameters' maps in one JSON document, and their plans.

Maps: ``{"format": "refplan.maps/1", "parameters": {name: {"target": <map>, "source": <map>}},
"endpoints"?: {"source": {loc: proc}, "target": {loc: proc}}, "process_node"?: {proc: node},
"element_size"?: {name: bytes}}``. Plans: ``{"format": "refplan.plans/1", "parameters":
{name: <plan dict>}}``. Map and plan dicts are DeepSpeed's, so either side may come from there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidMapError
from .maps import ParamAffineMap, describe
from .plan import MAPS_FORMAT, PLANS_FORMAT, TransferPlan
from .requests import TransferEndpoints

__all__ = [
    "MapsBatch",
    "dump_maps",
    "dump_plans",
    "load_json",
    "loads_json",
    "parse_endpoints",
    "parse_maps",
    "parse_plans",
    "read_maps",
]


@dataclass(frozen=True)
class MapsBatch:
    """A parsed maps file: ``pairs`` is name -> (target map, source map), as ``plan_transfers`` takes."""

    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]]
    endpoints: TransferEndpoints | None = None
    process_node: dict[int, int] | None = None
    element_size: dict[str, int] | None = None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json``: refuse an object that names one key twice.

    Python's ``json`` keeps the last duplicate silently, so a maps file with two entries for one
    parameter or location would be read as only one of them, and two readers could disagree on
    which. RFC 8259 leaves the behaviour open; a planner must not guess.
    """
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def loads_json(text: str | bytes, where: str = "JSON") -> Any:
    """Parse JSON text, turning every way it can be malformed into ``InvalidMapError``.

    Covers syntax errors, invalid UTF-8, nesting deeper than the parser's recursion limit, integers
    with more digits than Python converts (``ValueError``) and duplicate keys in one object.
    ``NaN`` and ``Infinity`` parse (as Python's ``json`` does) and are refused later wherever an
    integer is required.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise InvalidMapError(f"{where}: not valid JSON: key {describe(exc.key)} appears twice in one object") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidMapError(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidMapError(f"{where}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal beyond sys.get_int_max_str_digits()
        raise InvalidMapError(f"{where}: not valid JSON: {describe(str(exc))}") from None


def load_json(path: str | Path) -> Any:
    """Read a JSON file, turning unreadable or malformed input into ``InvalidMapError``."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise InvalidMapError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidMapError(f"{path}: not valid JSON: {exc}") from None
    return loads_json(text, str(path))


_INT_KEY = re.compile(r"-?[0-9]{1,4000}")


def _int_key(key: Any, where: str) -> int:
    """An integer object key: an int, or a decimal string of ASCII digits (surrounding spaces ok)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and _INT_KEY.fullmatch(key.strip()):
        return int(key)
    raise InvalidMapError(f"{where}: key {describe(key)} is not an integer")


def _int_table(value: Any, where: str) -> dict[int, int]:
    if not isinstance(value, Mapping):
        raise InvalidMapError(f"{where}: expected an object")
    out: dict[int, int] = {}
    for key, item in value.items():
        k = _int_key(key, where)
        if k in out:
            raise InvalidMapError(f"{where}: key {k} is listed twice")
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidMapError(f"{where}[{k}]: {describe(item)} is not an integer")
        out[k] = item
    return out


def parse_endpoints(doc: Any) -> TransferEndpoints:
    """``{"source": {loc: proc}, "target": {loc: proc}}``, with integer keys and values.

    Stricter than ``TransferEndpoints.from_dict``: a location listed twice ("0" and "00") is
    refused instead of silently binding the later process, and keys must be ASCII decimal
    integers ("1_0" and non-ASCII digits are refused).
    """
    if not isinstance(doc, Mapping) or set(doc) != {"source", "target"}:
        raise InvalidMapError("endpoints: expected {\"source\": {...}, \"target\": {...}}")
    return TransferEndpoints(
        _int_table(doc["source"], "endpoints.source"), _int_table(doc["target"], "endpoints.target")
    )


def _label(name: str) -> str:
    """``name`` for an error location, quoted only when it holds a line break or other
    unprintable character (so every message stays one line)."""
    return name if name.isprintable() else describe(name)


def _names(value: Mapping[Any, Any], what: str) -> list[tuple[str, Any]]:
    """``(str(name), entry)`` pairs, refusing two keys that name the same parameter."""
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for name, entry in value.items():
        text = str(name)
        if text in seen:
            raise InvalidMapError(f"{what}: parameter {describe(text)} is listed twice")
        seen.add(text)
        out.append((text, entry))
    return out


def parse_maps(doc: Any) -> MapsBatch:
    if not isinstance(doc, Mapping) or doc.get("format") != MAPS_FORMAT:
        raise InvalidMapError(f"maps file: expected an object with \"format\": \"{MAPS_FORMAT}\"")
    params = doc.get("parameters")
    if not isinstance(params, Mapping):
        raise InvalidMapError("maps file: \"parameters\" must be an object of name -> {target, source}")
    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    for name, entry in _names(params, "maps file"):
        if not isinstance(entry, Mapping) or "target" not in entry or "source" not in entry:
            raise InvalidMapError(f"maps file: parameter {describe(name)} needs \"target\" and \"source\" maps")
        pairs[name] = (
            ParamAffineMap.from_dict(entry["target"], f"{_label(name)}.target"),
            ParamAffineMap.from_dict(entry["source"], f"{_label(name)}.source"),
        )
    endpoints = parse_endpoints(doc["endpoints"]) if doc.get("endpoints") is not None else None
    process_node = _int_table(doc["process_node"], "process_node") if doc.get("process_node") is not None else None
    element_size = None
    if doc.get("element_size") is not None:
        raw = doc["element_size"]
        if not isinstance(raw, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in raw.values()
        ):
            raise InvalidMapError("element_size: expected an object of name -> positive integer bytes")
        element_size = {name: int(v) for name, v in _names(raw, "element_size")}
    return MapsBatch(pairs, endpoints, process_node, element_size)


def dump_maps(batch: MapsBatch) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": MAPS_FORMAT,
        "parameters": {
            name: {"target": t.to_dict(), "source": s.to_dict()} for name, (t, s) in sorted(batch.pairs.items())
        },
    }
    if batch.endpoints is not None:
        doc["endpoints"] = batch.endpoints.to_dict()
    if batch.process_node is not None:
        doc["process_node"] = {str(k): v for k, v in sorted(batch.process_node.items())}
    if batch.element_size is not None:
        doc["element_size"] = dict(sorted(batch.element_size.items()))
    return doc


def parse_plans(doc: Any) -> dict[str, TransferPlan]:
    if not isinstance(doc, Mapping) or doc.get("format") != PLANS_FORMAT:
        raise InvalidMapError(f"plans file: expected an object with \"format\": \"{PLANS_FORMAT}\"")
    params = doc.get("parameters")
    if not isinstance(params, Mapping):
        raise InvalidMapError("plans file: \"parameters\" must be an object of name -> plan")
    return {
        name: TransferPlan.from_dict(entry, f"plans[{_label(name)}]") for name, entry in _names(params, "plans file")
    }


def dump_plans(plans: Mapping[str, TransferPlan]) -> dict[str, Any]:
    return {"format": PLANS_FORMAT, "parameters": {name: plans[name].to_dict() for name in sorted(plans)}}


def read_maps(path: str | Path) -> MapsBatch:
    """Load and parse a maps file; every error names the file, then the JSON path and the problem."""
    doc = load_json(path)  # its own errors already name the file
    try:
        return parse_maps(doc)
    except InvalidMapError as exc:
        raise InvalidMapError(f"{path}: {exc}") from None
