"""One helper shared by the planner and the oracle: pausing the cyclic garbage collector.

It carries no reasoning about maps or plans, so sharing it keeps the oracle independent of the
planner where it matters (validation and judging) while the pause is written once.
"""

from __future__ import annotations

import gc
import sys
import sysconfig
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
    """If the paused block left many new objects alive (a batch of maps or plans), move the young
    generations into the old one now, without scanning them, instead of scanning them twice later.
    ``before``: the young generation's count when the block began (nothing is collected while it
    is paused, so the difference is what the block itself left).

    Why: left alone, the first allocation after the pause scans every object the block made
    (gen 0) and moves them to gen 1, and ten young collections later gen 1 is scanned again, all
    of them still there, before they reach the old generation. Those objects are a batch of maps
    or plans the caller keeps: the scans find nothing to free, and they were 35-40 % of building
    22 458 expert maps of distinct shapes even done as one ``gc.collect(1)``. ``gc.freeze()``
    followed at once by ``gc.unfreeze()`` moves every young object into the old generation as two
    list splices (CPython's own documented behaviour of the pair), so they are scanned only by the
    next full collection, as every long-lived object is; a cycle among them is collected then.
    That includes the few young objects the caller made just before the block (at most a young
    threshold's worth and what the middle generation held): a cycle of theirs is freed at the
    next full collection instead of the next young one.

    The splice is used only where it is exactly that: on CPython with the GIL (a free-threaded
    build walks the heap to freeze) and when nothing is frozen already (``gc.get_freeze_count()``
    is 0, so ``unfreeze`` cannot release a caller's own frozen objects, e.g. a pre-forking
    server's). Otherwise the two young generations are collected together once, ``gc.collect(1)``.
    The count is net (allocations less deallocations of tracked objects), so a block whose objects
    are all freed again (judging plans) leaves it low and costs nothing here, and the block's own
    count decides, so a block that made little never moves what its caller made before it. A
    collector the caller disabled (or set to a threshold of 0) is never touched.
    """
    young = gc.get_threshold()[0]
    if not young or gc.get_count()[0] - before <= PROMOTE_AFTER * young:  # a threshold of 0 turns collection off
        return
    if _SPLICE and gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
    else:
        gc.collect(1)


_SPLICE = sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED")
"""Whether ``gc.freeze``/``gc.unfreeze`` are list splices here (CPython with the GIL)."""
