"""``python -m refplan``: the ``refplan`` command, for environments without its script on PATH."""

from __future__ import annotations

import sys

try:
    from .cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C while importing, before ``main`` can say it in its one line
    print("refplan: interrupted", file=sys.stderr)
    code = 130
sys.exit(code)
