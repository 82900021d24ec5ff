"""One helper shared by the planner and the oracle: pausing the cyclic garbage collector.

It carries no reasoning about maps or plans, so sharing it keeps the oracle independent of the
planner where it matters (validation and judging) while the pause is written once.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block, restoring its state afterwards.

    Planning or judging a 10⁵-piece map allocates millions of small objects (frames, requests,
    segments, boxes), none of which form a reference cycle, so reference counting frees them all;
    with the collector running it re-scans every live object again and again, about a third of
    the time at that scale. Results are unaffected. A collector the caller already disabled stays
    disabled.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
