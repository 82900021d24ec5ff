"""CLI and conformance-runner conventions (issue 14): what a new user hits first.

``--version``, ``python -m refplan``, ``-q``/``-v`` and help text everywhere, progress only on a
terminal, ``show`` exiting 1 for an invalid plan, ``sync`` without torch in one line, and the
runner's planner specs, exit codes, FAIL lines and ``--dump``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import refplan
from refplan._progress import Progress
from refplan.cli import main as cli_main
from refplan.cli import show
from refplan.cli.main import _OPTIONAL, _parser
from refplan.conformance import load_cases, run_conformance, select_cases
from refplan.conformance.adapters import Adapter, Outcome, make_adapter, split_entry_point
from refplan.conformance.corpus import Case
from refplan.conformance.runner import RULES_DOC, CaseResult, Report, add_conformance_arguments, run_conformance_cli
from refplan.files import MapsBatch, dump_maps, dump_plans
from refplan.maps import contiguous_split_map, replicated_map
from refplan.plan import TransferPlan, TransferSegment
from refplan.policies import POLICIES

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
PY = sys.executable


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:  # argparse's --help and --version
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------------------------
# --version, python -m refplan, -q / -v and help everywhere.


def test_version() -> None:
    code, out, _ = _cli(["--version"])
    assert code == 0 and out.strip() == f"refplan {refplan.__version__}"


def test_python_dash_m_refplan_is_the_command() -> None:
    done = subprocess.run([PY, "-m", "refplan", "--version"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"refplan {refplan.__version__}", done.stderr


def _commands() -> list[str]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_every_command_is_offered() -> None:
    assert {"plan", "verify", "demo"} | {name for name, *_ in _OPTIONAL} == set(_commands())


@pytest.mark.parametrize("command", ["plan", "verify", "demo", *(name for name, *_ in _OPTIONAL)])
def test_every_command_takes_quiet_and_verbose_and_documents_every_argument(command: str) -> None:
    parser = _parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    own = sub.choices[command]
    options = {s for a in own._actions for s in a.option_strings}
    assert {"-q", "--quiet", "-v", "--verbose"} <= options, command
    undocumented = [a.dest for a in own._actions if not a.help or a.help == argparse.SUPPRESS]
    assert not undocumented, f"refplan {command}: no help for {undocumented}"


def test_readme_lists_every_policy_and_the_planner_forms() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in POLICIES:
        assert f"`{name}`" in text, name
    assert "module:pkg.fn" not in text  # the form that never worked
    assert "pkg.module:function" in text and "--min-supported" in text and "--dump" in text


def test_quiet_plan_prints_no_summary_and_verbose_prints_per_parameter(tmp_path: Path) -> None:
    maps = str(ROOT / "spec" / "examples" / "maps.json")
    code, _, err = _cli(["plan", maps, "-o", str(tmp_path / "p.json"), "-q"])
    assert code == 0 and err == ""
    code, _, err = _cli(["plan", maps, "-o", str(tmp_path / "p.json"), "-v"])
    assert code == 0 and len(err.strip().splitlines()) == 3  # two parameters, then the summary


# ---------------------------------------------------------------------------------------------
# Progress: on a terminal only.


class _Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_is_shown_only_on_a_terminal_and_not_when_quiet() -> None:
    for tty, quiet, shown in ((True, False, True), (False, False, False), (True, True, False)):
        stream = _Terminal(tty)
        progress = Progress("work", 3, quiet=quiet, stream=stream)
        progress.update(1, "case-a")
        progress.close()
        assert ("work 1/3 case-a" in stream.getvalue()) is shown, (tty, quiet)


def _conformance(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    return run_conformance_cli(parser.parse_args(list(argv)))


def test_conformance_shows_progress_on_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    terminal = _Terminal(True)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert _conformance("--case", "rules/R2-*") == 0
    assert "refplan conformance 2/2" in terminal.getvalue()
    assert "\r" not in capsys.readouterr().out  # the report itself is untouched


def test_conformance_is_silent_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert _conformance("--case", "rules/R2-*") == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------
# Planner specs and run_conformance(callable).


def test_entry_point_forms() -> None:
    assert split_entry_point("pkg.mod:fn") == ("pkg.mod", "fn")
    assert split_entry_point("module:pkg.mod:fn") == ("pkg.mod", "fn")
    assert split_entry_point("module:pkg.fn") == ("pkg", "fn")
    assert split_entry_point("pkg.mod.fn") == ("pkg.mod", "fn")
    assert split_entry_point("mod:Class.method") == ("mod", "Class.method")
    for bad in ("nonsense", "module:", "a b:c", ":fn", "pkg:"):
        with pytest.raises(ValueError, match="entry point"):
            split_entry_point(bad)


@pytest.fixture
def planner_in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package ``myplanners`` in the current directory, importable only through the cwd."""
    package = tmp_path / "myplanners"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = (DATA / "refplan_planner.py").read_text(encoding="utf-8")
    (package / "wrapped.py").write_text(source, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in [m for m in sys.modules if m.startswith("myplanners")]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


@pytest.mark.parametrize("spec", ["myplanners.wrapped:plan", "module:myplanners.wrapped:plan",
                                  "module:myplanners.wrapped.plan"])
def test_entry_point_planners_import_from_the_current_directory(planner_in_cwd: Path, spec: str) -> None:
    report = run_conformance(spec, select_cases(load_cases(), "rules/R2-*"))
    assert report.counts()["pass"] == 2 and report.planner == spec
    assert str(planner_in_cwd) not in sys.path  # the cwd is importable for the import only


def test_run_conformance_takes_a_plain_function() -> None:
    sys.path.insert(0, str(DATA))
    try:
        from refplan_planner import plan  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(DATA))
    report = run_conformance(plan, select_cases(load_cases(), "rules/R2-*"))
    assert report.counts() == {"pass": 2, "fail": 0, "unsupported": 0, "error": 0, "quality": 0}
    assert report.planner.endswith("plan")
    with pytest.raises(TypeError, match="planner"):
        run_conformance(42, [])  # type: ignore[arg-type]


