"""Run every z3 proof script; exit 0 only if every claim is proved and non-vacuous.

Usage: ``python proofs/run_all.py [--jobs N]`` (``make proofs``). Scripts run as separate
processes, ``--jobs`` at a time (default 2, the CI machine's cores); their output is printed per
script in a fixed order, followed by one summary line. A script that exits non-zero, prints a
``NOT PROVED`` or ``VACUOUS`` line, or runs past ``SCRIPT_TIMEOUT_S`` fails the run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from refplan._progress import Progress

HERE = Path(__file__).resolve().parent

# Longest first, so two workers finish together.
SCRIPTS = ("tiling.py", "slabs.py", "addresses.py", "theorem3.py", "answers.py", "coalesce.py", "boxes.py")
SCRIPT_TIMEOUT_S = 240


def run(script: str) -> tuple[str, int, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / script)], cwd=HERE, capture_output=True, text=True,
            timeout=SCRIPT_TIMEOUT_S, check=False,
        )
        out, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        out, code = partial + f"NOT PROVED {script}: ran past {SCRIPT_TIMEOUT_S} s\n", 124
    return script, code, out, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="scripts run at once (default 2)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line on the terminal")
    args = parser.parse_args()
    start = time.perf_counter()
    results: dict[str, tuple[int, str, float]] = {}
    progress = Progress("proofs", len(SCRIPTS), quiet=args.quiet)  # on a terminal only: z3 runs for minutes
    progress.update(0, "running " + ", ".join(SCRIPTS[: max(1, args.jobs)]))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, code, out, t in pool.map(run, SCRIPTS):
            results[name] = (code, out, t)
            progress.update(len(results), f"{name} done")
    progress.close()
    proved = checked = 0
    failed: list[str] = []
    for name in sorted(results):
        code, out, elapsed = results[name]
        print(f"== {name} ({elapsed:.1f} s)")
        print(out, end="" if out.endswith("\n") else "\n")
        lines = out.splitlines()
        proved += sum(line.startswith("proved ") for line in lines)
        checked += sum(line.startswith("non-vacuous ") for line in lines)
        bad = [line for line in lines if line.startswith(("NOT PROVED", "VACUOUS"))]
        if code != 0 or bad:
            failed.append(f"{name} (exit {code}, {len(bad)} failed claim(s))")
    total = time.perf_counter() - start
    verdict = "all proved" if not failed else "FAILED: " + ", ".join(failed)
    print(f"proofs: {proved} claims proved, {checked} non-vacuity counterexamples, {verdict}, in {total:.1f} s")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
