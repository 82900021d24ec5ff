"""``python -m refplan.cli``: the ``refplan`` command, the same as ``python -m refplan``."""

from __future__ import annotations

import sys

from .main import main

sys.exit(main())