def test_an_unknown_spec_names_the_forms() -> None:
    with pytest.raises(ValueError, match=r"pkg\.module:function"):
        make_adapter("nonsense")


# ---------------------------------------------------------------------------------------------
# Exit codes when nothing ran; --min-supported.


class _Nothing(Adapter):
    """Supports no case that needs any feature, and answers nothing else either."""

    name = "nothing"

    def missing(self, case: Case) -> list[str]:
        return ["everything"]

    def plan(self, case: Case) -> Outcome:
        raise AssertionError("never runs")


def test_a_run_where_every_case_is_unsupported_fails() -> None:
    report = run_conformance(_Nothing(), select_cases(load_cases(), "rules/R2-*"))
    assert report.counts()["unsupported"] == 2 and report.ok
    assert report.supported == 0 and report.exit_code == 1


def test_min_supported(capsys: pytest.CaptureFixture[str]) -> None:
    assert _conformance("--case", "rules/R2-*", "--min-supported", "2") == 0
    assert _conformance("--case", "rules/R2-*", "--min-supported", "3") == 1
    assert "--min-supported 3" in capsys.readouterr().err
    report = run_conformance("refplan", select_cases(load_cases(), "rules/R2-*"))
    assert report.exit_code_for(0) == 0 and report.exit_code_for(3) == 1


# ---------------------------------------------------------------------------------------------
# FAIL lines: the case's why, cut to the terminal; rule ids point at an installed file; --dump.


def test_fail_lines_carry_the_why_and_fit_the_width() -> None:
    report = run_conformance(f"cmd:{PY} {DATA / 'wrong_planner.py'} accept-all",
                             select_cases(load_cases(), "rules/R0-*"))
    (result,) = report.results
    table = report.table(width=72)
    fail = [line for line in table.splitlines() if line.startswith("FAIL ")]
    assert fail and result.why[:20] in fail[0]
    tail = table.splitlines()[table.splitlines().index(fail[0]):-1]
    assert all(len(line) <= 72 for line in tail), tail
    assert any(str(RULES_DOC) in line and "R0" in line for line in tail)
    assert RULES_DOC.is_file()  # installed with the package, unlike spec/validation.md


def test_a_long_reason_is_cut_and_says_where_the_rest_is() -> None:
    long = CaseResult("x/y", "x", "why " * 40, "accept", "accept", "fail", "word " * 300)
    text = Report("p", [long]).table(width=80)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("FAIL x/y"))
    reason = lines[start + 1:-2]  # then the quality line and the summary
    assert 1 < len(reason) <= 4 and all(len(line) <= 80 for line in lines[start:-2])
    assert reason[-1].endswith("(full text: --json)")


def test_dump_writes_the_planner_input(capsys: pytest.CaptureFixture[str]) -> None:
    case = select_cases(load_cases(), "rules/R2-*")[0]
    assert _conformance("--dump", case.id) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(case.input_doc()))
    assert _conformance("--dump", "rules/R2-*") == 2  # two cases: give one
    assert _conformance("--dump", "no-such-case") == 2


# ---------------------------------------------------------------------------------------------
# refplan show and refplan sync.


def _show(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    show.add_show_arguments(parser)
    return show.run_show_cli(parser.parse_args(list(argv)))


def _maps_with_a_gap(tmp_path: Path) -> tuple[Path, Path]:
    pairs = {"w": (contiguous_split_map((4, 4), [2, 2], 0), replicated_map((4, 4), 1))}
    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch(pairs))))
    half = TransferPlan((TransferSegment(0, 0, (4, 1), 0, 0, (4, 1), (2, 4)),), (4, 4), 8)  # target 1 unwritten
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps(dump_plans({"w": half})))
    return maps, plans


