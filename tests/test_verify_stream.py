"""The streaming path of ``refplan verify`` answers exactly what the whole-file path answers.

``formats.PlansStream`` reads a plans file one parameter at a time and ``oracle.stream.verify_stream``
judges each plan as it arrives. Nothing here may differ from ``load_json`` + ``parse_plans`` +
``verify_plans``: not the verdicts, not the report, not the exit code, and not the one line a
malformed file gets on stderr (class, message, line, column, character), whatever the chunk size
the file is read in. So every test runs both paths and compares; the inputs are the conformance
corpus's problems with the planner's plans (and broken ones), hypothesis batches written in
varied layouts, every truncation of a small file, random corruptions, and the hand-picked cases
of JSON's corners (duplicates at each level, a BOM, CRLF, invalid UTF-8, extra data).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import re
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refplan import limits
from refplan.conformance.corpus import load_cases
from refplan.errors import AffineTransferError, InputFileError
from refplan.formats import (
    PLANS_FORMAT,
    MapsBatch,
    PlansStream,
    dump_maps,
    dump_plans,
    load_json,
    parse_maps,
    parse_plans,
)
from refplan.maps import contiguous_split_map, replicate
from refplan.oracle.stream import verify_stream
from refplan.plan import TransferPlan, TransferSegment
from refplan.planner import plan_transfers
from refplan.strategies import map_batches
from refplan.verify import _cli_check_sizes, run_verify_cli, verify_plans

NOTICE = "refplan verify: streaming "

SOURCE = replicate(contiguous_split_map((16, 8), [8, 8], 0), 2)
TARGET = contiguous_split_map((16, 8), [2, 2, 2, 2], 1)
PAIRS = {name: (TARGET, SOURCE) for name in ("a", "b\u00e9", "c\"q", "d")}
PLANS = plan_transfers(PAIRS)


def whole(path: Path) -> tuple[str, Any]:
    """What the whole-file reader makes of ``path``: its plans, the document it is not a batch
    of, or its error (class and message)."""
    try:
        doc = load_json(path)
        if not isinstance(doc, dict) or ("format" not in doc and "segments" in doc):
            return "document", doc
        return "plans", parse_plans(doc)
    except (AffineTransferError, InputFileError) as exc:
        return type(exc).__name__, str(exc)


def streamed(path: Path, chunk: int) -> tuple[str, Any]:
    """The same question asked of ``PlansStream``, read ``chunk`` characters at a time."""
    stream = PlansStream(path, chunk=chunk)
    try:
        plans = dict(stream)
    except (AffineTransferError, InputFileError) as exc:
        return type(exc).__name__, str(exc)
    return ("plans", plans) if stream.streamed else ("document", stream.document)


def agree(path: Path, chunks: tuple[int, ...] = (1, 3, 64, 1 << 20)) -> tuple[str, Any]:
    expected = whole(path)
    for chunk in chunks:
        got = streamed(path, chunk)
        if expected[0] == "document" and got[0] == "document" and isinstance(got[1], dict):
            # a bare plan: the stream names a streamed "parameters" with a placeholder
            assert list(got[1]) == list(expected[1]), (chunk, got, expected)
            continue
        assert got == expected, (chunk, got, expected)
    return expected


def cli(maps: Path, plans: Path, capsys: pytest.CaptureFixture[str], **kwargs: Any) -> tuple[int, str, str]:
    code = run_verify_cli(str(maps), str(plans), **kwargs)
    out, err = capsys.readouterr()
    return code, out, err


def cli_agree(maps: Path, plans: Path, capsys: pytest.CaptureFixture[str],
              modes: tuple[bool, ...] = (True, False)) -> tuple[int, str, str]:
    """Both paths through ``run_verify_cli``, JSON and text (``modes``, ``as_json``): identical
    but for the notice; the last run's outcome is returned."""
    for as_json in modes:
        expected = cli(maps, plans, capsys, as_json=as_json, stream=False)
        code, out, err = cli(maps, plans, capsys, as_json=as_json, stream=True)
        assert err.startswith(NOTICE) and err.count("\n") >= 1, err
        assert (code, out, err.split("\n", 1)[1]) == expected
    return expected


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.unlink(missing_ok=True)  # truncating a file in place is slow on some file systems
    path.write_bytes(text)
    return path


