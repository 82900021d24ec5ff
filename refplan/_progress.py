"""A one-line progress counter on stderr, shown only to a person watching a terminal.

Long commands (``refplan conformance`` with a ``cmd:`` planner, ``refplan sync``, ``make proofs``)
were silent for many seconds before printing anything, which reads as a hang. The counter is
written to stderr, redrawn in place with a carriage return, and erased when the work ends, so
stdout (the report a script parses) never changes. It stays off when stderr is not a terminal
(CI logs, pipes, tests) and with ``-q``: a log full of carriage returns helps nobody.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["Progress", "escaping_unencodable"]

_CLEAR = "\r\x1b[K"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or exotic stream is not a terminal
        return False


class Progress:
    """``label done/total note`` redrawn on one line of ``stream`` (default stderr)."""

    def __init__(self, label: str, total: int | None = None, *, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _is_terminal(self.stream)
        self._shown = False

    def _write(self, text: str) -> None:
        if not self.enabled:
            return
        try:
            self.stream.write(f"{_CLEAR}{text}")
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: progress is never worth a crash
            self.enabled = False
            return
        self._shown = True

    def update(self, done: int, note: str = "") -> None:
        """Show that ``done`` items are finished; ``note`` (e.g. the current case) is cut to fit."""
        count = f"{done}/{self.total}" if self.total is not None else str(done)
        self._write(f"{self.label} {count} {note}"[:78].rstrip())

    def status(self, text: str) -> None:
        """Show ``text`` instead of a count (a phase such as "launching 4 processes")."""
        self._write(f"{self.label}: {text}"[:78])

    def close(self) -> None:
        """Erase the line, so the report that follows starts on a clean line."""
        if self._shown:
            self._write("")
            self._shown = False


@contextlib.contextmanager
def escaping_unencodable() -> Iterator[None]:
    """While a command runs, text its streams cannot encode is printed as escapes, never a
    traceback: a JSON name or a planner's message may hold a lone surrogate (``"\\ud800"``), which
    UTF-8 cannot encode, and ``refplan conformance`` printing its table died with
    ``UnicodeEncodeError`` (an outside probe). Only a stream whose handler is ``strict`` is changed
    (a C locale's ``surrogateescape`` writes a file name's undecodable bytes back as they were),
    and each is restored afterwards, so a caller that runs a command in-process keeps its own."""
    changed: list[tuple[Any, str]] = []
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure) and getattr(stream, "errors", None) == "strict":
            with contextlib.suppress(Exception):  # a replaced stream (a test's capture) keeps its own
                reconfigure(errors="backslashreplace")
                changed.append((stream, "strict"))
    try:
        yield
    finally:
        for stream, errors in changed:
            with contextlib.suppress(Exception):
                stream.reconfigure(errors=errors)