def test_show_exits_1_for_an_invalid_plan_and_still_draws_it(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    maps, plans = _maps_with_a_gap(tmp_path)
    svg = tmp_path / "x.svg"
    assert _show(str(maps), str(plans), "--svg", str(svg)) == 1
    assert "oracle: invalid" in capsys.readouterr().out and svg.exists()


def test_show_svg_and_png_without_a_renderer_writes_the_svg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(show, "png_renderer", lambda: None)
    maps, _plans = _maps_with_a_gap(tmp_path)
    svg, png = tmp_path / "x.svg", tmp_path / "x.png"
    assert _show(str(maps), "--svg", str(svg), "--png", str(png)) == 0
    err = capsys.readouterr().err
    assert svg.exists() and not png.exists()
    assert "refplan[png]" in err and str(svg) in err and len(err.strip().splitlines()) == 1


def test_one_dimensional_shards_are_drawn_to_scale(tmp_path: Path) -> None:
    pairs = {"w": (contiguous_split_map((12,), [3, 9], 0), replicated_map((12,), 1))}
    batch = MapsBatch(pairs)
    from refplan.planner import plan_transfers

    svg = show.plan_svg(batch, plan_transfers(pairs))
    root = ET.fromstring(svg)
    widths = {}
    for rect in root.iter("{http://www.w3.org/2000/svg}rect"):
        title = rect.find("{http://www.w3.org/2000/svg}title")
        if title is not None and (title.text or "").startswith("target location "):
            widths[title.text] = float(rect.get("width", "0"))
    small = widths["target location 0, shard (3,)"]
    large = widths["target location 1, shard (9,)"]
    assert large == pytest.approx(3 * small)


def test_sync_without_torch_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ModuleNotFoundError
    code, _out, err = _cli(["sync", "--nproc", "1"])
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "torch" in err and "refplan[torch]" in err


def test_a_missing_module_that_is_not_an_extra_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a known optional dependency is reported as missing; anything else is a bug to see."""
    import importlib

    cli = importlib.import_module("refplan.cli.main")  # the module (the attribute refplan.cli.main is its function)

    def broken(_args: Any) -> int:
        raise ModuleNotFoundError("No module named 'refplan_internal'", name="refplan_internal")

    monkeypatch.setattr(cli, "_cmd_demo", broken)
    with pytest.raises(ModuleNotFoundError):
        cli_main(["demo"])


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs a FIFO to block a read on")
def test_ctrl_c_is_one_line_and_exit_130_not_a_traceback(tmp_path: Path) -> None:
    """An outside probe: Ctrl-C during ``refplan verify`` (a read blocked on a FIFO) printed a
    KeyboardInterrupt traceback; so did every command but ``conformance``."""
    import os
    import signal
    import time

    fifo = tmp_path / "plans"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "refplan", "verify", str(fifo), str(fifo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None and time.monotonic() < deadline:  # until the command opens it to read
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.05)
        assert writer is not None, "the command never opened its input"
        time.sleep(0.3)  # now blocked reading: nothing is written and the write end stays open
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        if writer is not None:
            os.close(writer)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip() == "refplan verify: interrupted", err


def test_a_dash_reads_standard_input(tmp_path: Path) -> None:
    """``-`` as an input file is standard input (``-o -`` was already standard output); before,
    ``refplan plan -`` said "-: cannot read: No such file or directory" (an outside probe)."""
    from refplan.cli.demo import demo_batch
    from refplan.formats import MapsBatch, dump_maps

    pairs, endpoints, sizes = demo_batch(layers=1)
    maps_text = json.dumps(dump_maps(MapsBatch(pairs, endpoints, None, sizes)))
    (tmp_path / "maps.json").write_text(maps_text)

    def run(*argv: str, stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "refplan", *argv], input=stdin, capture_output=True, text=True,
                              timeout=120, check=False)

    planned = run("plan", "-", "-o", "-", stdin=maps_text)
    assert planned.returncode == 0, planned.stderr
    done = run("verify", str(tmp_path / "maps.json"), "-", stdin=planned.stdout)
    assert done.returncode == 0 and "-> ok" in done.stderr + done.stdout, done
    maps_in = run("verify", "-", str(tmp_path / "maps.json"), stdin=maps_text)  # maps from stdin: not plans
    assert maps_in.returncode == 2 and "plans" in maps_in.stderr, maps_in.stderr
    empty = run("plan", "-", stdin="")
    assert empty.returncode == 2 and empty.stderr.startswith("refplan plan: InvalidMapError: -: not valid JSON"), empty


def test_case_files_are_read_as_strictly_as_maps_files(tmp_path: Path) -> None:
    """An outside probe: a case file 10**5 '[' deep raised a bare RecursionError, a second
    "family" key was taken silently, a second "cases": [] made the file "hold no case", and a
    gzipped file's error did not name it."""
    import gzip

    from refplan.conformance.corpus import CaseFormatError

    files = {
        "deep.json": ("[" * 100_000).encode(),
        "twice.json": b'{"format": "refplan.conformance/1", "family": "a", "family": "b", "cases": []}',
        "zipped.json": gzip.compress(b'{"format": "refplan.conformance/1"}'),
    }
    said = {"deep.json": "nested too deeply", "twice.json": "key 'family' appears twice in one object",
            "zipped.json": "can't decode byte 0x8b"}
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(CaseFormatError) as caught:
            load_cases(path)
        assert str(caught.value).startswith(f"{path}: not valid JSON: ") and said[name] in str(caught.value), caught


def test_standard_input_is_read_once_and_whole_and_output_dash_is_standard_output(tmp_path: Path) -> None:
    """From a review of the change that made ``-`` standard input: ``verify maps - --stream`` on a
    document that is not an object read stdin a second time and said "Expecting value"; a pipe was
    never streamed by size but a file named ``-`` in the current folder decided it; ``verify - -``
    said "not valid JSON"; a closed stdin was a bare AttributeError; ``--svg -`` made a file named
    ``-``; ``-o /dev/stdout`` into a pipe said "No such file or directory"."""
    from refplan.cli.demo import demo_batch
    from refplan.formats import MapsBatch, dump_maps

    pairs, endpoints, sizes = demo_batch(layers=1)
    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(dump_maps(MapsBatch(pairs, endpoints, None, sizes))))
    (tmp_path / "-").write_text("x" * 10)  # a file named "-" must not be what is read or weighed

    def run(*argv: str, stdin: str = "", shell: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "refplan", *argv]
        if shell is not None:
            command = ["sh", "-c", " ".join(command) + shell]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, check=False,
                              cwd=tmp_path)

    listed = run("verify", str(maps), "-", stdin="[1, 2]")
    assert listed.returncode == 2 and "$: this is a list, not a refplan file" in listed.stderr, listed.stderr
    streamed = run("verify", str(maps), "-", "--stream", stdin="[1, 2]")
    assert streamed.returncode == 2 and "--stream reads its file twice" in streamed.stderr, streamed.stderr
    twice = run("verify", "-", "-", stdin="{}")
    assert twice.returncode == 2 and "named for both the maps and the plans" in twice.stderr, twice.stderr
    shown = run("show", "-", "-", stdin="{}")
    assert shown.returncode == 2 and "named for both the maps and the plans" in shown.stderr, shown.stderr
    closed = run("plan", "-", shell=" <&-")
    assert closed.returncode == 2, closed
    assert closed.stderr.startswith("refplan plan: InputFileError: -: cannot read: standard input is closed"), closed
    svg = run("show", str(maps), "-q", "--svg", "-")
    assert svg.returncode == 0 and svg.stdout.startswith("<?xml") and "<svg" in svg.stdout, svg.stdout[:200]
    piped = run("plan", str(maps), "-o", "/dev/stdout")  # stdout is a pipe here
    assert piped.returncode == 0 and json.loads(piped.stdout)["format"] == "refplan.plans/1", piped.stderr
    assert (tmp_path / "-").read_text() == "x" * 10


