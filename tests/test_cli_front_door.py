"""The command line's front door (issue 28): one rule for bad input across ``plan``, ``verify`` and
``show``; format errors that say what the file is; one JSON-path notation; ``refplan verify``'s
``--junit``, ``--all`` and ``-v``; the demo's note on its sync; and empty pieces that cost nothing
to plan."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from refplan import AffinePiece, ParamAffineMap, contiguous_split_map, replicate
from refplan import frames as frames_module
from refplan.cli import main
from refplan.errors import InvalidMapError
from refplan.formats import MAX_ELEMENT_SIZE, MapsBatch, dump_maps, dump_plans, parse_maps, parse_plans
from refplan.frames import normalize
from refplan.planner import plan_transfer, plan_transfers
from refplan.verify import verify_plans

SOURCE = replicate(contiguous_split_map((8, 8), [4, 4], 0), 2)
TARGET = contiguous_split_map((8, 8), [2, 2, 2, 2], 1)


def _write(path: Path, doc: Any) -> str:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def _doc(pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]]) -> Any:
    """A maps document as a file holds it (string keys)."""
    return json.loads(json.dumps(dump_maps(MapsBatch(pairs))))


def _maps(tmp_path: Path, pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] | None = None) -> str:
    return _write(tmp_path / "maps.json", dump_maps(MapsBatch(pairs or {"w": (TARGET, SOURCE)})))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- one rule for bad input --------------------------------------------------------------------


def _absurd() -> dict[str, Any]:
    huge = 10**30
    one = {"logical_shape": [huge, 8], "ranks": {"0": {"shard_shape": [huge, 8], "pieces": [
        {"shape": [huge, 8], "source": [0, [8, 1]], "dest": [0, [8, 1]], "locations": [0]}]}}}
    return {"format": "refplan.maps/1", "parameters": {"w": {"target": one, "source": one}}}


def test_an_absurd_shape_is_the_same_error_in_plan_verify_and_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    maps = _write(tmp_path / "huge.json", _absurd())
    plans = _write(tmp_path / "plans.json", {"format": "refplan.plans/1", "parameters": {
        "w": {"logical_shape": [10**30, 8], "segments": []}}})
    messages = set()
    for argv in (["plan", maps], ["verify", maps, plans], ["show", maps], ["show", maps, plans]):
        code, _out, err = _run(argv, capsys)
        assert code == 2, (argv, err)
        line = err.strip()
        assert len(line.splitlines()) == 1 and line.startswith(f"refplan {argv[0]}: InvalidMapError: "), line
        messages.add(line.split(": ", 1)[1])
    assert messages == {"InvalidMapError: parameter 'w', source map: logical shape "
                        f"({10**30}, 8) has an extent above 2**62"}


def test_verify_prints_a_map_error_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc({"w": (TARGET, SOURCE)})
    doc["parameters"]["w"]["target"]["ranks"]["0"]["pieces"][0]["locations"] = [99]
    maps = _write(tmp_path / "badloc.json", doc)
    plans = _write(tmp_path / "plans.json", dump_plans({"w": plan_transfer(TARGET, SOURCE)}))
    code, out, err = _run(["verify", maps, plans], capsys)
    assert code == 2
    assert (out + err).count("declares locations [99]") == 1
    assert err.startswith("refplan verify: InvalidMapError: parameter 'w': ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"format": "refplan.plans/1", "parameters": {}},
         "$.format: this is a refplan.plans/1 file (plans); maps were expected"),
        ({"format": "refplan.maps/2", "parameters": {}},
         "$.format: format 'refplan.maps/2' is not supported (this version reads refplan.maps/1)"),
        ({"parameters": {}}, '$: no "format" key: not a refplan file; maps (refplan.maps/1) were expected'),
        (TARGET.to_dict(), '$: no "format" key: this is one map (DeepSpeed\'s dict form), not a refplan file'),
        ([1, 2], "$: this is a list, not a refplan file; maps (refplan.maps/1) were expected"),
        ({"format": "foo"}, "$.format: 'foo' is not a refplan format; maps (refplan.maps/1) were expected"),
    ],
)
def test_format_errors_say_what_the_file_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, expected: str
) -> None:
    path = _write(tmp_path / "x.json", doc)
    code, _out, err = _run(["plan", path], capsys)
    assert code == 2 and err.startswith(f"refplan plan: InvalidMapError: {path}: {expected}") and err.count("\n") == 1


def test_a_format_that_is_not_a_string_is_refused_not_crashed_on() -> None:
    # Found by the cli fuzz harness: an unhashable "format" once escaped as a TypeError.
    for parse in (parse_maps, parse_plans):
        message = _refused({"format": {"x": "refplan.plans/1"}, "parameters": {}}, parse)
        assert message.startswith("$.format: ") and "is not a refplan format" in message


def test_a_maps_file_where_plans_are_expected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps = _maps(tmp_path)
    code, _out, err = _run(["verify", maps, maps], capsys)
    assert code == 2 and "$.format: this is a refplan.maps/1 file (maps); plans were expected" in err


# -- one JSON-path notation --------------------------------------------------------------------


def _refused(doc: Any, parse: Any = parse_maps) -> str:
    with pytest.raises(InvalidMapError) as caught:
        parse(json.loads(json.dumps(doc)))
    return str(caught.value)


def test_paths_are_written_one_way() -> None:
    doc = _doc({"w": (TARGET, SOURCE), "a.b": (TARGET, SOURCE)})
    doc["parameters"]["w"]["target"]["ranks"]["0"]["pieces"][0]["shape"] = [4, "8"]
    assert _refused(doc).startswith('$.parameters.w.target.ranks["0"].pieces[0].shape: ')
    doc = _doc({"a.b": (TARGET, SOURCE)})
    doc["parameters"]["a.b"]["source"]["ranks"]["1"]["shard_shape"] = "x"
    assert _refused(doc).startswith('$.parameters["a.b"].source.ranks["1"].shard_shape: ')
    plans = json.loads(json.dumps(dump_plans({"w": plan_transfer(TARGET, SOURCE)})))
    plans["parameters"]["w"]["segments"][3]["shape"] = [True]
    assert _refused(plans, parse_plans).startswith("$.parameters.w.segments[3].shape: ")
    doc = _doc({"w": (TARGET, SOURCE)})
    doc["endpoints"] = {"source": {"0": "x"}, "target": {}}
    assert _refused(doc).startswith('$.endpoints.source["0"]: ')
    doc = _doc({"w": (TARGET, SOURCE)})
    doc["element_size"] = {"w": 1.5}
    assert _refused(doc).startswith("$.element_size: ")
    doc["process_node"] = []
    doc["element_size"] = 2
    assert _refused(doc).startswith("$.process_node: ")


def test_a_single_map_or_plan_is_rooted_at_dollar() -> None:
    bad = json.loads(json.dumps(TARGET.to_dict()))
    bad["ranks"]["0"]["pieces"] = 3
    with pytest.raises(InvalidMapError, match=r'^\$\.ranks\["0"\]\.pieces: expected a list'):
        ParamAffineMap.from_dict(bad)


def test_no_message_uses_the_old_notations(tmp_path: Path) -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in (Path(__file__).parents[1] / "refplan").rglob("*.py")
                       if p.parent.name != "oracle" and p.name not in ("testing.py", "endpoints.py"))
    assert not re.search(r"f\"plans\[\{", source)
    assert not re.search(r"parameters\[\{name!r\}\]", source)


# -- argument and output errors ----------------------------------------------------------------


def test_element_size_is_capped_alike_on_the_command_line_and_in_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    maps = _maps(tmp_path)
    code, _out, err = _run(["plan", maps, "--element-size", str(10**23)], capsys)
    assert code == 2 and f"--element-size must be from 1 to {MAX_ELEMENT_SIZE} bytes" in err
    assert _run(["plan", maps, "--element-size", str(MAX_ELEMENT_SIZE), "-q"], capsys)[0] == 0
    doc = _doc({"w": (TARGET, SOURCE)})
    doc["element_size"] = MAX_ELEMENT_SIZE + 1
    assert _refused(doc) == f"$.element_size: {MAX_ELEMENT_SIZE + 1} bytes per element is above the largest " \
                            f"element size, {MAX_ELEMENT_SIZE} bytes"
    doc["element_size"] = {"w": 10**23}
    assert _refused(doc).startswith("$.element_size.w: ")
    doc["element_size"] = MAX_ELEMENT_SIZE
    assert parse_maps(doc).element_size == {"w": MAX_ELEMENT_SIZE}


def test_plan_transfers_takes_one_element_size_for_every_parameter() -> None:
    pairs = {"w": (TARGET, SOURCE), "v": (TARGET, SOURCE)}
    assert plan_transfers(pairs, element_size=4) == plan_transfers(pairs, element_size={"w": 4, "v": 4})
    with pytest.raises(ValueError, match="positive"):
        plan_transfers(pairs, element_size=0)
    with pytest.raises(TypeError, match="an int"):
        plan_transfers(pairs, element_size=True)  # type: ignore[arg-type]


def test_an_unwritable_output_is_said_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "dir" / "x.json"
    code, _out, err = _run(["plan", _maps(tmp_path), "-o", str(target)], capsys)
    assert code == 2 and err == f"refplan plan: cannot write {target}: No such file or directory\n"
    code, _out, err = _run(["show", _maps(tmp_path), "-q", "--svg", str(target)], capsys)
    assert code == 2 and err == f"refplan show: cannot write {target}: No such file or directory\n"


def test_process_node_without_endpoints_is_refused_by_the_command_as_by_the_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc({"w": (TARGET, SOURCE)})
    doc["process_node"] = {"0": 0}
    code, _out, err = _run(["plan", _write(tmp_path / "m.json", doc)], capsys)
    assert code == 2 and "InvalidMapError: process_node needs endpoints" in err


def _bound_doc(change: str) -> Any:
    doc = _doc({"w": (TARGET, SOURCE)})
    doc["endpoints"] = {"source": {str(loc): loc for loc in range(4)}, "target": {str(loc): loc for loc in range(4)}}
    doc["process_node"] = {"0": 0, "1": 0, "2": 1, "3": 1}
    if change == "source location unbound":
        del doc["endpoints"]["source"]["3"]
    elif change == "target location unbound":
        del doc["endpoints"]["target"]["2"]
    elif change == "process_node without endpoints":
        del doc["endpoints"]
    elif change == "process without a node":
        del doc["process_node"]["3"]
    return doc


@pytest.mark.parametrize("change", ["source location unbound", "target location unbound",
                                    "process_node without endpoints", "process without a node"])
def test_verify_refuses_the_bindings_plan_refuses(
    change: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file's endpoints and process_node are planner arguments the oracle never reads; verify
    answered ok for a file plan refuses. Now both refuse it as InvalidMapError, exit 2."""
    plans = _write(tmp_path / "plans.json", dump_plans(plan_transfers({"w": (TARGET, SOURCE)})))
    good = _write(tmp_path / "good.json", _bound_doc("none"))
    assert _run(["plan", good, "-q", "-o", str(tmp_path / "out.json")], capsys)[0] == 0
    assert _run(["verify", good, plans, "-q"], capsys)[0] == 0
    maps = _write(tmp_path / "m.json", _bound_doc(change))
    lines = {}
    for argv in (["plan", maps, "-q"], ["verify", maps, plans], ["verify", maps, plans, "--stream"]):
        code, out, err = _run(argv, capsys)
        assert code == 2 and out == "", (argv, out, err)
        assert err.startswith(f"refplan {argv[0]}: InvalidMapError: "), err
        lines[argv[0]] = err.split(": ", 1)[1]
    assert lines["verify"] == lines["plan"]


