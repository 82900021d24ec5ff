"""Run the fuzz harnesses: ``python fuzz/run.py <harness|all> --seconds N``.

Engines (``--engine``, default ``auto``):

- ``atheris`` (coverage-guided libFuzzer; used by ``auto`` when ``import atheris`` works): each
  harness runs in a child process with refplan instrumented, its checked-in seeds
  (``fuzz/corpus/<harness>/``) and a work corpus (``fuzz/work/<harness>/``, new units land
  there), ``-max_total_time`` of its share of the time, ``-timeout`` as a hard per-input backstop
  and the JSON dictionary ``fuzz/json.dict``. A crash is saved as
  ``fuzz/artifacts/<harness>/crash-*`` and the harness is restarted for the time left.
- ``hypothesis``: the seeds are replayed, then the harness's structure-aware strategy
  (``fuzz/strategies.py``) is run in chunks of examples until the time is up; a failing input is
  saved the same way.

At the end a table gives, per harness, executions, exec/s, coverage (atheris ``cov``/``ft``) or
distinct outcomes (hypothesis), and findings; it is also written to
``fuzz/artifacts/last-run.json``. Exit status 1 when anything was found.

``--seconds`` is the total for ``all`` (split evenly) and the time of a single harness
otherwise. ``FUZZ_OUT=DIR`` puts ``work/`` and ``artifacts/`` under DIR instead of ``fuzz/``.
``python fuzz/run.py <harness> --replay FILE...`` re-runs saved inputs with a full traceback;
``--replay-corpus`` replays every seed and exits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FUZZ_DIR = Path(__file__).resolve().parent
ROOT = FUZZ_DIR.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CORPUS = FUZZ_DIR / "corpus"
WORK = Path(os.environ.get("FUZZ_OUT", FUZZ_DIR)) / "work"
ARTIFACTS = Path(os.environ.get("FUZZ_OUT", FUZZ_DIR)) / "artifacts"
DICT = FUZZ_DIR / "json.dict"
MAX_FINDINGS = 3


@dataclass
class Stats:
    harness: str
    engine: str
    seconds: float = 0.0
    executions: int = 0
    coverage: str = ""
    outcomes: dict[str, int] = field(default_factory=dict)
    findings: list[dict[str, str]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.executions / self.seconds if self.seconds else 0.0


def _atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def _save(harness: str, data: bytes, why: str) -> Path:
    folder = ARTIFACTS / harness
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"crash-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    path.with_suffix(".txt").write_text(why, encoding="utf-8")
    return path


def _seeds(harness: str) -> list[Path]:
    folder = CORPUS / harness
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


# ---------------------------------------------------------------------------------------------
# hypothesis engine


def replay_seeds(harness: str, stats: Stats, *, work: bool = False) -> None:
    """Run every seed (and, with ``work``, every unit atheris added to the work corpus)."""
    from fuzz.harnesses import HARNESSES

    one_input = HARNESSES[harness].one_input
    paths = _seeds(harness)
    if work and (WORK / harness).is_dir():
        paths += sorted(p for p in (WORK / harness).iterdir() if p.is_file())
    for path in paths:
        data = path.read_bytes()
        stats.executions += 1
        try:
            label = one_input(data)
        except Exception as exc:
            stats.findings.append({"input": str(path), "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        stats.outcomes[label] = stats.outcomes.get(label, 0) + 1


def line_coverage(run: Callable[[], None]) -> dict[str, tuple[int, int]]:
    """Lines of each refplan module executed by ``run()``, against its executable lines.

    ``sys.settrace`` based (the ``coverage`` package is not a dependency); slow, so it is only
    used to measure what a corpus reaches (``--replay-corpus --coverage``).
    """
    import refplan

    root = str(Path(refplan.__file__).resolve().parent)
    hit: dict[str, set[int]] = {}

    def tracer(frame: Any, event: str, _arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if not filename.startswith(root):
            return None
        lines = hit.setdefault(filename, set())

        def local(frame: Any, event: str, _arg: Any) -> Any:
            if event == "line":
                lines.add(frame.f_lineno)
            return local

        lines.add(frame.f_lineno)
        return local

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    out: dict[str, tuple[int, int]] = {}
    for filename, lines in sorted(hit.items()):
        code = compile(Path(filename).read_text(encoding="utf-8"), filename, "exec")
        executable: set[int] = set()
        stack = [code]
        while stack:
            c = stack.pop()
            executable.update(line for _, _, line in c.co_lines() if line is not None)
            stack.extend(k for k in c.co_consts if hasattr(k, "co_lines"))
        out[str(Path(filename).relative_to(root))] = (len(lines & executable), len(executable))
    return out


def run_hypothesis(
    harness: str, seconds: float, *, shrink: bool = False, database: Any = None, chunk: int = 50,
    derandomize: bool = False, max_examples: int | None = None,
) -> Stats:
    """Replay the seeds, then run the harness's strategy for ``seconds`` (or ``max_examples``)."""
    from hypothesis import HealthCheck, Phase, given, settings

    from fuzz.harnesses import HARNESSES
    from fuzz.strategies import STRATEGIES

    stats = Stats(harness, "hypothesis")
    start = time.monotonic()
    replay_seeds(harness, stats)
    one_input = HARNESSES[harness].one_input
    outcomes: Counter[str] = Counter(stats.outcomes)
    last: list[bytes] = [b""]

    def body(data: bytes) -> None:
        last[0] = data
        stats.executions += 1
        outcomes[one_input(data)] += 1

    phases = (Phase.generate, Phase.shrink) if shrink else (Phase.generate,)
    deadline = start + seconds
    done = repeats = found = 0
    while time.monotonic() < deadline and found < MAX_FINDINGS:
        # A derandomized run is one batch (repeating it would replay the same examples).
        n = (max_examples or chunk) if derandomize else min(chunk, (max_examples or chunk + done) - done)
        if n <= 0:
            break
        test: Callable[[], None] = settings(
            max_examples=n, deadline=None, database=database, derandomize=derandomize, phases=phases,
            suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False,
        )(given(STRATEGIES[harness]())(body))  # type: ignore[no-untyped-call]
        try:
            test()
        except Exception as exc:  # a Finding (or a crash) on the input last seen
            error = f"{type(exc).__name__}: {exc}"[:500]
            if _signature(error) in {_signature(f["error"]) for f in stats.findings}:
                repeats += 1  # the same bug again: keep fuzzing for others
                if repeats >= MAX_FINDINGS * 3:
                    break
            else:
                path = _save(harness, last[0], "".join(traceback.format_exception(exc)))
                stats.findings.append({"input": str(path), "error": error})
                found += 1
        done += n
        if derandomize:
            break
    stats.seconds = time.monotonic() - start
    stats.outcomes = dict(outcomes)
    stats.coverage = f"{len(outcomes)} distinct outcomes"
    return stats