@pytest.fixture
def maps_file(tmp_path: Path) -> Path:
    return write(tmp_path / "maps.json", json.dumps(dump_maps(MapsBatch(PAIRS))))


# -- valid files: layout, order, names -------------------------------------------------------------


@pytest.mark.parametrize("indent", [None, 0, 2])
@pytest.mark.parametrize("format_last", [False, True])
def test_valid_files_read_the_same_in_every_layout(tmp_path: Path, indent: int | None, format_last: bool) -> None:
    doc = dump_plans(PLANS)
    if format_last:
        doc = {"parameters": doc["parameters"], "format": doc["format"]}
    path = write(tmp_path / "plans.json", json.dumps(doc, indent=indent, ensure_ascii=indent is None))
    kind, plans = agree(path)
    assert kind == "plans" and plans == PLANS and list(plans) == list(PLANS)


def test_crlf_and_odd_white_space_read_the_same(tmp_path: Path) -> None:
    text = json.dumps(dump_plans(PLANS), indent="\t").replace("\n", "\r\n")
    kind, plans = agree(write(tmp_path / "crlf.json", " \r\n\t" + text + "\r\n  "))
    assert kind == "plans" and plans == PLANS


def test_an_empty_batch_and_missing_parameters(tmp_path: Path, maps_file: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "empty.json", json.dumps({"format": PLANS_FORMAT, "parameters": {}}))
    assert agree(path) == ("plans", {})
    code, out, _ = cli_agree(maps_file, path, capsys)
    assert code == 1 and out.count("no plan does") == len(PAIRS)
    extra = write(tmp_path / "extra.json", json.dumps(dump_plans({"z": PLANS["a"], "a": PLANS["a"]})))
    code, out, _ = cli_agree(maps_file, extra, capsys)
    assert code == 1 and "do not describe" in out and "'a': " not in out  # ok parameters are listed only with -v


# -- whole files: the verdicts are verify_plans's ------------------------------------------------------


def _plans_for(batch: MapsBatch) -> dict[str, TransferPlan]:
    """The planner's plans for a problem, or, where it refuses, a one-segment guess per parameter
    (judged invalid or invalid_map: the point is that both paths say the same)."""
    try:
        return plan_transfers(batch.pairs, endpoints=batch.endpoints, element_size=batch.element_size,
                              process_node=batch.process_node)
    except AffineTransferError:
        guess = TransferSegment(0, 0, (1,), 0, 0, (1,), (1,))
        return {name: TransferPlan((guess,), tuple(t.logical_shape), 1) for name, (t, _) in batch.pairs.items()}


def test_the_conformance_corpus_verifies_the_same_streamed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    codes: set[int] = set()
    for i, case in enumerate(load_cases()[::2]):
        try:
            batch = parse_maps(case.maps_doc())
            _cli_check_sizes(batch)
        except AffineTransferError:
            continue  # a file the reader or the file checks refuse: run_verify_cli never reaches the plans
        plans = _plans_for(batch)
        if i % 2 and plans:  # every other case with one segment dropped: a gap to find
            name = min(plans)
            plans[name] = dataclasses.replace(plans[name], segments=plans[name].segments[1:])
        maps = write(tmp_path / "maps.json", json.dumps(case.maps_doc()))
        path = write(tmp_path / "plans.json", json.dumps(dump_plans(plans)))
        codes.add(cli_agree(maps, path, capsys, modes=(i % 3 == 0, False))[0])
        assert verify_stream(batch.pairs, plans.items()) == verify_plans(batch.pairs, plans)
    assert codes >= {0, 1, 2}, codes  # the corpus reaches ok, invalid and invalid_map verdicts


def _corrupt(plans: dict[str, TransferPlan], how: int) -> dict[str, Any]:
    out: dict[str, Any] = {name: plan.to_dict() for name, plan in plans.items()}
    name = min(out)
    segments = out[name]["segments"]
    if how == 1 and segments:
        segments.pop()
    elif how == 2 and segments:
        segments.append(segments[0])
    elif how == 3:
        out[name]["logical_shape"] = [*out[name]["logical_shape"], 1]
    elif how == 4:
        out["extra"] = out[name]
    elif how == 5 and segments:
        segments[0]["target"][0] += 1
    return out


