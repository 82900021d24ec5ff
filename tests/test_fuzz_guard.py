"""The fuzz guard's own alarm leaves an outer alarm (pytest-timeout's) running.

``fuzz/guard.py`` bounds each harness call with ``SIGALRM``; it used to reset the interval timer to
0 when done, which silently cancelled pytest-timeout's alarm for the rest of the test, so a hang
after a guarded call would run past ``timeout`` unnoticed.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz import guard  # noqa: E402


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="SIGALRM is main-thread only")
def test_an_outer_alarm_survives_a_guarded_call() -> None:
    fired: list[bool] = []
    before = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        guard.guarded(lambda: None, "a quick call")
        left, _interval = signal.getitimer(signal.ITIMER_REAL)
        assert 3.0 < left <= 5.0, left  # still armed, less the time the call took
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        deadline = time.monotonic() + 2
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
