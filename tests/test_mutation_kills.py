"""Tests that kill mutants of the checker and the oracle which the other suites let survive.

``make mutation`` (mutmut over ``refplan/check.py`` and ``refplan/oracle/``) reported each of
these mutants as surviving; each test below fails on it. The mutants that cannot be killed (the
mutated code behaves the same) are listed with a reason in ``docs/mutation.md``.
"""

from __future__ import annotations
