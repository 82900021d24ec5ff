"""Run every z3 proof script and the differential checks; exit 0 only if all of it holds.

Usage: ``python proofs/run_all.py [--jobs N]`` (``make proofs``). Scripts run as separate
processes, ``--jobs`` at a time (default 2, the CI machine's cores); their output is printed per
script in a fixed order, followed by the comparison with ``claims.json`` and one summary line.
The run fails when a script exits non-zero, prints a ``NOT PROVED``, ``VACUOUS`` or ``MISMATCH``
line, runs past ``SCRIPT_TIMEOUT_S``, or does not match ``claims.json``: every pinned claim must be
proved under its name with its bounds and fingerprint, with the same dropped premises, goal
conjuncts (and ``outright`` ones) and probe exemptions, and no other claim may be proved; every
pinned differential check must agree on at least its pinned number of cases. So a script cut to
smaller bounds, a claim that lost a goal conjunct or gained a premise, or a weakened check fails.

``--table`` prints the Markdown table of ``claims.json`` that ``proofs/theorem3.md`` carries
(``tests/test_proofs.py`` holds the two equal). ``--pin`` prints what this run proved in the
``claims.json`` format (models kept from the current file), for a deliberate update of the pins.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from refplan._progress import Progress

HERE = Path(__file__).resolve().parent
CLAIMS = HERE / "claims.json"

# Longest first, so two workers finish together.
SCRIPTS = ("tiling.py", "addresses.py", "differential.py", "slabs.py", "theorem3.py", "coalesce.py", "boxes.py",
           "answers.py")
SCRIPT_TIMEOUT_S = 240

PROVED = re.compile(r"^proved (\S+) \((.*)\) in [0-9.]+ s pins=(\{.*\}) fp=([0-9a-f]+)$")
DROPPED = re.compile(r"^non-vacuous (\S+): dropping (.+) gives counterexample ")
GOAL = re.compile(r'^non-vacuous (\S+): goal "(.+)" (fails without the premises|holds of the encoding)')
UNBOUNDED = re.compile(r"^non-vacuous (\S+): unbounded: \d+ variables each reach \|v\| >= (\d+) under the premises "
                       r"\(\d+ queries\)(?:, fixed by the premises: (.*))?$")
AGREES = re.compile(r"^agrees (\S+) \((.*)\) on (\d+) cases models=(\[.*\]) in [0-9.]+ s$")
FAILED = ("NOT PROVED", "VACUOUS", "MISMATCH")


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


def observed(lines: Iterable[str]) -> dict[str, Any]:
    """What a run established, per claim and per differential check, parsed from its lines."""
    claims: dict[str, dict[str, Any]] = {}
    checks: dict[str, dict[str, Any]] = {}
    for line in lines:
        if m := PROVED.match(line):
            claims[m.group(1)] = {"name": m.group(1), "bounds": json.loads(m.group(3)), "fingerprint": m.group(4),
                                  "dropped": [], "goal": [], "outright": [], "fixed": None, "probe": 0}
        elif (m := DROPPED.match(line)) and m.group(1) in claims:
            claims[m.group(1)]["dropped"].append(m.group(2))
        elif (m := GOAL.match(line)) and m.group(1) in claims:
            claims[m.group(1)]["goal"].append(m.group(2))
            if m.group(3).startswith("holds"):
                claims[m.group(1)]["outright"].append(m.group(2))
        elif (m := UNBOUNDED.match(line)) and m.group(1) in claims:
            claims[m.group(1)]["probe"] = int(m.group(2))
            claims[m.group(1)]["fixed"] = m.group(3).split(", ") if m.group(3) else []
        elif m := AGREES.match(line):
            checks[m.group(1)] = {"name": m.group(1), "cases": int(m.group(3)), "models": json.loads(m.group(4))}
    return {"claims": claims, "checks": checks}


def compare(pinned: dict[str, Any], seen: dict[str, Any]) -> list[str]:
    """Every difference between ``claims.json`` and a run, as ``TABLE MISMATCH`` lines."""
    errors: list[str] = []
    table = {c["name"]: c for c in pinned["claims"]}
    got = seen["claims"]
    for name in sorted(set(table) - set(got)):
        errors.append(f"TABLE MISMATCH {name}: pinned in claims.json but not proved")
    for name in sorted(set(got) - set(table)):
        errors.append(f"TABLE MISMATCH {name}: proved but not pinned in claims.json (pin it: run_all.py --pin)")
    for name in sorted(set(table) & set(got)):
        want, have = table[name], got[name]
        for key in ("bounds", "fingerprint"):
            if want[key] != have[key]:
                errors.append(f"TABLE MISMATCH {name}: {key} {have[key]} where claims.json pins {want[key]}")
        if have["probe"] < pinned["probe"]:
            errors.append(f"TABLE MISMATCH {name}: probed at |v| >= {have['probe']} where claims.json pins "
                          f"{pinned['probe']}")
        for key in ("dropped", "goal", "outright", "fixed"):
            if have[key] is None:
                errors.append(f"TABLE MISMATCH {name}: no hidden-bound probe line")
            elif sorted(want[key]) != sorted(have[key]):
                errors.append(f"TABLE MISMATCH {name}: {key} {sorted(have[key])} where claims.json pins "
                              f"{sorted(want[key])}")
    checks = {c["name"]: c for c in pinned["differential"]}
    for name in sorted(set(checks) - set(seen["checks"])):
        errors.append(f"TABLE MISMATCH {name}: differential check pinned in claims.json did not agree")
    for name in sorted(set(seen["checks"]) - set(checks)):
        errors.append(f"TABLE MISMATCH {name}: differential check not pinned in claims.json")
    for name in sorted(set(checks) & set(seen["checks"])):
        want, have = checks[name], seen["checks"][name]
        if have["cases"] < want["cases"]:
            errors.append(f"TABLE MISMATCH {name}: {have['cases']} cases where claims.json pins at least "
                          f"{want['cases']}")
        if have["models"] != want["models"]:
            errors.append(f"TABLE MISMATCH {name}: checks {have['models']} where claims.json pins {want['models']}")
    covered = {m for c in pinned["differential"] for m in c["models"]}
    for claim in pinned["claims"]:
        for model in claim["models"]:
            if model not in covered:
                errors.append(f"TABLE MISMATCH {claim['name']}: models {model}, which no differential check runs")
    return errors


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CLAIMS.read_text(encoding="utf-8"))
    return data


def _bounds(bounds: dict[str, int]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in bounds.items())


def table(pinned: dict[str, Any]) -> str:
    """The Markdown tables of ``claims.json`` (claims, then differential checks)."""
    rows = ["| claim | bounds | goal conjuncts | models (production code) |", "|---|---|---|---|"]
    for c in pinned["claims"]:
        models = ", ".join(f"`{m}`" for m in c["models"]) or "— (a step of the paper argument, no code)"
        rows.append(f"| `{c['name']}` | {_bounds(c['bounds'])} | {len(c['goal'])} | {models} |")
    rows += ["", "| differential check | production code | cases (at least) |", "|---|---|---|"]
    for c in pinned["differential"]:
        rows.append(f"| `{c['name']}` | {', '.join(f'`{m}`' for m in c['models'])} | {c['cases']} |")
    return "\n".join(rows) + "\n"


def pin(pinned: dict[str, Any], seen: dict[str, Any]) -> dict[str, Any]:
    """``claims.json`` for what a run proved; each claim keeps its family's models."""
    family = {c["name"].split("[")[0]: c["models"] for c in pinned.get("claims", [])}
    claims = []
    for name, c in seen["claims"].items():
        claims.append({"name": name, "bounds": c["bounds"], "models": family.get(name.split("[")[0], []),
                       "goal": c["goal"], "outright": c["outright"], "dropped": c["dropped"],
                       "fixed": c["fixed"] or [], "fingerprint": c["fingerprint"]})
    checks = [{"name": n, "models": c["models"], "cases": c["cases"]} for n, c in seen["checks"].items()]
    return {**{k: v for k, v in pinned.items() if k not in ("claims", "differential")},
            "claims": claims, "differential": checks}


