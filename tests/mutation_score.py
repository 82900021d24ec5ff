"""Print the mutation score of each mutated module after ``mutmut run`` (``make mutation``).

mutmut 3 keeps, per mutated source file, a ``mutants/<path>.meta`` JSON file with the exit code
of the test run of every mutant. A mutant counts as killed when its tests failed (exit codes 1
and 3, or a kill signal) or ran past mutmut's time limit (a mutant that makes the code loop is
caught, just not by an assertion); survived, "no tests" (no selected test reaches the function),
crashes and anything not checked count against the score. Files without mutants are not listed.
``tests/mutation_run.py`` runs mutmut per group of modules in scratch copies under
``mutants/.work/`` and copies each mutated module's ``.meta`` to ``mutants/``; only those count.

Usage: ``python tests/mutation_score.py [--fail-under PERCENT] [--survivors] [--doc FILE]``; exits 1
when a module scores under ``--fail-under``. With ``--doc`` (``docs/mutation.md``) it also lists
the surviving mutants that the document does not argue equivalent, and the document's entries
that no longer survive (a mutant is named there as `` `judge.py:x__cut__mutmut_61` ``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

KILLED = {1, 3, -24, 24, 36, 152, 255}


def scores(root: Path) -> dict[str, tuple[int, int, list[str]]]:
    """Per module: (killed, total, surviving mutant names)."""
    out: dict[str, tuple[int, int, list[str]]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        if ".work" in meta.relative_to(root).parts:  # tests/mutation_run.py's scratch copies
            continue
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
    parser.add_argument("--doc", help="a document arguing the equivalent mutants (docs/mutation.md)")
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
    if args.doc:
        argued = documented(Path(args.doc).read_text(encoding="utf-8"))
        surviving = {short(module, name) for module, (_, _, names) in found.items() for name in names}
        for name in sorted(surviving - argued):
            print(f"not in {args.doc}: {name}")
        for name in sorted(argued - surviving):
            print(f"in {args.doc} but killed (or gone): {name}")
    return 1 if failed else 0


def short(module: str, name: str) -> str:
    """``refplan/oracle/judge.py`` and ``refplan.oracle.judge.x__cut__mutmut_61`` as the document
    names them: ``judge.py:x__cut__mutmut_61``."""
    return f"{Path(module).name}:{name.rsplit('.', 1)[-1]}"


def documented(text: str) -> set[str]:
    """The mutants a document names, as `` `judge.py:x__cut__mutmut_61` ``."""
    return set(re.findall(r"`(\w+\.py:x\S*?__mutmut_\d+)`", text))


if __name__ == "__main__":
    sys.exit(main())
