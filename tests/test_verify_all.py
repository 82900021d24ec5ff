"""``refplan verify --all``: every wrong segment of a parameter, not only the first (issue 28).

The oracle stops at a plan's first counterexample. ``--all`` (and ``segment_counterexamples``)
judges each segment alone with the same oracle, the gap check left out, so a planner with several
independent bugs sees each of them. The property below holds the other direction: a correct plan's
segments are never reported, so leaving the gap check out cannot invent a counterexample.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings

from refplan import contiguous_split_map, replicate
from refplan.cli import main
from refplan.formats import MapsBatch, dump_maps, dump_plans
from refplan.planner import plan_transfer
from refplan.strategies import map_pairs
from refplan.verify import segment_counterexamples, verify_plan

TARGET = contiguous_split_map((8, 4), [2] * 4, 0)
SOURCE = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)


def _broken(wrong: tuple[int, ...]) -> Any:
    plan = plan_transfer(TARGET, SOURCE)
    segments = list(plan.segments)
    for k in wrong:
        segments[k] = dataclasses.replace(segments[k], source_offset=segments[k].source_offset + 1)
    return dataclasses.replace(plan, segments=tuple(segments))


def test_every_independently_wrong_segment_is_found() -> None:
    plan = _broken((0, 2, 3))
    assert verify_plan(TARGET, SOURCE, plan).segments == (3,)  # the first counterexample only
    found, judged = segment_counterexamples(TARGET, SOURCE, plan)
    assert judged == len(plan.segments) and [k for k, _ in found] == [0, 2, 3]
    assert all(v.status == "invalid" and v.segments == (0,) for _, v in found)
    assert segment_counterexamples(TARGET, SOURCE, plan, limit=2)[0] == found[:2]
    assert segment_counterexamples(TARGET, SOURCE, plan, scan=1) == (found[:1], 1)


def test_a_double_write_between_segments_is_the_verdicts_not_a_segments() -> None:
    plan = plan_transfer(TARGET, SOURCE)
    doubled = dataclasses.replace(plan, segments=(*plan.segments, plan.segments[0]))
    assert verify_plan(TARGET, SOURCE, doubled).status == "invalid"
    assert segment_counterexamples(TARGET, SOURCE, doubled) == ([], len(doubled.segments))


@settings(max_examples=40, deadline=None)
@given(map_pairs(max_parts=4, max_locations=3))
def test_no_segment_of_a_correct_plan_is_reported(pair: Any) -> None:
    target, source = pair
    plan = plan_transfer(target, source)
    assert segment_counterexamples(target, source, plan)[0] == []


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    return code, out.getvalue()


def test_verify_all_lists_every_wrong_segment(tmp_path: Path) -> None:
    maps, plans = tmp_path / "maps.json", tmp_path / "plans.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch({"w": (TARGET, SOURCE)}, None, None, None))))
    plans.write_text(json.dumps(dump_plans({"w": _broken((0, 2, 3))})))
    code, text = _run(["verify", str(maps), str(plans)])
    assert code == 1 and "also:" not in text and "segment 3" in text
    for stream in ("--no-stream", "--stream"):
        code, text = _run(["verify", str(maps), str(plans), "--all", stream])
        also = [line for line in text.splitlines() if line.strip().startswith("also:")]
        assert code == 1 and len(also) == 2, text
        assert "segment 0 reads" in also[0] and "segment 2 reads" in also[1], text
