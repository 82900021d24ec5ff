"""CrossHair over the box algebra and the answer checker, plus a planted bug it must find.

CrossHair is a bug finder, not a prover: exit 0 means no counterexample was found within the
time limits ("not confirmed" is not a failure), so a clean run is evidence, not proof. Each run is
a subprocess in the CI form ``crosshair check --per_condition_timeout=N --per_path_timeout=M
MODULE`` under a hard timeout, and fails on any ``error:`` line (a counterexample, or a contract
CrossHair could not even parse).

- ``refplan.box``: volume, strides, intersection, overlap, containment, subtraction and splitting
  against their docstring contracts, bounded to at most 2 axes. With that bound CrossHair
  exhausts every path of every condition ("Confirmed over all paths", in about 25 s of CPU), so
  the test demands exactly that for every ``post:`` line of ``box.py``: for ≤ 2 axes this is a
  proof over all integers, not a search. (Planted mutants of subtract, intersect, contains and
  overlaps were each reported as counterexamples at 4 s per condition.)
- ``refplan.contracts``: ``tiles_exactly`` calls the real ``check_answers`` and must agree with a
  point-by-point count of coverage on small boxes (20 s: the budget at which the planted bug
  below is found reliably; at 5 s it was missed in earlier measurements).
- The planted bug: a copy of the split checks without the disjointness test, with the same
  contract, in a temporary module. CrossHair must report a counterexample (two copies of one
  part whose volumes add up to the box), which shows the contract has teeth.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("crosshair")

ROOT = Path(__file__).resolve().parent.parent


def _crosshair(target: str, per_condition: int, per_path: int, hard_timeout: int, extra_path: Path | None = None,
               report_all: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path is not None else [])
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [
        sys.executable, "-m", "crosshair", "check",
        f"--per_condition_timeout={per_condition}", f"--per_path_timeout={per_path}", target,
    ]
    if report_all:
        command.insert(-1, "--report_all")
    try:
        return subprocess.run(
            command, cwd=extra_path or ROOT, env=env, capture_output=True, text=True, timeout=hard_timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"crosshair on {target} ran past its hard timeout of {hard_timeout} s: {exc.output!r}")


def _errors(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if "error:" in line]


@pytest.mark.timeout(150)
def test_box_contracts_are_confirmed_over_all_paths() -> None:
    result = _crosshair("refplan.box", per_condition=10, per_path=2, hard_timeout=120, report_all=True)
    assert not _errors(result), "\n".join(_errors(result))
    assert result.returncode == 0, result.stdout + result.stderr
    source = (ROOT / "refplan" / "box.py").read_text().splitlines()
    conditions = {n for n, line in enumerate(source, 1) if line.strip().startswith("post:")}
    confirmed = {
        int(m.group(1)) for m in re.finditer(r"box\.py:(\d+): info: Confirmed over all paths", result.stdout)
    }
    assert conditions, "box.py lost its contracts"
    assert confirmed == conditions, f"not confirmed over all paths: {sorted(conditions - confirmed)}\n{result.stdout}"


@pytest.mark.timeout(150)
def test_checker_contract_has_no_counterexample() -> None:
    result = _crosshair("refplan.contracts", per_condition=20, per_path=4, hard_timeout=120)
    assert not _errors(result), "\n".join(_errors(result))
    assert result.returncode == 0, result.stdout + result.stderr


def _contract_lines() -> str:
    """The ``pre:``/``post:`` lines of the real ``tiles_exactly``, so the planted copy has the same."""
    from refplan.contracts import tiles_exactly

    doc = tiles_exactly.__doc__ or ""
    lines = [line.strip() for line in doc.splitlines() if line.strip().startswith(("pre:", "post:"))]
    assert any(line.startswith("post:") for line in lines)
    return "\n".join(lines)


PLANTED = '''
from collections.abc import Sequence

from refplan.box import Box
from refplan.contracts import covered_exactly_once


def tiles_exactly(box: Box, parts: Sequence[Box]) -> bool:
    """The split checks of check_answers with the disjointness test left out.

{contract}
    """
    total = 0
    for p in parts:
        if len(p.origin) != box.ndim or len(p.extent) != box.ndim:
            return False
        if any(e <= 0 for e in p.extent):
            return False
        if not box.contains(p):
            return False
        total += p.volume
    return total == box.volume
'''


@pytest.mark.timeout(150)
def test_crosshair_finds_a_checker_without_its_disjointness_test(tmp_path: Path) -> None:
    source = PLANTED.format(contract=textwrap.indent(_contract_lines(), "    "))
    (tmp_path / "planted_checker.py").write_text(source)
    result = _crosshair("planted_checker", per_condition=20, per_path=4, hard_timeout=120, extra_path=tmp_path)
    errors = _errors(result)
    assert result.returncode != 0 and errors, f"crosshair missed the planted bug:\n{result.stdout}{result.stderr}"
    assert any("false when calling tiles_exactly" in line for line in errors), "\n".join(errors)
