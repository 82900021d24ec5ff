"""Batch files: many parameters' maps in one JSON document, and their plans.

Maps: ``{"format": "refplan.maps/1", "parameters": {name: {"target": <map>, "source": <map>}},
"endpoints"?: {"source": {loc: proc}, "target": {loc: proc}}, "process_node"?: {proc: node},
"element_size"?: {name: bytes}}``. Plans: ``{"format": "refplan.plans/1", "parameters":
{name: <plan dict>}}``. Map and plan dicts are DeepSpeed's, so either side may come from there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidMapError
from .maps import ParamAffineMap
from .plan import MAPS_FORMAT, PLANS_FORMAT, TransferPlan
from .requests import TransferEndpoints

__all__ = ["MapsBatch", "dump_maps", "dump_plans", "load_json", "parse_maps", "parse_plans"]


@dataclass(frozen=True)
class MapsBatch:
    """A parsed maps file: ``pairs`` is name -> (target map, source map), as ``plan_transfers`` takes."""

    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]]
    endpoints: TransferEndpoints | None = None
    process_node: dict[int, int] | None = None
    element_size: dict[str, int] | None = None


def load_json(path: str | Path) -> Any:
    """Read a JSON file, turning unreadable or malformed input into ``InvalidMapError``."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as exc:
        raise InvalidMapError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidMapError(f"{path}: not valid JSON: {exc}") from None


def _int_table(value: Any, where: str) -> dict[int, int]:
    if not isinstance(value, Mapping):
        raise InvalidMapError(f"{where}: expected an object")
    out: dict[int, int] = {}
    for key, item in value.items():
        try:
            k = int(key)
        except (TypeError, ValueError):
            raise InvalidMapError(f"{where}: key {key!r} is not an integer") from None
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidMapError(f"{where}[{key}]: {item!r} is not an integer")
        out[k] = item
    return out


def parse_maps(doc: Any) -> MapsBatch:
    if not isinstance(doc, Mapping) or doc.get("format") != MAPS_FORMAT:
        raise InvalidMapError(f"maps file: expected an object with \"format\": \"{MAPS_FORMAT}\"")
    params = doc.get("parameters")
    if not isinstance(params, Mapping):
        raise InvalidMapError("maps file: \"parameters\" must be an object of name -> {target, source}")
    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    for name, entry in params.items():
        if not isinstance(entry, Mapping) or not {"target", "source"} <= set(entry):
            raise InvalidMapError(f"maps file: parameter {name!r} needs \"target\" and \"source\" maps")
        pairs[str(name)] = (
            ParamAffineMap.from_dict(entry["target"], f"{name}.target"),
            ParamAffineMap.from_dict(entry["source"], f"{name}.source"),
        )
    endpoints = TransferEndpoints.from_dict(doc["endpoints"]) if doc.get("endpoints") is not None else None
    process_node = _int_table(doc["process_node"], "process_node") if doc.get("process_node") is not None else None
    element_size = None
    if doc.get("element_size") is not None:
        raw = doc["element_size"]
        if not isinstance(raw, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in raw.values()
        ):
            raise InvalidMapError("element_size: expected an object of name -> positive integer bytes")
        element_size = {str(k): int(v) for k, v in raw.items()}
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
    return {str(name): TransferPlan.from_dict(entry, f"plans[{name}]") for name, entry in params.items()}


def dump_plans(plans: Mapping[str, TransferPlan]) -> dict[str, Any]:
    return {"format": PLANS_FORMAT, "parameters": {name: plans[name].to_dict() for name in sorted(plans)}}
