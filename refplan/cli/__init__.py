"""The ``refplan`` command and the tools beside the library: ``main`` (the command and its
sub-commands ``plan``, ``verify``, ``demo``, ``sync``, ``conformance``, ``show``, ``bench``),
``bench``, ``show``, ``sync``, ``demo`` and ``generate_corpus`` (``python -m
refplan.cli.generate_corpus`` rewrites the conformance corpus).

Nothing in the library core imports this package (``tests/test_layout_rules.py`` holds that):
the core needs only numpy, and a tool may import anything from it. ``refplan.cli.main`` is the
function the console script calls (``refplan = "refplan.cli:main"``); the module it lives in is
``sys.modules["refplan.cli.main"]``, so import names from it with ``from refplan.cli.main import``.
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
