"""The z3 proofs run clean, and ``proofs/theorem3.md`` names only things that exist.

- ``run_all.py`` proves every claim and shows each one non-vacuous (a counterexample once a
  premise is dropped);
- every ``refplan.…`` name in the theorem's table imports, every test file and test function it
  cites exists, and every z3 claim it cites is defined by a script ``run_all.py`` runs;
- the z3 encodings of ``Box.intersect`` and ``Box.subtract`` in ``proofs/boxes.py`` compute what
  ``refplan.box`` computes, on random concrete boxes: the proofs are about the code, not about a
  paraphrase of it.
"""

from __future__ import annotations

import importlib
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from refplan.box import Box

z3 = pytest.importorskip("z3")

ROOT = Path(__file__).resolve().parent.parent
PROOFS = ROOT / "proofs"
DOC = PROOFS / "theorem3.md"


def test_every_claim_is_proved_and_non_vacuous() -> None:
    """The one slow test here (about a minute on 2 cores): ``make proofs`` inside the suite."""
    done = subprocess.run(
        [sys.executable, str(PROOFS / "run_all.py")], cwd=ROOT, capture_output=True, text=True,
        timeout=480, check=False,
    )
    code, out = done.returncode, done.stdout + done.stderr
    lines = out.splitlines()
    assert code == 0, out[-4000:]
    assert not [line for line in lines if line.startswith(("NOT PROVED", "VACUOUS"))], out[-4000:]
    proved = [re.match(r"proved (\S+) \((.*)\) in [0-9.]+ s$", line) for line in lines if line.startswith("proved")]
    assert all(proved), [line for line in lines if line.startswith("proved")]
    names = [m.group(1) for m in proved if m]
    assert len(names) >= 90 and len(set(names)) == len(names)
    for name in names:
        assert any(line.startswith(f"non-vacuous {name}: dropping ") for line in lines), name
    assert re.search(r"^proofs: \d+ claims proved, \d+ non-vacuity counterexamples, all proved", out, re.M)


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_function_the_theorem_names_exists() -> None:
    names = sorted(set(re.findall(r"`(refplan(?:\.\w+)+)`", _doc())))
    assert len(names) >= 15
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, missing


def test_every_test_and_script_the_theorem_cites_exists() -> None:
    doc = _doc()
    cited = set(re.findall(r"`(tests/test_\w+\.py)(?:::(\w+))?`", doc))
    assert cited
    for path, function in sorted(cited):
        assert (ROOT / path).is_file(), path
        if function:
            assert re.search(rf"^\s*def {function}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), (
                f"{path}::{function}"
            )
    for script in set(re.findall(r"`proofs/(\w+\.py)`", doc)):
        assert (PROOFS / script).is_file(), script


SCRIPTS = ("tiling", "slabs", "boxes", "addresses", "coalesce", "answers", "theorem3")


def _import_proofs(*names: str) -> list[Any]:
    sys.path.insert(0, str(PROOFS))
    try:
        return [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(str(PROOFS))


def test_every_claim_the_theorem_cites_exists() -> None:
    """Claim names only (building the formulas is cheap; proving them is the test above)."""
    prefixes = "|".join(SCRIPTS)
    cited = set(re.findall(rf"`((?:{prefixes})\.\w+)(?:\[[^`]*\])?`", _doc()))
    assert cited
    defined = {claim.name.split("[")[0] for module in _import_proofs(*SCRIPTS) for claim in module.claims()}
    assert cited <= defined, sorted(cited - defined)
    run_all = (PROOFS / "run_all.py").read_text(encoding="utf-8")
    assert all(f'"{name}.py"' in run_all for name in SCRIPTS)


# ---------------------------------------------------------------------------------------------
# The encodings in proofs/boxes.py against refplan.box on concrete boxes.


@pytest.fixture(scope="module")
def encodings() -> Any:
    return _import_proofs("kit", "boxes")


def _concrete(kit: Any, name: str, box: Box) -> Any:
    return kit.SymBox(name, box.ndim, [z3.IntVal(v) for v in box.origin], [z3.IntVal(v) for v in box.extent])


def _value(term: Any) -> Any:
    simple = z3.simplify(term)
    if z3.is_true(simple) or z3.is_false(simple):
        return z3.is_true(simple)
    return simple.as_long()


def _to_box(sym: Any) -> Box:
    return Box(tuple(_value(o) for o in sym.origin), tuple(_value(e) for e in sym.extent))


def _random_box(rng: random.Random, ndim: int) -> Box:
    return Box(tuple(rng.randrange(-3, 4) for _ in range(ndim)), tuple(rng.randrange(-1, 5) for _ in range(ndim)))


def test_encodings_compute_what_refplan_box_computes(encodings: Any) -> None:
    kit, boxes = encodings
    rng = random.Random(7)
    for trial in range(300):
        ndim = 1 + trial % 3
        a, b = _random_box(rng, ndim), _random_box(rng, ndim)
        sa, sb = _concrete(kit, "A", a), _concrete(kit, "B", b)
        present, common = boxes.intersect_model(sa, sb)
        expected = a.intersect(b)
        assert (_to_box(common) if _value(present) else None) == expected, (a, b)
        assert _value(boxes.overlaps_model(sa, sb)) == a.overlaps(b), (a, b)
        pieces = [_to_box(s) for guard, s in boxes.subtract_model(sa, sb) if _value(guard)]
        assert pieces == a.subtract(b), (a, b)
