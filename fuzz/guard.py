"""The property every harness checks around every call into refplan.

``guarded(fn)`` runs ``fn`` and enforces three things:

1. **Only refplan's own errors escape.** ``AffineTransferError`` and its subclasses are the
   documented outcomes of bad input and are returned to the harness; anything else (``TypeError``,
   ``KeyError``, ``RecursionError``, ``MemoryError``, a numpy error...) becomes a ``Finding``.
2. **Every call finishes within a time bound** (``FUZZ_CALL_SECONDS``, default 2 s). With
   ``use_alarm`` a ``SIGALRM`` interrupts a call that runs long (the hypothesis engine); under
   atheris libFuzzer owns ``SIGALRM`` (its ``-timeout`` is the hard backstop), so the elapsed time
   is checked after the call instead.
3. **Peak memory stays bounded independent of declared tensor sizes.** When the input declares
   large tensors (``measure_memory``), ``tracemalloc`` measures the call's peak, which must stay
   under ``FUZZ_CALL_MEMORY_MB`` (default 4 MiB): a planner or oracle that allocated per element
   of a 10^18-element tensor would blow far past it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from refplan.errors import AffineTransferError

__all__ = ["LIMITS", "Finding", "Limits", "Outcome", "declared_large", "guarded", "outcome_label"]

class Finding(AssertionError):
    """A violated harness property: a crash, a hang, a memory blow-up or a wrong answer."""


class _Timeout(BaseException):
    """Raised by the alarm; a ``BaseException`` so no ``except Exception`` in refplan can eat it."""


@dataclass
class Limits:
    seconds: float = float(os.environ.get("FUZZ_CALL_SECONDS", "2"))
    memory_bytes: int = int(float(os.environ.get("FUZZ_CALL_MEMORY_MB", "4")) * (1 << 20))
    use_alarm: bool = True


LIMITS = Limits()
"""Process-wide limits; the atheris worker sets ``use_alarm = False``."""


@dataclass(frozen=True)
class Outcome:
    """What a guarded call did: its value, or the refplan error it raised (never both)."""

    value: Any = None
    error: AffineTransferError | None = None
    seconds: float = 0.0
    peak_bytes: int | None = None


def _on_alarm(_signum: int, _frame: FrameType | None) -> None:
    raise _Timeout()


def guarded(fn: Callable[[], Any], what: str, *, measure_memory: bool = False, limits: Limits = LIMITS) -> Outcome:
    """Run ``fn()`` under the harness property; return its ``Outcome`` or raise ``Finding``."""
    alarm = limits.use_alarm and threading.current_thread() is threading.main_thread()
    previous: Any = None
    outer = (0.0, 0.0)  # an alarm someone else set (pytest-timeout's): restored, less the time used
    if alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        outer = signal.setitimer(signal.ITIMER_REAL, limits.seconds)
    tracing = False
    if measure_memory:
        tracing = not tracemalloc.is_tracing()
        if tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    value: Any = None
    error: AffineTransferError | None = None
    try:
        value = fn()
    except _Timeout:
        raise Finding(f"{what}: did not finish within {limits.seconds:g} s") from None
    except AffineTransferError as exc:
        error = exc
    except Finding:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise Finding(f"{what}: {type(exc).__name__} escaped: {exc!s:.300}") from exc
    finally:
        elapsed = time.perf_counter() - start
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer[0] > 0:  # never cancel the caller's alarm: give it what is left (at least a tick)
                signal.setitimer(signal.ITIMER_REAL, max(outer[0] - elapsed, 0.001), outer[1])
        peak: int | None = None
        if measure_memory:
            peak = tracemalloc.get_traced_memory()[1] - base
            if tracing:
                tracemalloc.stop()
    if elapsed > limits.seconds:
        raise Finding(f"{what}: took {elapsed:.2f} s, above the {limits.seconds:g} s bound")
    if peak is not None and peak > limits.memory_bytes:
        raise Finding(
            f"{what}: peak traced memory {peak / 2**20:.1f} MiB is above the {limits.memory_bytes / 2**20:g} MiB "
            "bound for an input whose declared tensors are large (per-element work?)"
        )
    return Outcome(value, error, elapsed, peak)


def declared_large(doc: Any, threshold: int = 1 << 20, budget: int = 100_000) -> bool:
    """Whether any integer in a parsed JSON document reaches ``threshold`` (a large declared size).

    Large shapes, offsets and strides are where per-element work would show; small ones cannot be
    told apart from per-piece work by a memory bound, so they are not measured. Visits at most
    ``budget`` nodes.
    """
    stack = [doc]
    seen = 0
    while stack and seen < budget:
        node = stack.pop()
        seen += 1
        if isinstance(node, bool):
            continue
        if isinstance(node, int):
            if abs(node) >= threshold:
                return True
        elif isinstance(node, dict):
            stack.extend(node.values())
            stack.extend(k for k in node if isinstance(k, str) and len(k) > 6)
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif isinstance(node, str) and node.strip().lstrip("-").isdigit() and len(node) > 6:
            return True
    return False


def outcome_label(error: BaseException | None) -> str:
    """A coarse label of an outcome (error class + message shape) for run statistics."""
    if error is None:
        return "ok"
    words = [w for w in str(error).replace(":", " ").split() if w.isalpha()][:6]
    return f"{type(error).__name__}: {' '.join(words)}"