@settings(max_examples=15)
@given(
    batch=map_batches(max_parameters=3, max_parts=4),
    how=st.integers(0, 5),
    indent=st.sampled_from([None, 1]),
    format_last=st.booleans(),
    chunk=st.integers(1, 40),
)
def test_hypothesis_batches_verify_the_same_streamed(
    tmp_path_factory: pytest.TempPathFactory, batch: dict[str, Any], how: int, indent: int | None,
    format_last: bool, chunk: int,
) -> None:
    folder = tmp_path_factory.mktemp("batch")
    plans = _plans_for(MapsBatch(batch))
    body = {"parameters": _corrupt(plans, how)}
    doc = {**body, "format": PLANS_FORMAT} if format_last else {"format": PLANS_FORMAT, **body}
    maps = write(folder / "maps.json", json.dumps(dump_maps(MapsBatch(batch))))
    path = write(folder / "plans.json", json.dumps(doc, indent=indent))
    agree(path, (chunk, 1 << 20))
    expected = run_verify_cli(str(maps), str(path), as_json=True, quiet=True, stream=False)
    assert run_verify_cli(str(maps), str(path), as_json=True, quiet=True, stream=True) == expected
    stream = PlansStream(path, chunk=chunk)
    reference = verify_plans(batch, parse_plans(load_json(path)))
    assert verify_stream(batch, stream) == reference
    assert list(reference.verdicts) == sorted(reference.verdicts)


# -- malformed files: the same error, from the same place -----------------------------------------------


SMALL = json.dumps(dump_plans({"b\u00e9": PLANS["b\u00e9"], "c\"q": plan_transfers({"c": (SOURCE, TARGET)})["c"]}))


