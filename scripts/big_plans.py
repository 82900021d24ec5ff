"""Big plans files for measuring ``refplan verify`` (docs/performance.md, "Streaming").

    python scripts/big_plans.py write DIR --parameters 1000 [--grid 40x25]
        writes DIR/maps.json and DIR/plans.json: PARAMETERS parameters, each a row split over R
        source locations -> a column split over C target locations (R x C segments apiece, none
        of which coalesce), in 16 shapes so that the batch is not one layout repeated. The plans
        come from ``plan_transfers`` (one per shape) and are written entry by entry, so the
        writer never holds the batch either.
    python scripts/big_plans.py verify DIR --stream|--no-stream
        ``run_verify_cli(DIR/maps.json, DIR/plans.json, quiet=True, stream=...)``; prints wall
        time and peak RSS (``resource.getrusage``) and exits with its code.
    python scripts/big_plans.py held --segments 100000 [--grid 40x25]
        bytes per segment held while one parameter is judged (``tracemalloc``): the parsed plan,
        and the judgement's own peak on top of it.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

from refplan.formats import MAPS_FORMAT, PLANS_FORMAT
from refplan.maps import ParamAffineMap, contiguous_split_map
from refplan.plan import TransferPlan
from refplan.planner import plan_transfers

SHAPES = 16


def _pair(grid: tuple[int, int], variant: int) -> tuple[ParamAffineMap, ParamAffineMap]:
    """(target, source): rows of the source split over R locations, columns of the target over C."""
    rows, cols = grid
    shape = (rows * (4 + variant % 4), cols * (2 + variant // 4))
    source = contiguous_split_map(shape, [shape[0] // rows] * rows, 0)
    target = contiguous_split_map(shape, [shape[1] // cols] * cols, 1)
    return target, source


def write(folder: Path, parameters: int, grid: tuple[int, int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [_pair(grid, v) for v in range(SHAPES)]
    plans = [plan_transfers({"w": pair})["w"] for pair in pairs]
    map_text = [json.dumps({"target": t.to_dict(), "source": s.to_dict()}) for t, s in pairs]
    plan_text = [json.dumps(p.to_dict()) for p in plans]
    with open(folder / "maps.json", "w", encoding="utf-8") as maps, \
            open(folder / "plans.json", "w", encoding="utf-8") as out:
        maps.write(f'{{"format": "{MAPS_FORMAT}", "parameters": {{')
        out.write(f'{{"format": "{PLANS_FORMAT}", "parameters": {{')
        for i in range(parameters):
            sep = ", " if i else ""
            maps.write(f'{sep}"layers.{i}.w": {map_text[i % SHAPES]}')
            out.write(f'{sep}\n"layers.{i}.w": {plan_text[i % SHAPES]}')
        maps.write("}}\n")
        out.write("}}\n")
    segments = sum(len(plans[i % SHAPES].segments) for i in range(parameters))
    size = (folder / "plans.json").stat().st_size
    print(f"{folder}/plans.json: {parameters} parameters, {segments} segments, {size} bytes")


def verify(folder: Path, stream: bool) -> int:
    from refplan.verify import run_verify_cli

    start = time.perf_counter()
    code = run_verify_cli(str(folder / "maps.json"), str(folder / "plans.json"), quiet=True, stream=stream)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"stream={stream}: exit {code}, {wall:.1f} s, peak RSS {peak:.0f} MiB")
    return code


def held(segments: int, grid: tuple[int, int]) -> None:
    """One parameter of about ``segments`` segments: what its plan and its judgement hold."""
    from refplan.oracle.judge import _verify_plan

    rows = max(1, segments // grid[1])
    target, source = _pair((rows, grid[1]), 0)
    doc = plan_transfers({"w": (target, source)})["w"].to_dict()
    n = len(doc["segments"])
    text = json.dumps(doc)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    entry = json.loads(text)
    as_json = tracemalloc.get_traced_memory()[0] - base
    plan = TransferPlan.from_dict(entry)
    both = tracemalloc.get_traced_memory()[0] - base
    del entry
    parsed = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.reset_peak()
    verdict = _verify_plan(target, source, plan, parameter="w")
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert verdict.ok, verdict
    print(f"{n} segments: JSON entry {as_json / n:.0f} B/segment; entry + TransferPlan {both / n:.0f}; "
          f"TransferPlan alone {parsed / n:.0f}; peak while judging {peak / n:.0f} B/segment")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("folder", type=Path)
    w.add_argument("--parameters", type=int, default=1000)
    w.add_argument("--grid", default="40x25")
    v = sub.add_parser("verify")
    v.add_argument("folder", type=Path)
    v.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    h = sub.add_parser("held")
    h.add_argument("--segments", type=int, default=100_000)
    h.add_argument("--grid", default="40x25")
    args = parser.parse_args()
    if args.command == "verify":
        return verify(args.folder, args.stream)
    grid = tuple(int(v) for v in args.grid.split("x"))
    assert len(grid) == 2
    if args.command == "write":
        write(args.folder, args.parameters, (grid[0], grid[1]))
    else:
        held(args.segments, (grid[0], grid[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
