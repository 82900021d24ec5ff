"""Replay the code mutants in this folder: each must be killed by what its header names.

Usage: ``.venv/bin/python tests/mutants/run.py [NAME.patch ...]`` (default: every ``*.patch``
here, so a new patch is picked up without editing this file).

Each patch is a unified diff relative to the repository root whose first line says what must
catch it: ``# must-fail: test proofs`` (the test suite and ``make proofs``) or ``# must-fail:
test``. ``git apply`` ignores the text before the first ``---`` line. For each patch the working
tree is copied to a scratch directory (what ``git ls-files`` lists: no ``.venv``, no mutmut
``mutants/``, no ``.git``, and not this folder), the patch is applied there (``git apply``, which
works outside a repository), and then, with the scratch copy as working directory and first on
``PYTHONPATH`` (the copy's ``refplan`` is the one imported; this is checked), the project's
``.venv`` python runs ``pytest -x`` on the copy's tests and, when the header names ``proofs``,
``proofs/run_all.py``. A failing test counts only if it fails again when run alone on the
mutated copy and passes alone on an unmutated one (``run_all.py`` likewise must pass unmutated);
any other failing test (flaky under load, or failing in every scratch copy) is deselected and the
suite run again. One
line per mutant: ``KILLED by test``, ``KILLED by proofs`` (``test and proofs`` when both
fail), or ``SURVIVED <target>``; exit 1 if any named target did not fail.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
IGNORED = (".venv", ".git", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache",
           "*.egg-info")
TIMEOUT_S = 1800


def targets(patch: Path) -> list[str]:
    first = patch.read_text(encoding="utf-8").splitlines()[0] if patch.stat().st_size else ""
    match = re.fullmatch(r"#\s*must-fail:\s*(.+)", first.strip())
    if match is None:
        raise SystemExit(f"{patch.name}: the first line must be '# must-fail: test [proofs]', not {first!r}")
    names = match.group(1).split()
    unknown = set(names) - {"test", "proofs"}
    if unknown:
        raise SystemExit(f"{patch.name}: unknown must-fail target(s) {sorted(unknown)}")
    return names


def scratch_copy(into: Path) -> Path:
    """The working tree as git sees it (tracked files and untracked ones it does not ignore, so no
    ``.venv``, no mutmut ``mutants/``, no caches), without ``.git`` and this folder."""
    tree = into / "tree"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=False)
    if listed.returncode == 0:
        mine = HERE.relative_to(ROOT).as_posix() + "/"
        for name in sorted(set(listed.stdout.decode().split("\0")) - {""}):
            source = ROOT / name
            if name.startswith(mine) or not source.is_file():
                continue
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name, follow_symlinks=False)
        return tree

    def ignore(directory: str, names: list[str]) -> set[str]:  # no git: copy all but the known bulk
        skip = set(shutil.ignore_patterns(*IGNORED)(directory, names))
        if Path(directory).resolve() == ROOT:
            skip.add("mutants")
        if Path(directory).resolve() == HERE.parent:
            skip.add(HERE.name)
        return skip

    shutil.copytree(ROOT, tree, ignore=ignore, symlinks=True)
    return tree


def run(command: list[str], tree: Path) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        return 124, f"ran past {TIMEOUT_S} s"
    return done.returncode, done.stdout + done.stderr


PYTEST = [str(PYTHON), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
FIRST_FAILURE = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", re.M)


class Control:
    """An unmutated scratch copy, made once: a failure counts as a kill only if it does not
    happen there too (a test that fails in any scratch copy says nothing about the mutant)."""

    def __init__(self, scratch: Path) -> None:
        self.tree = scratch_copy(scratch)
        self.proofs: tuple[int, str] | None = None

    def test_passes(self, nodeid: str) -> bool:
        return run([*PYTEST, nodeid], self.tree)[0] == 0

    def proofs_pass(self) -> bool:
        if self.proofs is None:
            self.proofs = run([str(PYTHON), "proofs/run_all.py", "-q"], self.tree)
        return self.proofs[0] == 0


def killed_by_tests(tree: Path, control: Control) -> tuple[bool, str]:
    """``pytest -x`` on the mutated copy, run again without each failing test that is no kill."""
    deselected: list[str] = []
    while True:
        code, out = run([*PYTEST, *[f"--deselect={n}" for n in deselected], "tests"], tree)
        if code == 0:
            note = f" (deselected as flaky or failing unmutated too: {', '.join(deselected)})" if deselected else ""
            return False, "the test suite passes" + note
        found = FIRST_FAILURE.search(out)
        if found is None:
            return True, out.strip().splitlines()[-1] if out.strip() else f"pytest exit {code}"
        nodeid = found.group(1)
        # a kill must be reproducible (fails again alone on the mutant: not a test that fails
        # under load) and due to the mutant (passes alone on the unmutated copy)
        if run([*PYTEST, nodeid], tree)[0] != 0 and control.test_passes(nodeid):
            return True, found.group(0)
        deselected.append(nodeid)


def replay(patch: Path, control: Control) -> tuple[bool, str]:
    wanted = targets(patch)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="m") as scratch:  # short: some tests print their paths
        tree = scratch_copy(Path(scratch))
        applied = subprocess.run(["git", "apply", str(patch)], cwd=tree, capture_output=True, text=True, check=False)
        if applied.returncode != 0:
            return False, f"{patch.name}: does not apply: {applied.stderr.strip()}"
        code, where = run([str(PYTHON), "-c", "import refplan; print(refplan.__file__)"], tree)
        if code != 0 or not where.strip().startswith(str(tree)):
            return False, f"{patch.name}: the scratch copy's refplan is not the one imported ({where.strip()})"
        killed: list[str] = []
        details: list[str] = []
        if "test" in wanted:
            kill, detail = killed_by_tests(tree, control)
            if kill:
                killed.append("test")
            details.append(detail)
        if "proofs" in wanted:
            code, out = run([str(PYTHON), "proofs/run_all.py", "-q"], tree)
            bad = [line for line in out.splitlines() if line.startswith(("MISMATCH", "NOT PROVED", "VACUOUS", "TABLE"))]
            if code != 0 and control.proofs_pass():
                killed.append("proofs")
                details.append(bad[0] if bad else out.strip().splitlines()[-1])
            elif code != 0:
                details.append("proofs fail unmutated too: no verdict")
            else:
                details.append("make proofs passes")
    elapsed = time.perf_counter() - start
    survived = [t for t in wanted if t not in killed]
    verdict = f"SURVIVED {' '.join(survived)}" if survived else f"KILLED by {' and '.join(killed)}"
    detail = "; ".join(d[:200] for d in details)
    return not survived, f"{patch.name}: {verdict} ({elapsed:.0f} s): {detail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("patches", nargs="*", help="patch files (names in this folder or paths); default: all")
    args = parser.parse_args()
    patches = [Path(p) if Path(p).exists() else HERE / p for p in args.patches] or sorted(HERE.glob("*.patch"))
    if not patches:
        print("no patches found")
        return 1
    ok = True
    with tempfile.TemporaryDirectory(prefix="c") as scratch:
        control = Control(Path(scratch))
        for patch in patches:
            good, line = replay(patch.resolve(), control)
            ok &= good
            print(line, flush=True)
    print(f"mutants: {len(patches)} replayed, {'every one killed' if ok else 'SOME SURVIVED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
