"""The command line against an outside probe (thirty-seventh session): options that did nothing
or the wrong thing, outputs that mixed on standard output, and tracebacks. Each test failed before
its fix."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path
from typing import Any

import pytest

import refplan
import refplan.cli.bench
import refplan.conformance.runner
from refplan import TransferEndpoints, contiguous_split_map, replicate
from refplan.cli import main
from refplan.files import MapsBatch, dump_maps

pytestmark = [pytest.mark.timeout(300)]


def _maps(tmp_path: Path, names: list[str] | None = None) -> Path:
    source = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
    target = contiguous_split_map((8, 4), [2, 2, 2, 2], 0)
    path = tmp_path / "maps.json"
    endpoints = TransferEndpoints({loc: loc for loc in range(4)}, {loc: 4 + loc for loc in range(4)})
    pairs = {name: (target, source) for name in (names or ["w"])}
    path.write_text(json.dumps(dump_maps(MapsBatch(pairs, endpoints, None, dict.fromkeys(pairs, 2)))))
    return path


def _plans(tmp_path: Path, maps: Path) -> Path:
    out = tmp_path / "plans.json"
    assert main(["plan", str(maps), "-o", str(out), "-q"]) == 0
    return out


def test_a_picture_on_standard_output_is_alone_there(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    maps = _maps(tmp_path)
    assert main(["show", str(maps), str(_plans(tmp_path, maps)), "--svg", "-"]) == 0
    out, err = capfd.readouterr()
    xml.dom.minidom.parseString(out)  # before: the table and the oracle's line came first
    assert "oracle: ok" in err and "source process" in err
    assert main(["show", str(maps), "--svg", "-", "--png", "-"]) == 2
    assert "both write to standard output" in capfd.readouterr().err


def test_verify_junit_on_standard_output_is_alone_there(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    maps = _maps(tmp_path)
    plans = _plans(tmp_path, maps)
    capfd.readouterr()
    assert main(["verify", str(maps), str(plans), "--junit", "-"]) == 0
    out, err = capfd.readouterr()
    xml.dom.minidom.parseString(out)
    assert "-> ok" in err
    assert main(["verify", str(maps), str(plans), "--junit", "-", "--json"]) == 2
    assert "both write to standard output" in capfd.readouterr().err


def test_an_unwritable_output_is_refused_before_the_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole corpus ran, then the JUnit file could not be written and the report was dropped."""
    def never(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the run started")

    monkeypatch.setattr(refplan.conformance.runner, "run_conformance", never)
    missing = str(tmp_path / "no-such-folder" / "x.xml")
    assert main(["conformance", "--junit", missing]) == 2
    assert f"cannot write {missing}: No such file or directory" in capfd.readouterr().err
    maps = _maps(tmp_path)
    assert main(["verify", str(maps), str(_plans(tmp_path, maps)), "--junit", missing]) == 2
    assert main(["show", str(maps), "--svg", str(tmp_path)]) == 2
    assert "Is a directory" in capfd.readouterr().err


@pytest.mark.parametrize(("options", "said"), [
    (["--explore", "1", "--junit", "x.xml"], "--junit does nothing with --explore"),
    (["--explore", "1", "--supports", "bogus_key"], "--supports does nothing with --explore"),
    (["--seed", "3"], "--seed does nothing with a corpus run"),
    (["--explore-out", "x.json"], "--explore-out does nothing with a corpus run"),
    (["--markdown", "x.md", "--json"], "--json does nothing with --markdown"),
    (["--timeout", "0"], "--timeout must be above 0"),
    (["--timeout", "nan"], "--timeout must be above 0"),
    (["--json", "--junit", "-"], "both write to standard output"),
])
def test_conformance_options_that_their_mode_ignores_are_bad_input(
    options: list[str], said: str, capfd: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["conformance", *options]) == 2
    err = capfd.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.xml").exists() and not (tmp_path / "x.md").exists()


def test_an_unencodable_message_is_escaped_not_a_traceback(tmp_path: Path) -> None:
    """A planner's message (or a name) may hold a lone surrogate, which UTF-8 cannot encode: the
    table's print died with UnicodeEncodeError."""
    (tmp_path / "surrogate_planner.py").write_text(
        "def plan(doc):\n    raise ValueError('bad \\ud800 name')\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "refplan", "conformance", "--planner", "surrogate_planner:plan",
                           "--case", "rules/R2-a6-shard-ndim-source"], capture_output=True, cwd=tmp_path,
                          timeout=120, check=False, env={"PYTHONIOENCODING": "utf-8", "PATH": "/usr/bin:/bin",
                                                         "PYTHONPATH": str(Path(refplan.__file__).parents[1])})
    assert b"Traceback" not in done.stderr and b"UnicodeEncodeError" not in done.stderr, done.stderr[-800:]
    assert b"bad \\ud800 name" in done.stdout, done.stdout[-800:]