# ---------------------------------------------------------------------------------------------
# atheris engine


def atheris_worker(harness: str, libfuzzer_args: list[str]) -> None:  # pragma: no cover - child process
    import atheris

    # Every refplan module the harnesses reach is imported (and so instrumented) here, first.
    with atheris.instrument_imports(include=["refplan"]):
        from fuzz.harnesses import HARNESSES
    from fuzz.guard import LIMITS

    LIMITS.use_alarm = False  # libFuzzer owns SIGALRM (-timeout); the guard times calls itself
    one_input = HARNESSES[harness].one_input

    def test_one_input(data: bytes) -> None:
        one_input(data)

    atheris.Setup([sys.argv[0], *libfuzzer_args], test_one_input)
    atheris.Fuzz()


_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)")
_EXECUTED = re.compile(r"stat::number_of_executed_units: (\d+)")
_WRITTEN = re.compile(r"Test unit written to (\S+)")


def run_atheris(harness: str, seconds: float, timeout: int = 10) -> Stats:
    from fuzz.harnesses import HARNESSES

    stats = Stats(harness, "atheris")
    work = WORK / harness
    work.mkdir(parents=True, exist_ok=True)
    artifacts = ARTIFACTS / harness
    artifacts.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    cov = ft = 0
    while len(stats.findings) < MAX_FINDINGS:
        left = int(seconds - (time.monotonic() - start))
        if left < 1:
            break
        args = [
            f"-max_total_time={left}", f"-timeout={timeout}", "-rss_limit_mb=2048",
            f"-max_len={HARNESSES[harness].max_len}", f"-artifact_prefix={artifacts}/", "-print_final_stats=1",
            f"-dict={DICT}", str(work), str(CORPUS / harness),
        ]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--atheris-worker", harness, "--", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", cwd=ROOT)
        log = proc.stderr + proc.stdout
        (artifacts / "last.log").write_text(log[-200_000:], encoding="utf-8")
        status = _STATUS.findall(log)
        if status:
            cov, ft = max(cov, int(status[-1][1])), max(ft, int(status[-1][2]))
        executed = _EXECUTED.findall(log)
        stats.executions += int(executed[-1]) if executed else (int(status[-1][0]) if status else 0)
        if proc.returncode != 0:
            written = _WRITTEN.findall(log)
            tail = log[-3000:]
            (artifacts / "last-failure.log").write_text(log[-200_000:], encoding="utf-8")
            path = written[-1] if written else "(no unit written)"
            if written:
                Path(path).with_suffix(".txt").write_text(tail, encoding="utf-8")
            stats.findings.append({"input": path, "error": f"exit {proc.returncode}: " + _summary(log)})
    stats.seconds = time.monotonic() - start
    stats.coverage = f"cov {cov} ft {ft}"
    return stats


