"""``refplan show``: the load table, the hand-written SVG, and one-line input errors."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from refplan.cli import show
from refplan.cli.demo import demo_batch
from refplan.files import MapsBatch, dump_maps, dump_plans, parse_maps
from refplan.maps import contiguous_split_map, replicate
from refplan.plan import TransferPlan, TransferSegment
from refplan.planner import plan_transfers
from refplan.policies import first_holder

SVG = "{http://www.w3.org/2000/svg}"


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    show.add_show_arguments(parser)
    return show.run_show_cli(parser.parse_args(list(argv)))


@pytest.fixture
def demo_maps(tmp_path: Path) -> Path:
    pairs, endpoints, sizes = demo_batch(layers=1)
    path = tmp_path / "maps.json"
    path.write_text(json.dumps(dump_maps(MapsBatch(pairs, endpoints, None, sizes))))
    return path


def _texts(svg_path: Path) -> str:
    root = ET.parse(svg_path).getroot()
    assert root.tag == f"{SVG}svg"
    return "\n".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


def test_svg_is_valid_and_names_every_process(
    demo_maps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.svg"
    assert _run(str(demo_maps), "--svg", str(out), "--policy", "first_holder") == 0
    texts = _texts(out)
    batch = parse_maps(json.loads(demo_maps.read_text()))
    assert batch.endpoints is not None
    for proc in sorted(set(batch.endpoints.source.values())):
        assert f"process {proc}" in texts
    for proc in sorted(set(batch.endpoints.target.values())):
        assert f"process {proc}" in texts
    for name in batch.pairs:
        assert name in texts
    root = ET.parse(out).getroot()
    filled = [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None
              and "-> target location" in (r.findtext(f"{SVG}title") or "")]
    assert len(filled) >= sum(len(p.segments) for p in plan_transfers(
        batch.pairs, endpoints=batch.endpoints, element_size=batch.element_size, replica_policy=first_holder
    ).values())
    table = capsys.readouterr().out
    assert "source process" in table and "busiest sender / even share" in table
    # first_holder leaves the DP replicas (processes 2 and 3) idle: they still get a row.
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.strip()[:1].isdigit()}
    assert rows["2"][1] == "0" and rows["3"][1] == "0" and int(rows["0"][1]) > 0


def test_svg_without_endpoints_names_locations(tmp_path: Path) -> None:
    source = replicate(contiguous_split_map((8, 8), [4, 4], 0), 2)
    target = contiguous_split_map((1, 2, 8), [4, 4], 2)  # a 3-d shard, drawn flattened
    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch({
        "w": (contiguous_split_map((8, 8), [2] * 4, 1), source),
        "v": (target, replicate(contiguous_split_map((1, 2, 8), [8], 2), 1)),
    }))))
    out = tmp_path / "plan.svg"
    assert _run(str(maps), "--svg", str(out)) == 0
    texts = _texts(out)
    for loc in range(4):
        assert f"source location {loc}" in texts


def test_plans_file_is_drawn_and_verified(demo_maps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = parse_maps(json.loads(demo_maps.read_text()))
    plans = plan_transfers(batch.pairs, endpoints=batch.endpoints, element_size=batch.element_size)
    plans_path = tmp_path / "plans.json"
    plans_path.write_text(json.dumps(dump_plans(plans)))
    out = tmp_path / "p.svg"
    assert _run(str(demo_maps), str(plans_path), "--svg", str(out)) == 0
    printed = capsys.readouterr().out
    assert f"plans from {plans_path}" in printed and "oracle: ok" in printed
    ET.parse(out)


def test_folded_segment_that_wraps_a_row_is_drawn() -> None:
    # A physically folded copy (DeepSpeed folds like this): (1,8) at offset 0 of a (2,4) shard.
    cells, omitted = show._cells(0, (4, 1), (1, 8), (2, 4))
    assert sorted(cells) == [(0, 1, 0, 4), (1, 1, 0, 4)] and omitted == 0
    assert show._cells(8, (8, 1), (2, 2), (4, 8)) == ([(1, 2, 0, 2)], 0)
    m = contiguous_split_map((2, 4), [2], 0)
    plan = TransferPlan((TransferSegment(0, 0, (4, 1), 0, 0, (4, 1), (1, 8)),), (2, 4), 8)
    svg = show.plan_svg(MapsBatch({"x": (m, m)}), {"x": plan})
    ET.fromstring(svg.split("?>", 1)[1])


def test_bad_maps_file_is_one_line_naming_file_and_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps = tmp_path / "maps.json"
    doc = dump_maps(MapsBatch({"w": (contiguous_split_map((4, 4), [2, 2], 0),) * 2}))
    doc = json.loads(json.dumps(doc))  # location keys become strings, as in a file
    doc["parameters"]["w"]["target"]["ranks"]["0"]["pieces"][0]["shape"] = "oops"
    maps.write_text(json.dumps(doc))
    assert _run(str(maps)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(maps) in err and '$.parameters.w.target.ranks["0"].pieces[0].shape: ' in err
    maps.write_text("{not json")
    assert _run(str(maps)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(maps) in err and "not valid JSON" in err


def test_bad_plans_file_is_one_line(demo_maps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = parse_maps(json.loads(demo_maps.read_text()))
    plans = plan_transfers(batch.pairs)
    doc = dump_plans(plans)
    name = sorted(doc["parameters"])[0]
    doc["parameters"][name]["segments"][1]["target"][0] = 99
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(doc))
    assert _run(str(demo_maps), str(path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) in err and f'$.parameters["{name}"].segments[1].target[0]: ' in err and "location 99" in err


def test_refused_maps_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch({
        "w": (contiguous_split_map((4, 4), [2, 2], 0), contiguous_split_map((4, 4), [2, 1], 0)),
    }))))
    assert _run(str(maps)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "InvalidMapError" in err


def test_endpoints_that_leave_a_planned_location_unbound_exit_2(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A maps file whose endpoints bind no process to a target location that the plans file
    writes: the load table ended in a bare ``KeyError: 1`` traceback (exit 1); now one line naming
    the plans file, the segment, the location and the maps file, exit 2, before any table."""
    from refplan.requests import TransferEndpoints

    pairs = {"w": (contiguous_split_map((8, 8), [4, 4], 0), replicate(contiguous_split_map((8, 8), [8], 0), 2))}
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps(dump_plans(plan_transfers(pairs))))
    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch(pairs, TransferEndpoints({0: 0, 1: 1}, {0: 2})))))
    assert _run(str(maps), str(plans)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == (f'refplan show: InvalidMapError: {plans}: $.parameters.w.segments[1].target[0]: '
                           f"location 1 has no process in the endpoints of {maps}")


def test_png_without_a_renderer_exits_2(demo_maps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(show, "png_renderer", lambda: None)
    assert _run(str(demo_maps), "--png", str(tmp_path / "x.png")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--png" in err and "--svg" in err
    assert not (tmp_path / "x.png").exists()


def test_png_is_rendered_with_matplotlib(demo_maps: Path, tmp_path: Path) -> None:
    """The test extra installs matplotlib, so CI renders a real PNG; elsewhere this skips visibly."""
    pytest.importorskip("matplotlib", reason="matplotlib (test extra) renders --png")
    out = tmp_path / "plan.png"
    assert _run(str(demo_maps), "--png", str(out)) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 200 and height > 200


def test_png_goes_to_exactly_the_file_named_as_png(
    demo_maps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """matplotlib given a path appended ".png" to a name without an extension (``--png adir``
    wrote ``adir.png`` beside the directory ``adir`` and exited 0) and took the format from any
    other (``out.pdf`` wrote a PDF; ``out.xyz`` raised a bare ValueError): an outside probe."""
    pytest.importorskip("matplotlib", reason="matplotlib (test extra) renders --png")
    for name in ("picture", "out.pdf", "out.xyz"):
        out = tmp_path / name
        assert _run(str(demo_maps), "--png", str(out)) == 0, name
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != demo_maps.name) == ["out.pdf", "out.xyz", "picture"]
    folder = tmp_path / "adir"
    folder.mkdir()
    capsys.readouterr()
    assert _run(str(demo_maps), "--png", str(folder)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"cannot write {folder}" in err, err
    assert not (tmp_path / "adir.png").exists()


def test_an_oversized_segment_is_drawn_clipped_to_its_shard_in_bounded_work() -> None:
    """A segment of 10**12 elements along a (2, 4) shard's addresses (a plan the oracle refuses at
    once) was walked row by row before its rows were clipped: memory grew until the process was
    killed. It is clipped to the shard first, and at most ``limit`` rectangles are made."""
    cells, omitted = show._cells(0, (1,), (10**12,), (2, 4))
    assert cells == [(0, 1, 0, 4), (1, 1, 0, 4)] and omitted == 0
    cells, omitted = show._cells(0, (1, 1), (10**12, 2), (2, 4), limit=3)
    assert len(cells) == 3 and omitted >= 1


def test_a_box_with_many_column_runs_is_drawn_run_by_run_so_a_gap_shows() -> None:
    """A box segment of more than 64 column runs was drawn as one rectangle over its span, so a
    shard half of whose columns nobody writes looked written. Every run is drawn, up to the
    limit, and what is not drawn is counted."""
    shard = (2, 100, 4)
    cells, omitted = show._cells(0, (400, 4, 1), (2, 100, 2), shard)  # columns 0-1 of each of 100 runs
    assert len(cells) == 100 and omitted == 0
    assert all(nc == 2 and c0 % 4 == 0 for _r0, _nr, c0, nc in cells)
    cells, omitted = show._cells(0, (400, 4, 1), (2, 100, 2), shard, limit=10)
    assert len(cells) == 10 and omitted == 90
