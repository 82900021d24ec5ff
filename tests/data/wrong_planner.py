"""A conformance planner that answers wrongly on purpose, one way per MODE (``cmd:`` protocol).

- ``accept-all``: accept everything with empty plans (accepts what must be refused; plans miss data);
- ``wrong-class``: refuse everything refplan refuses, with another error class; accept the rest rightly;
- ``corrupt``: plan with refplan, then read the first segment of each plan one element later;
- ``other-holder``: answer every scripted multi-holder request from a different holder than scripted;
- ``crash``: print nothing and exit 3.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from refplan_planner import plan


def main(mode: str) -> int:
    doc = json.load(sys.stdin)
    if mode == "crash":
        print("wrong_planner: crashing on purpose", file=sys.stderr)
        return 3
    if mode == "accept-all":
        print(json.dumps({name: {"logical_shape": pair["target"]["logical_shape"], "segments": []}
                          for name, pair in doc["parameters"].items()}))
        return 0
    if mode == "other-holder" and doc.get("answers") is not None:
        answers: list[Any] = []
        for request, answer in zip(doc["requests"], doc["answers"]):
            others = [c for c in request["candidates"] if c != answer]
            answers.append(others[0] if isinstance(answer, int) and len(request["candidates"]) > 1 else answer)
        doc["answers"] = answers
    out = plan(doc)
    if mode == "wrong-class" and "error" in out:
        out["error"] = "UnsupportedLayoutError" if out["error"] != "UnsupportedLayoutError" else "InvalidMapError"
    if mode == "corrupt" and "parameters" in out:
        for p in out["parameters"].values():
            if p["segments"]:
                p["segments"][0]["source"][1] += 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
