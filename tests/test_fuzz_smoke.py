"""A bounded smoke of every fuzz harness (``fuzz/``), runnable without atheris.

For each harness: its checked-in seed corpus replays clean, then its hypothesis strategy runs a
fixed, derandomized batch of examples (so CI is reproducible) through the same ``one_input`` the
atheris engine uses. The whole file stays well under a minute on two cores.

Longer: ``HYPOTHESIS_PROFILE=nightly`` runs each harness for ``FUZZ_SMOKE_SECONDS`` (default
60 s) with fresh randomness; ``FUZZ_SMOKE_SECONDS``/``FUZZ_SMOKE_EXAMPLES`` override either mode.
A real campaign is ``make fuzz`` (``fuzz/run.py``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz.harnesses import HARNESSES  # noqa: E402
from fuzz.run import CORPUS, Stats, replay_seeds, run_hypothesis  # noqa: E402

NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
SECONDS = float(os.environ.get("FUZZ_SMOKE_SECONDS", "60" if NIGHTLY else "8"))
EXAMPLES = int(os.environ.get("FUZZ_SMOKE_EXAMPLES", "0" if NIGHTLY else "60")) or None


def _report(stats: Stats) -> str:
    return "\n".join(f"{f['input']}: {f['error']}" for f in stats.findings)


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_seed_corpus_replays_clean(harness: str) -> None:
    assert len(list((CORPUS / harness).iterdir())) >= 10, f"fuzz/corpus/{harness} is (nearly) empty"
    stats = Stats(harness, "replay")
    replay_seeds(harness, stats)
    assert not stats.findings, _report(stats)
    assert any(k == "ok" or "exit 0" in k or k == "verdict ok" for k in stats.outcomes), stats.outcomes


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_harness_smoke(harness: str) -> None:
    stats = run_hypothesis(
        harness, SECONDS, shrink=True, database=None, derandomize=not NIGHTLY, max_examples=EXAMPLES
    )
    assert not stats.findings, _report(stats)
    assert stats.executions > len(list((CORPUS / harness).iterdir()))
    assert len(stats.outcomes) >= 3, f"the strategy reaches too few outcomes: {stats.outcomes}"


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris is not installed")
def test_atheris_engine_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "run.py"), "plans_loader", "--engine", "atheris", "--seconds", "3"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "FUZZ_OUT": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "plans_loader  atheris" in proc.stdout
    assert (tmp_path / "artifacts" / "last-run.json").exists()
