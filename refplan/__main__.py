"""``python -m refplan``: the ``refplan`` command, for environments without its script on PATH."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