def test_empty_locations_need_no_binding_in_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A location that holds no data is not bound by the planner's requests, so verify does not
    require it either (the same file plans)."""
    empty = ParamAffineMap((8, 8), {**{loc: TARGET.shard_shapes[loc] for loc in TARGET.shard_shapes},
                                   9: (0, 8)},
                           {**TARGET.pieces_by_rank, 9: ()})
    doc = _doc({"w": (empty, SOURCE)})
    doc["endpoints"] = {"source": {str(loc): loc for loc in range(4)}, "target": {str(loc): loc for loc in range(4)}}
    maps = _write(tmp_path / "m.json", doc)
    plans = _write(tmp_path / "plans.json", dump_plans(plan_transfers({"w": (empty, SOURCE)})))
    assert _run(["plan", maps, "-q", "-o", str(tmp_path / "out.json")], capsys)[0] == 0
    assert _run(["verify", maps, plans, "-q"], capsys)[0] == 0


def test_a_batch_verdict_prints_without_the_command_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_transfer(TARGET, SOURCE)
    assert str(verify_plans({"w": (TARGET, SOURCE)}, {"w": plan})).startswith("1 parameter(s): 1 ok -> ok")
    plans = _write(tmp_path / "plans.json", dump_plans({"w": plan}))
    code, out, _err = _run(["verify", _maps(tmp_path), plans], capsys)
    assert code == 0 and out.startswith("refplan verify: 1 parameter(s): 1 ok -> ok") and "refplan verify: 1 p" not in \
        out[1:]


# -- refplan verify: --junit, --all, -v --------------------------------------------------------


def _failing(tmp_path: Path, count: int) -> tuple[str, str]:
    """A maps file of ``count`` parameters plus one good one, whose plans each lose their last segment."""
    pairs = {f"p{i:02d}": (TARGET, SOURCE) for i in range(count)} | {"zz": (TARGET, SOURCE)}
    plans = plan_transfers(pairs)
    doc = dump_plans(plans)
    for name in pairs:
        if name != "zz":
            doc["parameters"][name]["segments"][0]["target"][1] += 1
    return _maps(tmp_path, pairs), _write(tmp_path / "plans.json", doc)


def test_verify_junit_has_one_testcase_per_parameter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps, plans = _failing(tmp_path, 2)
    junit = tmp_path / "verify.xml"
    code, out, _err = _run(["verify", maps, plans, "--junit", str(junit), "-q"], capsys)
    assert code == 1 and out == ""
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "2"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert sorted(cases) == ["p00", "p01", "zz"]
    failure = cases["p00"].find("failure")
    assert failure is not None and (failure.text or "").startswith("invalid: parameter 'p00': ")
    assert cases["zz"].find("failure") is None
    code, _out, err = _run(["verify", maps, plans, "--junit", str(tmp_path / "no" / "x.xml")], capsys)
    assert code == 2 and "cannot write" in err and "No such file or directory" in err


def test_verify_lists_twenty_failures_unless_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps, plans = _failing(tmp_path, 25)
    code, out, _err = _run(["verify", maps, plans], capsys)
    assert code == 1
    assert out.count("  invalid: parameter") == 20 and "... and 5 more parameter(s) not ok (--all" in out
    assert "'zz'" not in out  # ok parameters only with -v
    code, out, _err = _run(["verify", maps, plans, "--all"], capsys)
    assert code == 1 and out.count("  invalid: parameter") == 25 and "more parameter" not in out


def test_verify_verbose_prints_the_offending_segments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps, plans = _failing(tmp_path, 1)
    for stream in ("--no-stream", "--stream"):
        code, out, _err = _run(["verify", maps, plans, "-v", stream], capsys)
        assert code == 1 and "  ok: parameter 'zz'" in out
        lines = out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("  invalid: parameter 'p00'"))
        shown = re.match(r"    segment (\d+): (\{.*\})$", lines[at + 1])
        assert shown is not None, lines[at:at + 3]
        segment = json.loads(shown.group(2))
        original = json.loads(Path(plans).read_text())["parameters"]["p00"]["segments"][int(shown.group(1))]
        assert segment == original


# -- the demo ----------------------------------------------------------------------------------


def test_the_demo_says_its_sync_runs_the_colocated_placement() -> None:
    from refplan.cli.demo import SYNC_NOTE, demo_batch, run_demo
    from refplan.cli.sync import _bind

    assert SYNC_NOTE in run_demo().splitlines()
    pairs, endpoints, _sizes = demo_batch()
    bound, mode = _bind(pairs, endpoints, "auto", 4)  # what `make demo`'s `refplan sync --nproc 4` does
    assert mode == "colocated" and "colocated" in SYNC_NOTE and "i mod 4" in SYNC_NOTE
    assert bound.source[5 % 4] == 1 and bound.target[1] == 1


def test_demo_quiet_prints_only_the_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["demo", "-q"], capsys)
    assert code == 0 and err == ""
    assert out.splitlines() == ["oracle verify_plans(first_holder): ok", "oracle verify_plans(balanced): ok"]
    code, out, _err = _run(["demo"], capsys)
    assert code == 0 and out.startswith("refplan demo: ") and len(out.splitlines()) > 10


def test_demo_fails_when_the_oracle_refuses_a_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's result is the oracle's verdicts; it exited 0 whatever they said."""
    import refplan.verify as verify_module
    from refplan.oracle.verdict import BatchVerdict

    monkeypatch.setattr(verify_module, "verify_plans", lambda pairs, plans: BatchVerdict("invalid"))
    code, out, _err = _run(["demo", "-q"], capsys)
    assert code == 1 and out.splitlines() == ["oracle verify_plans(first_holder): invalid",
                                              "oracle verify_plans(balanced): invalid"]


