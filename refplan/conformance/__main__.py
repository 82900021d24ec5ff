"""``python -m refplan.conformance``: the same as ``refplan conformance``."""

from __future__ import annotations

import sys

from .runner import main

sys.exit(main())
