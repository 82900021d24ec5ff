"""The differential checks of ``proofs/differential.py`` as tests, one per check.

``make proofs`` runs them too (and ``tests/test_proofs.py`` runs ``make proofs``); here each
check is its own test, so a change to the code that breaks what a z3 encoding models fails a
test that names the encoding and prints the first inputs on which code and encoding disagree.
"""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("z3")

PROOFS = Path(__file__).resolve().parent.parent / "proofs"


def _differential() -> Any:
    sys.path.insert(0, str(PROOFS))
    try:
        return importlib.import_module("differential")
    finally:
        sys.path.remove(str(PROOFS))


CHECKS = [make.__name__ for make in _differential().CHECKS]


@pytest.mark.parametrize("check", CHECKS)
def test_encoding_agrees_with_the_code(check: str) -> None:
    differential = _differential()
    make = getattr(differential, check)
    result = make(random.Random(differential.SEED + differential.CHECKS.index(make)))
    assert result.cases > 0
    assert not result.mismatches, result.mismatches[: differential.MAX_SHOWN]