def test_a_tall_picture_draws_a_bounded_height(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from refplan.cli.show import MAX_HEIGHT

    maps = _maps(tmp_path, [f"p{i:03d}" for i in range(300)])
    svg = tmp_path / "pic.svg"
    assert main(["show", str(maps), "--svg", str(svg), "-q"]) == 0
    doc = xml.dom.minidom.parse(str(svg)).documentElement
    assert float(doc.getAttribute("height")) < MAX_HEIGHT + 2000
    assert "more parameters not drawn" in svg.read_text()


def test_bench_refuses_what_would_measure_nothing(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["bench", "--e2e-only", "--no-e2e", "--scenario", "uneven", "--no-peer"]) == 2
    assert "nothing to measure" in capfd.readouterr().err
    assert main(["bench", "--e2e-only", "--scenario", "uneven", "--no-peer", "--repeat", "1"]) == 2
    err = capfd.readouterr().err
    assert "no plain description; left out" in err and "nothing left to measure" in err
    assert main(["bench", "--beta", "1e-300", "--scenario", "uneven"]) == 2
    assert "--beta must be from" in capfd.readouterr().err
    real = refplan.cli.bench.importlib.util.find_spec
    monkeypatch.setattr(refplan.cli.bench.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["bench", "--sync", "--scenario", "uneven", "--no-peer"]) == 2
    assert "--sync needs torch" in capfd.readouterr().err


def test_bench_json_holds_only_finite_numbers() -> None:
    from refplan.cli.bench import _finite

    assert _finite({"a": [1.0, float("inf"), {"b": float("nan")}], "c": 2}) == {"a": [1.0, None, {"b": None}], "c": 2}


def test_verbose_adds_every_parameter(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    plain = capfd.readouterr().out
    assert main(["demo", "-v"]) == 0
    verbose = capfd.readouterr().out
    assert "per parameter:" in verbose and "per parameter:" not in plain
    maps = _maps(tmp_path, ["a", "b"])
    assert main(["show", str(maps), "-v", "--svg", str(tmp_path / "p.svg")]) == 0
    out = capfd.readouterr().out
    assert "  a: " in out and "  b: " in out


def test_a_planners_control_characters_are_escaped_in_the_table(tmp_path: Path) -> None:
    """An ANSI sequence in a planner's message reached the terminal as is (a clear-screen)."""
    (tmp_path / "ansi_planner.py").write_text(
        "def plan(doc):\n    raise ValueError('\\x1b[2J\\x1b[31mred\\x07')\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "refplan", "conformance", "--planner", "ansi_planner:plan",
                           "--case", "rules/R2-a6-shard-ndim-source"], capture_output=True, cwd=tmp_path,
                          timeout=120, check=False, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(refplan.__file__).parents[1])})
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout, done.stdout
    assert "\\x1b[2J\\x1b[31mred\\x07" in done.stdout, done.stdout


def test_a_cmd_planner_that_floods_stdout_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 MB on stdout held about 1 GB of the runner's memory; past the cap the command is stopped
    and the case is its error (here a 1 MiB cap and an endless writer, so the test is quick)."""
    import refplan.conformance.adapters as adapters
    from refplan.conformance import run_conformance
    from refplan.conformance.corpus import load_cases

    monkeypatch.setattr(adapters, "MAX_ANSWER_BYTES", 1 << 20)
    case = [c for c in load_cases() if c.id == "rules/R2-a6-shard-ndim-source"]
    report = run_conformance("cmd:yes refplan", case, timeout=60)
    (result,) = report.results
    assert result.verdict == "error" and "wrote more than 1 MiB on stdout" in result.reason, result


def test_the_escape_handler_is_set_only_for_a_strict_stream_and_restored() -> None:
    """Under a C locale stdout's handler is ``surrogateescape`` (a file name's undecodable bytes
    written back as they were): it was replaced by ``backslashreplace`` and left so after an
    in-process ``main()`` (a review of the change)."""
    import io

    from refplan._progress import escaping_unencodable

    strict = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    escaped = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = strict, escaped
    try:
        with escaping_unencodable():
            assert sys.stdout.errors == "backslashreplace" and sys.stderr.errors == "surrogateescape"
            print("bad \ud800 name")
        assert sys.stdout.errors == "strict" and sys.stderr.errors == "surrogateescape"
    finally:
        sys.stdout, sys.stderr = saved
    strict.flush()
    assert b"bad \\ud800 name" in strict.buffer.getvalue()  # type: ignore[attr-defined]


def test_the_runner_module_escapes_as_the_command_does(tmp_path: Path) -> None:
    (tmp_path / "surrogate_planner.py").write_text(
        "def plan(doc):\n    raise ValueError('bad \\ud800 name')\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "refplan.conformance.runner", "--planner", "surrogate_planner:plan",
                           "--case", "rules/R2-a6-shard-ndim-source"], capture_output=True, cwd=tmp_path,
                          timeout=120, check=False, env={"PYTHONIOENCODING": "utf-8", "PATH": "/usr/bin:/bin",
                                                         "PYTHONPATH": str(Path(refplan.__file__).parents[1])})
    assert b"Traceback" not in done.stderr, done.stderr[-800:]


def test_a_markdown_document_on_standard_output_is_alone_there(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--markdown", "-", "--case", "rules/R2-a6-shard-ndim-source"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith("# Conformance") and "refplan: 1 passed" not in out and "refplan: 1 passed" in err
    assert main(["conformance", "--explore", "1", "--explore-out", "-", "--json"]) == 2
    assert "--explore-out - and --json both write" in capfd.readouterr().err