def dumps(pinned: dict[str, Any]) -> str:
    """``claims.json``'s layout: one claim or check per line, so a diff shows what changed."""
    head = {k: v for k, v in pinned.items() if k not in ("claims", "differential")}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    for key in ("claims", "differential"):
        items = [f"  {json.dumps(item, ensure_ascii=False)}" for item in pinned[key]]
        lines.append(f' "{key}": [\n' + ",\n".join(items) + "\n ]" + ("," if key == "claims" else ""))
    return "\n".join(lines) + "\n}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="scripts run at once (default 2)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line on the terminal")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of claims.json and exit")
    parser.add_argument("--pin", action="store_true", help="run, then print this run's claims.json on stdout")
    args = parser.parse_args()
    if args.table:
        print(table(load()), end="")
        return 0
    start = time.perf_counter()
    results: dict[str, tuple[int, str, float]] = {}
    progress = Progress("proofs", len(SCRIPTS), quiet=args.quiet or args.pin)  # on a terminal only
    progress.update(0, "running " + ", ".join(SCRIPTS[: max(1, args.jobs)]))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, code, out, t in pool.map(run, SCRIPTS):
            results[name] = (code, out, t)
            progress.update(len(results), f"{name} done")
    progress.close()
    if args.pin:
        seen = observed(line for _, out, _ in results.values() for line in out.splitlines())
        print(dumps(pin(load() if CLAIMS.exists() else {}, seen)), end="")
        return 0
    proved = checked = agreed = 0
    failed: list[str] = []
    everything: list[str] = []
    for name in sorted(results):
        code, out, elapsed = results[name]
        print(f"== {name} ({elapsed:.1f} s)")
        print(out, end="" if out.endswith("\n") else "\n")
        lines = out.splitlines()
        everything += lines
        proved += sum(line.startswith("proved ") for line in lines)
        checked += sum(line.startswith("non-vacuous ") for line in lines)
        agreed += sum(line.startswith("agrees ") for line in lines)
        bad = [line for line in lines if line.startswith(FAILED)]
        if code != 0 or bad:
            failed.append(f"{name} (exit {code}, {len(bad)} failed claim(s) or check(s))")
    pinned = load()
    errors = compare(pinned, observed(everything))
    print("== claims.json")
    for line in errors:
        print(line)
    if errors:
        failed.append(f"claims.json ({len(errors)} difference(s))")
    else:
        print(f"claims table: {len(pinned['claims'])} claims and {len(pinned['differential'])} differential checks "
              "match proofs/claims.json")
    total = time.perf_counter() - start
    verdict = "all proved" if not failed else "FAILED: " + ", ".join(failed)
    print(f"proofs: {proved} claims proved, {checked} non-vacuity results, {agreed} differential checks agree, "
          f"{verdict}, in {total:.1f} s")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