def test_every_truncation_is_refused_the_same(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    kinds: set[str] = set()
    for end in range(len(SMALL)):
        chunks = (1 << 20, *((7,) if end % 9 == 0 else ()), *((1,) if end % 27 == 0 else ()))
        kinds.add(agree(write(path, SMALL[:end]), chunks)[0])
    assert kinds == {"InvalidMapError"}  # and every message matched, line and column included


@settings(max_examples=60)
@given(
    at=st.integers(0, len(SMALL) - 1),
    change=st.sampled_from(['"', "{", "}", "[", "]", ",", ":", " ", "\n", "\\", "0", "9" * 30, "x", "",
                            '"a"', '"format"', "tru", "-", "1e", "\u00e9", "\x01"]),
    replace=st.booleans(),
    chunk=st.integers(1, 50),
)
def test_random_corruptions_are_refused_the_same(
    tmp_path_factory: pytest.TempPathFactory, at: int, change: str, replace: bool, chunk: int
) -> None:
    text = SMALL[:at] + change + SMALL[at + int(replace):]
    agree(write(tmp_path_factory.mktemp("corrupt") / "p.json", text), (chunk, 1 << 20))


@pytest.mark.parametrize(
    "text, expect",
    [
        ("", "Expecting value: line 1 column 1 (char 0)"),
        ("  \n ", "Expecting value: line 2 column 2 (char 4)"),
        ('{"format": "refplan.plans/1", "parameters": {}} x', "Extra data"),
        ('{"format": "refplan.plans/1", "parameters": {}, "format": "refplan.plans/1"}', "'format' appears twice"),
        ('{"format": "refplan.plans/1", "parameters": {"a": {}, "a": {}}}', "'a' appears twice"),
        ('{"format": "refplan.plans/1", "parameters": {"a": {"segments": [], "segments": []}}}',
         "'segments' appears twice"),
        ('{"format": "refplan.plans/1", "parameters": {"a": {}, "a": {}}, "x": [}', "'a' appears twice"),
        ('{"format": "refplan.plans/1", "parameters": {"a": 1,}}', "line 1 column"),
        ('{"format": "refplan.plans/1"\n "parameters": {}}', "Expecting ',' delimiter: line 2 column 2 (char 30)"),
        ('{"format" "refplan.plans/1"}', "Expecting ':' delimiter"),
        ("{1: 2}", "Expecting property name"),
        ('{"format": "refplan.plans/1", "parameters": {"a": 1' + "2" * 5000 + "}}",
         "an integer literal has more than 4300 digits"),
        ('\ufeff{"format": "refplan.plans/1", "parameters": {}}', "byte-order mark (BOM), which a JSON file must not"),
        ('[{"format": "refplan.plans/1"}]', "document"),
        ("null", "document"),
        ('{"parameters": {}, "format": "refplan.plans/2"}',
         "$.format: format 'refplan.plans/2' is not supported (this version reads refplan.plans/1)"),
        ('{"format": "refplan.plans/1"}', "$.parameters: must be an object"),
        ('{"format": "refplan.plans/1", "parameters": []}', "$.parameters: must be an object"),
        ('{"format": "refplan.plans/1", "parameters": {}, "paramters": 1}', 'did you mean "parameters"'),
        ('{"format": "refplan.plans/1", "parameters": {"a": {"logical_shape": [1], "segments": [{"shape": 1}]},'
         ' "b": {"logical_shape": [1], "segment": []}}}', '$.parameters.b: unknown key "segment"'),
        ('{"format": "refplan.plans/1", "parameters": {"a": {"logical_shape": [1], "segments": [{"shape": 1}]},'
         ' "b": 7}, "format2": 1}', 'unknown key "format2"'),
        ('{"format": "refplan.plans/1", "parameters": {"a": {"logical_shape": [1], "segments": [{"shape": 1}]},'
         ' "b": 7}}', "$.parameters.a.segments[0]"),
        ('{"logical_shape": [1], "segments": [], "parameters": {"a": 1}}', "document"),
    ],
)
def test_json_corners_are_refused_the_same(tmp_path: Path, text: str, expect: str) -> None:
    kind, detail = agree(write(tmp_path / "p.json", text))
    assert expect in (kind if kind == "document" else detail), (kind, detail)


@pytest.mark.parametrize("at", [0, 5, 40, len(SMALL.encode()) - 1])
@pytest.mark.parametrize("bad", [b"\xff", b"\xe2\x82", b"\xc3"])
def test_invalid_utf8_wins_over_every_json_error_as_in_load_json(tmp_path: Path, at: int, bad: bytes) -> None:
    raw = SMALL.encode()
    for text in (raw[:at] + bad + raw[at:], b"{" + raw[:at] + bad + raw[at:]):  # the second is not JSON early on
        kind, detail = agree(write(tmp_path / "u.json", text), (1, 5, 1 << 20))
        assert kind == "InvalidMapError" and "codec can't decode" in detail, detail


def test_a_file_that_cannot_be_read(tmp_path: Path, maps_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert agree(tmp_path / "missing.json")[0] == "InputFileError"
    assert agree(tmp_path)[0] == "InputFileError"  # a folder
    code, out, err = cli_agree(maps_file, tmp_path / "missing.json", capsys)
    assert code == 2 and not out and "cannot read" in err


def test_malformed_files_give_the_same_cli_line(tmp_path: Path, maps_file: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cut = write(tmp_path / "cut.json", json.dumps(dump_plans(PLANS))[:-40])
    code, out, err = cli_agree(maps_file, cut, capsys)
    assert code == 2 and not out and err.count("\n") == 1 and str(cut) in err and "not valid JSON" in err
    late = json.dumps({"parameters": dump_plans(PLANS)["parameters"], "format": "refplan.plans/0"})
    code, out, err = cli_agree(maps_file, write(tmp_path / "late.json", late), capsys)
    assert code == 2 and not out and "format 'refplan.plans/0' is not supported" in err


def test_a_bare_plan_is_verified_as_the_whole_file_path_does(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    one = write(tmp_path / "one.json", json.dumps(dump_maps(MapsBatch({"a": PAIRS["a"]}))))
    bare = write(tmp_path / "bare.json", json.dumps(PLANS["a"].to_dict()))
    assert cli_agree(one, bare, capsys)[0] == 0
    wrong = write(tmp_path / "wrong.json", json.dumps({**PLANS["a"].to_dict(), "parameters": {}}))
    code, _, err = cli_agree(one, wrong, capsys)
    assert code == 2 and 'unknown key "parameters"' in err
    two = write(tmp_path / "two.json", json.dumps(dump_maps(MapsBatch(PAIRS))))
    code, _, err = cli_agree(two, bare, capsys)
    assert code == 2 and "exactly one parameter" in err


# -- when it streams, and what it holds --------------------------------------------------------------------


def test_streaming_starts_at_the_threshold_and_says_so(tmp_path: Path, maps_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "plans.json", json.dumps(dump_plans(PLANS)))
    size = path.stat().st_size
    monkeypatch.setattr(limits, "STREAM_PLANS_BYTES", size + 1)
    code, _, err = cli(maps_file, path, capsys)
    assert code == 0 and NOTICE not in err
    monkeypatch.setattr(limits, "STREAM_PLANS_BYTES", size)
    code, _, err = cli(maps_file, path, capsys)
    assert code == 0 and err.startswith(NOTICE) and f"{size} bytes" in err and err.count("\n") == 1
    code, out, err = cli(maps_file, path, capsys, quiet=True)
    assert code == 0 and not out and not err
    code, _, err = cli(maps_file, path, capsys, stream=False)
    assert code == 0 and not err


def test_nothing_of_a_plan_is_kept_once_the_next_is_read(tmp_path: Path) -> None:
    path = write(tmp_path / "plans.json", json.dumps(dump_plans(PLANS)))
    alive: list[weakref.ref[TransferPlan]] = []

    def watched() -> Iterator[tuple[str, TransferPlan]]:
        for name, plan in PlansStream(path, chunk=16):
            gc.collect()
            assert all(ref() is None for ref in alive), "an earlier plan is still held"
            alive.append(weakref.ref(plan))
            yield name, plan
            del plan

    result = verify_stream(PAIRS, watched())
    assert result.ok and len(alive) == len(PAIRS)


@pytest.mark.parametrize("remember", [0, 1, 1024])
def test_forgetting_reused_verdicts_changes_no_verdict(monkeypatch: pytest.MonkeyPatch, remember: int) -> None:
    monkeypatch.setattr(limits, "STREAM_REMEMBER_PLANS", remember)
    pairs = {f"p{i}": (TARGET, SOURCE) for i in range(6)}
    plans: dict[str, Any] = {name: PLANS["a"] for name in pairs}
    plans["p3"] = dataclasses.replace(PLANS["a"], segments=PLANS["a"].segments[1:])  # a gap in one of them
    expected = verify_plans(pairs, plans)
    assert [v.status for v in expected.verdicts.values()] == ["ok"] * 3 + ["invalid"] + ["ok"] * 2
    assert verify_stream(pairs, plans.items()) == expected


def test_the_command_line_chooses_the_path_with_stream_and_no_stream(
    tmp_path: Path, maps_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``refplan verify --stream`` streams a small file (and says so); ``--no-stream`` never does,
    and giving both is a usage error (exit 2), not a silent choice."""
    from refplan.cli import main as refplan_main

    path = write(tmp_path / "plans.json", json.dumps(dump_plans(PLANS)))
    assert refplan_main(["verify", str(maps_file), str(path), "--stream"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(NOTICE) and "ok" in out
    assert refplan_main(["verify", str(maps_file), str(path), "--no-stream"]) == 0
    out, err = capsys.readouterr()
    assert NOTICE not in err and "ok" in out
    with pytest.raises(SystemExit) as exc:
        refplan_main(["verify", str(maps_file), str(path), "--stream", "--no-stream"])
    assert exc.value.code == 2


# -- the stream does per distinct layout and plan what the batch does -----------------------------


@pytest.mark.parametrize("judge", ["stream", "batch"])
def test_twins_are_validated_and_judged_once(oracle_work: dict[str, int], judge: str) -> None:
    """Four parameters with one layout and one plan: two map validations and one judgement, by
    the stream as by ``verify_plans``, with every verdict under its own name."""
    plans = dict(PLANS)
    result = verify_stream(PAIRS, plans.items()) if judge == "stream" else verify_plans(PAIRS, plans)
    assert result.ok and sorted(result.verdicts) == sorted(PAIRS)
    assert all(v.parameter == name for name, v in result.verdicts.items())
    assert oracle_work == {"validate_map": 2, "check_plan": 1}


@pytest.mark.parametrize(("remember", "judgements"), [(0, 4), (1, 1), (2, 1)])
def test_the_stream_forgets_reused_verdicts_only_beyond_its_bound(
    monkeypatch: pytest.MonkeyPatch, oracle_work: dict[str, int], remember: int, judgements: int
) -> None:
    """With room for ``remember`` distinct plans, twins of one plan are judged once (the memo
    holds one plan, which is not beyond any bound of at least one); with none, each is judged."""
    monkeypatch.setattr(limits, "STREAM_REMEMBER_PLANS", remember)
    assert verify_stream(PAIRS, dict(PLANS).items()).ok
    assert oracle_work["check_plan"] == judgements


def test_the_stream_passes_the_element_budget_on() -> None:
    """A segment that is not a box needs the element-level fallback: with a budget of 0 it is
    unverifiable, with the default it is judged (and here found valid), by both paths alike."""
    identity = contiguous_split_map((4, 4), [4], 0)
    plan = [TransferSegment(0, 0, (8, 1), 0, 0, (8, 1), (2, 8))]  # the shard read as 2 x 8
    pairs = {"x": (identity, identity)}
    default = verify_stream(pairs, [("x", plan)])
    assert default.verdicts["x"].status == verify_plans(pairs, {"x": plan}).verdicts["x"].status
    assert default.verdicts["x"].status == "ok"
    none = verify_stream(pairs, [("x", plan)], fallback_elements=0)
    assert none.verdicts["x"].status == "unverifiable"


def _two_wrong_segments(plan: dict[str, Any]) -> dict[str, Any]:
    plan = json.loads(json.dumps(plan))
    plan["segments"][1]["source"][1] += 1  # two segments wrong on their own
    plan["segments"][3]["target"][1] += 1
    return plan


def test_verbose_and_all_read_a_bare_plan_once_and_report_the_same_streamed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-v`` and ``--all`` read a streamed file a second time for the segments they print: a
    bare plan gave nothing on that second read, so its "segment i" and "also" lines vanished."""
    from refplan.maps import replicated_map

    pairs = {"w": (contiguous_split_map((8, 8), [2, 2, 2, 2], 0), replicated_map((8, 8), 2))}
    maps = write(tmp_path / "maps.json", json.dumps(dump_maps(MapsBatch(pairs))))
    plan = plan_transfers(pairs)["w"].to_dict()
    assert len(plan["segments"]) >= 4
    plans = write(tmp_path / "bare.json", json.dumps(_two_wrong_segments(plan)))
    expected = cli(maps, plans, capsys, verbose=True, all_failures=True, stream=False)
    code, out, _err = cli(maps, plans, capsys, verbose=True, all_failures=True, stream=True)
    assert (code, out) == expected[:2] and code == 1
    assert re.search(r"segment \d+: \{", out) and "also:" in out, out


def test_verbose_and_all_on_a_pipe_read_it_once(tmp_path: Path) -> None:
    """Read from a pipe, the second read found it drained: "not valid JSON", exit 2, no report."""
    import subprocess
    import sys

    maps = write(tmp_path / "maps.json", json.dumps(dump_maps(MapsBatch(PAIRS))))
    doc = dump_plans(plan_transfers(PAIRS))
    name = sorted(doc["parameters"])[0]
    doc["parameters"][name]["segments"][0]["source"][1] += 1
    script = str(Path(sys.executable).parent / "refplan")
    for flag in ("--no-stream", "--stream"):
        done = subprocess.run([script, "verify", str(maps), "/dev/stdin", "--all", "-v", flag],
                              input=json.dumps(doc), capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 1, (flag, done.stdout, done.stderr)
        assert "invalid" in done.stdout and "not valid JSON" not in done.stderr, (flag, done.stdout, done.stderr)