def test_sync_quiet_still_prints_a_process_whose_elements_are_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    from refplan.cli.sync import RankOutcome, _report

    value = {"rank": 1, "sent_bytes": {0: 8}, "received_bytes": {0: 8}, "local_copy_bytes": 0, "move_seconds": 0.5,
             "mismatched": 3, "first_mismatch": "w[0, 1]", "rounds": 1, "chunks": 1, "checked": 2, "plan_seconds": 0.1}
    good = {**value, "rank": 0, "mismatched": 0}
    assert _report([RankOutcome(0, good), RankOutcome(1, value)], 1.0, quiet=True) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("  process 1:") and "3 MISMATCHED (first: w[0, 1])" in out[0], out
    assert out[1] == "refplan sync: 3 elements wrong", out


def test_the_launcher_runs_under_forkserver() -> None:
    """The parent-death check took a forkserver child's parent (the server) for a dead launcher
    and ended every process at once ("exited (1) without reporting")."""
    from datetime import timedelta

    from refplan.cli.sync import run_ranks

    outcomes = run_ranks(_rank_and_world, 2, start_method="forkserver", timeout=timedelta(seconds=60), quiet=True)
    assert [o.value for o in outcomes] == [(0, 2), (1, 2)], outcomes


def _rank_and_world(rank: int, world: int) -> tuple[int, int]:
    return rank, world
