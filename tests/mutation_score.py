"""Print the mutation score of each mutated module after ``mutmut run`` (``make mutation``).

mutmut 3 keeps, per mutated source file, a ``mutants/<path>.meta`` JSON file with the exit code
of the test run of every mutant. A mutant counts as killed when its tests failed (exit codes 1
and 3, or a kill signal) or ran past mutmut's time limit (a mutant that makes the code loop is
caught, just not by an assertion); survived, "no tests" (no selected test reaches the function),
crashes and anything not checked count against the score. Files without mutants are not listed.

Usage: ``python tests/mutation_score.py [--fail-under PERCENT] [--survivors]``; exits 1 when a
module scores under ``--fail-under``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KILLED = {1, 3, -24, 24, 36, 152, 255}


def scores(root: Path) -> dict[str, tuple[int, int, list[str]]]:
    """Per module: (killed, total, surviving mutant names)."""
    out: dict[str, tuple[int, int, list[str]]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        if not codes:
            continue
        module = str(meta.relative_to(root)).removesuffix(".meta")
        killed = sum(1 for code in codes.values() if code in KILLED)
        survivors = sorted(name for name, code in codes.items() if code not in KILLED)
        out[module] = (killed, len(codes), survivors)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="mutants", help="mutmut's mutants folder")
    parser.add_argument("--fail-under", type=float, default=0.0, help="exit 1 if a module scores below this")
    parser.add_argument("--survivors", action="store_true", help="list the surviving mutants too")
    args = parser.parse_args(argv)
    found = scores(Path(args.root))
    if not found:
        print(f"no mutation results under {args.root}/ (run `make mutation`)", file=sys.stderr)
        return 2
    failed = False
    total_killed = total = 0
    for module, (killed, count, survivors) in found.items():
        percent = 100.0 * killed / count
        print(f"{module}: mutation score: {percent:.1f}% ({killed} of {count} mutants killed)")
        if args.survivors:
            for name in survivors:
                print(f"    survived: {name}")
        failed |= percent < args.fail_under
        total_killed += killed
        total += count
    print(f"all: mutation score: {100.0 * total_killed / total:.1f}% ({total_killed} of {total} mutants killed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