def _signature(error: str) -> str:
    """An error message with numbers and quoted values blanked, to tell distinct bugs apart."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", error)[:160]


def _summary(log: str) -> str:
    for marker in ("Finding: ", "Error: ", "Exception: ", "ERROR: libFuzzer: "):
        lines = [ln for ln in log.splitlines() if marker in ln]
        if lines:
            return lines[-1].strip()[:400]
    return log.strip().splitlines()[-1][:400] if log.strip() else "no output"


# ---------------------------------------------------------------------------------------------
# CLI


def _replay_files(harness: str, files: list[str]) -> int:
    from fuzz.harnesses import HARNESSES

    bad = 0
    for name in files:
        data = Path(name).read_bytes()
        try:
            print(f"{name}: {HARNESSES[harness].one_input(data)}")
        except Exception:
            bad += 1
            print(f"{name}: FAILED")
            traceback.print_exc()
    return 1 if bad else 0


def _table(results: list[Stats]) -> str:
    rows = [("harness", "engine", "seconds", "executions", "exec/s", "coverage", "findings")]
    for s in results:
        rows.append((s.harness, s.engine, f"{s.seconds:.0f}", str(s.executions), f"{s.rate:.0f}", s.coverage,
                     str(len(s.findings))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for s in results:
        for f in s.findings:
            lines.append(f"FINDING {s.harness}: {f['input']}\n    {f['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--atheris-worker"]:
        harness = argv[1]
        rest = argv[3:] if argv[2:3] == ["--"] else argv[2:]
        atheris_worker(harness, rest)
        return 0
    from fuzz.harnesses import HARNESSES

    parser = argparse.ArgumentParser(prog="fuzz/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("harness", choices=[*HARNESSES, "all"])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", "180")),
                        help="total for 'all' (split evenly), else this harness's time (default $FUZZ_SECONDS or 180)")
    parser.add_argument("--engine", choices=["auto", "atheris", "hypothesis"], default="auto")
    parser.add_argument("--shrink", action="store_true", help="hypothesis engine: shrink failing inputs")
    parser.add_argument("--replay", nargs="+", metavar="FILE", help="re-run saved inputs with a traceback")
    parser.add_argument("--replay-corpus", action="store_true",
                        help="replay the seed corpus and the atheris work corpus, then exit")
    parser.add_argument("--coverage", action="store_true", help="with --replay-corpus: refplan line coverage")
    args = parser.parse_args(argv)
    names = list(HARNESSES) if args.harness == "all" else [args.harness]
    if args.replay:
        if len(names) != 1:
            parser.error("--replay needs one harness")
        return _replay_files(names[0], args.replay)
    if args.replay_corpus:
        results = []

        def replay_all() -> None:
            for name in names:
                stats = Stats(name, "replay")
                start = time.monotonic()
                replay_seeds(name, stats, work=True)
                stats.seconds = time.monotonic() - start
                stats.coverage = f"{len(stats.outcomes)} distinct outcomes"
                results.append(stats)

        if args.coverage:
            cover = line_coverage(replay_all)
            for module, (hit, total) in cover.items():
                print(f"{module:24} {hit:5}/{total:<5} lines {100 * hit / max(total, 1):5.1f}%")
            hit = sum(h for h, _ in cover.values())
            total = sum(t for _, t in cover.values())
            print(f"{'refplan (reached)':24} {hit:5}/{total:<5} lines {100 * hit / max(total, 1):5.1f}%")
        else:
            replay_all()
        print(_table(results))
        return 1 if any(s.findings for s in results) else 0
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if _atheris_available() else "hypothesis"
    share = args.seconds / len(names) if args.harness == "all" else args.seconds
    results = []
    for name in names:
        print(f"fuzz: {name} with {engine} for {share:.0f} s", file=sys.stderr, flush=True)
        if engine == "atheris":
            stats = run_atheris(name, share)
        else:
            from hypothesis.database import DirectoryBasedExampleDatabase

            db = DirectoryBasedExampleDatabase(str(WORK / "hypothesis-db"))
            stats = run_hypothesis(name, share, shrink=args.shrink, database=db)
        results.append(stats)
        print(f"fuzz: {name}: {stats.executions} executions, {stats.coverage}, {len(stats.findings)} finding(s)",
              file=sys.stderr, flush=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "last-run.json").write_text(
        json.dumps([{**asdict(s), "rate": s.rate} for s in results], indent=2), encoding="utf-8"
    )
    print(_table(results))
    return 1 if any(s.findings for s in results) else 0


if __name__ == "__main__":
    sys.exit(main())