@pytest.mark.parametrize("argv", [["plan", "{maps}", "-o", ""], ["verify", "{maps}", "{plans}", "--junit", ""],
                                  ["show", "{maps}", "--svg", ""], ["show", "{maps}", "--png", ""],
                                  ["conformance", "--junit", ""], ["conformance", "--markdown", ""],
                                  ["conformance", "--explore-out", ""]])
def test_an_empty_output_file_name_is_refused_before_any_work(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o ''`` (an unset shell variable) ran the whole job and then said "cannot write : Is a
    directory"; it is refused as a usage error, exit 2, naming the option."""
    maps = _maps(tmp_path)
    plans = _write(tmp_path / "plans.json", dump_plans(plan_transfers({"w": (TARGET, SOURCE)})))
    args = [a.format(maps=maps, plans=plans) for a in argv]
    with pytest.raises(SystemExit) as raised:
        main(args)
    err = capsys.readouterr().err
    assert raised.value.code == 2 and f"argument {argv[-2]}" in err and "the file name is empty" in err, err


# -- empty pieces cost nothing to plan ---------------------------------------------------------


def _many_empty(count: int, real_at: int) -> ParamAffineMap:
    empty = AffinePiece((0, 8), 0, (8, 1), 0, (8, 1), (0,))
    real = AffinePiece((4, 8), 0, (8, 1), 0, (8, 1), (0,))
    pieces = [empty] * count
    pieces.insert(real_at, real)
    return ParamAffineMap((4, 8), {0: (4, 8)}, {0: pieces})


@pytest.mark.parametrize("count", [10, 1000])
def test_empty_pieces_are_not_validated_one_by_one(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"rule": 0, "common": 0}
    rule, common = frames_module._piece_frame, frames_module._common_frame

    def counted_rule(*args: Any) -> Any:
        calls["rule"] += 1
        return rule(*args)

    def counted_common(*args: Any) -> Any:
        calls["common"] += 1
        return common(*args)

    monkeypatch.setattr(frames_module, "_piece_frame", counted_rule)
    monkeypatch.setattr(frames_module, "_common_frame", counted_common)
    nmap = normalize(_many_empty(count, count // 2), "target", "w")
    assert [(f.location, f.piece_index) for f in nmap.frames] == [(0, count // 2)]
    assert calls["rule"] + calls["common"] <= 1
    assert nmap.piece_count == count + 1


def test_a_rule_an_empty_piece_breaks_is_still_refused_in_piece_order() -> None:
    base = _many_empty(100, 0)
    bad = list(base.pieces_by_rank[0])
    bad[40] = AffinePiece((0, 8), 0, (8, 1), 0, (8, 1), ())  # R9: no holder
    bad[70] = AffinePiece((0, 8, 1), 0, (8, 1, 1), 0, (8, 1, 1), (0,))  # R7: another number of axes
    with pytest.raises(InvalidMapError, match=r"location 0, piece 40: the piece names no holder"):
        normalize(ParamAffineMap((4, 8), {0: (4, 8)}, {0: bad}), "target", "w")
    many = [AffinePiece((1, 8), 8 * i, (8, 1), 8 * i, (8, 1), (0,)) for i in range(40)]
    many.insert(5, AffinePiece((0, 8), 0, (8, 1), 0, (8, 1), (0,)))
    nmap = normalize(ParamAffineMap((40, 8), {0: (40, 8)}, {0: many}), "source", "w")  # the array path
    assert [f.piece_index for f in nmap.frames] == [*range(5), *range(6, 41)]


@pytest.mark.parametrize("size", [65537, 10**23, {"w": 10**23}])
def test_the_library_refuses_an_absurd_element_size_as_files_do(size: object) -> None:
    """``plan_transfers`` holds element sizes to the bound files and ``--element-size`` are held to."""
    from refplan import contiguous_split_map
    from refplan.limits import MAX_ELEMENT_SIZE
    from refplan.planner import plan_transfers

    m = contiguous_split_map((4, 4), [2, 2], 0)
    with pytest.raises(ValueError, match=f"at most {MAX_ELEMENT_SIZE} bytes"):
        plan_transfers({"w": (m, m)}, element_size=size)  # type: ignore[arg-type]
    plan_transfers({"w": (m, m)}, element_size=MAX_ELEMENT_SIZE)


# -- reports as XML: names and texts XML cannot hold ---------------------------------------------


@pytest.mark.parametrize("name", ["\ud800", "w\x01", "w\x00", "w\x1b[31m"])
def test_verify_junit_holds_a_name_xml_cannot(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Any JSON string is a parameter name. A lone surrogate made the JUnit writer raise
    ``UnicodeEncodeError`` (a traceback and exit 1 for a correct plan, the file left empty); a
    control character was written unescaped into an attribute (exit 0, a file no XML reader
    parses). Both are now written as their Python escapes."""
    pairs = {name: (TARGET, SOURCE)}
    maps = _maps(tmp_path, pairs)
    plans = _write(tmp_path / "plans.json", dump_plans(plan_transfers(pairs)))
    junit = tmp_path / "verify.xml"
    code, out, err = _run(["verify", maps, plans, "--junit", str(junit)], capsys)
    assert code == 0 and "1 ok -> ok" in out and err == "", (out, err)
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert [c.get("name") for c in cases] == [ascii(name)[1:-1]]
    svg = tmp_path / "plan.svg"
    code, _out, _err = _run(["show", maps, plans, "--svg", str(svg), "-q"], capsys)
    assert code == 0
    ET.parse(svg)  # parses: the name in its title is escaped too


def test_verify_all_names_every_map_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--all`` lists every parameter that is not ok: a map error was printed for the first
    parameter only, so the second one's was in ``--json`` alone."""
    scaled = ParamAffineMap((8, 8), {0: (8, 8)}, {0: [AffinePiece((8, 8), 0, (8, 1), 0, (8, 1), {0}, scale=2.0)]})
    pairs = {"a": (TARGET, scaled), "b": (TARGET, scaled), "c": (TARGET, SOURCE)}
    maps = _write(tmp_path / "maps.json", dump_maps(MapsBatch(pairs)))
    plans = _write(tmp_path / "plans.json", dump_plans(plan_transfers({"c": pairs["c"]})
                                                       | {n: plan_transfer(TARGET, SOURCE) for n in "ab"}))
    code, out, err = _run(["verify", maps, plans, "--all"], capsys)
    assert code == 2 and "1 ok, 2 invalid_map" in out
    assert "parameter 'a'" in err and "parameter 'b'" in err, err
    code, out, err = _run(["verify", maps, plans], capsys)
    assert code == 2 and "parameter 'a'" in err and "parameter 'b'" not in err


def test_conformance_junit_holds_a_peer_reason_xml_cannot() -> None:
    """A case's reason quotes a peer's error text, which may carry a terminal's colour codes."""
    from refplan.conformance.runner import CaseResult, Report

    reason = "peer raised \x1b[31mRuntimeError\x1b[0m: bad \ud800"
    report = Report("peer", [CaseResult("c1", "fam", "why", "pass", "raised", "error", reason=reason),
                             CaseResult("c2", "fam", "why", "ok", "wrong", "fail", reason=reason)])
    root = ET.fromstring(report.junit_xml().split("?>", 1)[1])
    error = next(root.iter("error"))
    assert error.text == ascii(reason)[1:-1].replace("\\'", "'")
    assert next(root.iter("failure")).get("message", "").startswith("peer raised \\x1b[31m")


# -- output files: whole or not at all -------------------------------------------------------------


def test_an_output_file_is_written_whole_or_left_as_it_was(tmp_path: Path) -> None:
    """``-o``, ``--svg``, ``--junit`` were written in place: a full disk left half a JSON file
    where a valid one had been. They now go through a temporary file renamed over the target."""
    from refplan.formats import write_text_file

    out = tmp_path / "plans.json"
    out.write_text("old, valid\n", encoding="utf-8")
    out.chmod(0o640)
    with pytest.raises(UnicodeEncodeError):
        write_text_file(out, "new " + "\udc80")  # fails while writing
    assert out.read_text(encoding="utf-8") == "old, valid\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plans.json"]  # no temporary file left
    write_text_file(out, "new\n")
    assert out.read_text(encoding="utf-8") == "new\n" and out.stat().st_mode & 0o777 == 0o640
    link = tmp_path / "link.json"
    link.symlink_to(out)
    write_text_file(link, "through the link\n")
    assert link.is_symlink() and out.read_text(encoding="utf-8") == "through the link\n"
    with pytest.raises(IsADirectoryError):
        write_text_file(tmp_path, "x")
    with pytest.raises(FileNotFoundError) as missing:
        write_text_file(tmp_path / "no" / "such.json", "x")
    assert missing.value.filename == str(tmp_path / "no" / "such.json")  # the caller's path, not a temporary one
    write_text_file("/dev/null", "special files are written in place\n")


def test_plan_to_a_file_that_cannot_be_finished_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno
    import os

    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch({"w": (contiguous_split_map((4, 4), [2, 2], 0),) * 2}))),
                    encoding="utf-8")
    out = tmp_path / "plans.json"
    out.write_text("{}\n", encoding="utf-8")

    def full(*_args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    code, _out, err = _run(["plan", str(maps), "-o", str(out)], capsys)
    assert code == 2 and f"cannot write {out}: No space left on device" in err, err
    assert out.read_text(encoding="utf-8") == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps.json", "plans.json"]


def test_an_endpoints_file_error_names_the_file_and_its_own_json_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: "$.endpoints.target[...]" and no file name, though the endpoints object is the
    file's root; every other input error starts with its file."""
    ends = _write(tmp_path / "endpoints.json", {"source": {"0": 0, "1": 1}, "target": {"3": 3.0}})
    code, _out, err = _run(["plan", _maps(tmp_path), "--endpoints", ends], capsys)
    assert code == 2, err
    assert f"InvalidMapError: {ends}: $.target[\"3\"]: 3.0 is not an integer" in err, err
    bad_key = _write(tmp_path / "endpoints2.json", {"source": {}, "target": {}, "extra": 1})
    code, _out, err = _run(["plan", _maps(tmp_path), "--endpoints", bad_key], capsys)
    assert code == 2 and f"{bad_key}: $" in err and "extra" in err, err
