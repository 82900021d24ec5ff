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
    before = gc.get_count()[0]
    try:
        yield
    finally:
        _promote_survivors(before)
        gc.enable()


PROMOTE_AFTER = 10
"""How many young-generation thresholds of net new objects a paused block must leave before
``_promote_survivors`` moves them on in one pass."""


def _promote_survivors(before: int) -> None:
    """If the paused block left many new objects alive (a batch of maps or plans), scan them once
    now, collecting the two young generations together, instead of twice later. ``before``: the
    young generation's count when the block began (nothing is collected while it is paused, so
    the difference is what the block itself left).

    Why: left alone, the first allocation after the pause scans every object the block made
    (gen 0) and moves them to gen 1, and ten young collections later gen 1 is scanned again, all
    of them still there, before they reach the old generation. One ``gc.collect(1)`` does what
    those two passes do, in one: 22 458 expert maps of distinct shapes built in 0.71-0.73 s instead
    of 0.86-0.98 (interleaved, one process). The count is net (allocations less deallocations of
    tracked objects), so a block whose objects are all freed again (judging plans) leaves it low
    and costs nothing here, and the block's own count decides, so a block that made little never
    pays for scanning what its caller made before it (the oracle judging plans just made: 1.12x
    the plan's time in one bench run when it did). Nothing is collected that the collector would
    not collect on its own, and a collector the caller disabled (or set to a threshold of 0) is
    never run.
    """
    young = gc.get_threshold()[0]
    if young and gc.get_count()[0] - before > PROMOTE_AFTER * young:  # a threshold of 0 turns collection off
        gc.collect(1)
