"""A conformance planner that wraps refplan (``cmd:`` protocol on stdin/stdout, or ``plan(doc)`` in-process).

Used by ``tests/test_conformance.py`` to show that a planner speaking the protocol from outside
the package passes the corpus. It uses only refplan's public API.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from refplan import AffineTransferError, PlanBudget, ReplicaPart, plan_transfers
from refplan.files import dump_plans, parse_maps


def _answer(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    return [
        ReplicaPart(tuple(p["logical_origin"]), tuple(p["shape"]), p["source_location"])
        if isinstance(p, dict) and {"logical_origin", "shape", "source_location"} <= set(p) else p
        for p in value
    ]


def plan(doc: dict[str, Any]) -> dict[str, Any]:
    maps = {"format": "refplan.maps/1", "parameters": doc["parameters"]}
    for key in ("endpoints", "process_node", "element_size"):
        if key in doc:
            maps[key] = doc[key]
    try:
        batch = parse_maps(maps)
        answers = doc.get("answers")
        policy = None if answers is None else (lambda _requests: [_answer(a) for a in answers])
        plans = plan_transfers(
            batch.pairs, PlanBudget(**doc.get("budget", {})), endpoints=batch.endpoints,
            element_size=batch.element_size, replica_policy=policy, min_split_bytes=doc.get("min_split_bytes"),
            process_node=batch.process_node,
        )
    except AffineTransferError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return dump_plans(plans)


if __name__ == "__main__":
    print(json.dumps(plan(json.load(sys.stdin))))
