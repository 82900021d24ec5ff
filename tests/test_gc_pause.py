"""The shared pause of the cyclic collector (``refplan._gc``): state restored, and a block that
leaves many new objects alive has them moved into the old generation at its end, unscanned (or,
where that splice is not available, scanned once as one young collection)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from refplan import _gc
from refplan._gc import PROMOTE_AFTER, cycle_collection_paused


def _collections(during: Any) -> list[int]:
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        during()
    finally:
        gc.callbacks.remove(note)
    return seen


def _in_old_generation(objects: list[Any]) -> bool:
    old = {id(o) for o in gc.get_objects(generation=2)}
    return all(id(o) in old for o in objects)


def test_a_block_that_leaves_many_objects_moves_them_to_the_old_generation_unscanned() -> None:
    kept: list[Any] = []

    def block() -> None:
        with cycle_collection_paused():
            assert not gc.isenabled()
            kept.extend([i] for i in range(PROMOTE_AFTER * gc.get_threshold()[0] * 2))

    assert _gc._SPLICE  # this CPython (with the GIL) takes the splice
    gc.collect()
    assert _collections(block) == []  # nothing scanned: the young generations spliced into the old one
    assert gc.isenabled() and gc.get_count()[0] < gc.get_threshold()[0]
    assert gc.get_freeze_count() == 0  # nothing left frozen
    assert _in_old_generation(kept[:: len(kept) // 50])


def test_without_the_splice_the_young_generations_are_collected_once(monkeypatch: pytest.MonkeyPatch) -> None:
    kept: list[Any] = []

    def block() -> None:
        with cycle_collection_paused():
            kept.extend([i] for i in range(PROMOTE_AFTER * gc.get_threshold()[0] * 2))

    monkeypatch.setattr(_gc, "_SPLICE", False)
    gc.collect()
    assert _collections(block) == [1]  # gen 0 and gen 1 together, once, before the collector resumes
    assert _in_old_generation(kept[:: len(kept) // 50])


def test_a_callers_frozen_objects_stay_frozen() -> None:
    """``unfreeze`` would release a caller's own frozen objects (a pre-forking server's), so with
    any frozen the block's objects are collected into the old generation instead."""
    kept: list[Any] = []
    theirs = [[i] for i in range(100)]

    def block() -> None:
        with cycle_collection_paused():
            kept.extend([i] for i in range(PROMOTE_AFTER * gc.get_threshold()[0] * 2))

    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen >= len(theirs)
        assert _collections(block) == [1]
        assert gc.get_freeze_count() == frozen
        assert _in_old_generation(kept[:: len(kept) // 50])
    finally:
        gc.unfreeze()


def test_a_block_whose_objects_are_freed_collects_nothing() -> None:
    def block() -> None:
        with cycle_collection_paused():
            for i in range(PROMOTE_AFTER * gc.get_threshold()[0] * 2):
                _ = [i]

    gc.collect()
    assert _collections(block) == []
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_is_never_run() -> None:
    kept: list[Any] = []

    def block() -> None:
        with cycle_collection_paused():
            kept.extend([i] for i in range(PROMOTE_AFTER * gc.get_threshold()[0] * 2))

    gc.collect()
    gc.disable()
    try:
        assert _collections(block) == []
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_zero_threshold_turns_the_promotion_off_too() -> None:
    kept: list[Any] = []
    before = gc.get_threshold()

    def block() -> None:
        with cycle_collection_paused():
            kept.extend([i] for i in range(PROMOTE_AFTER * before[0] * 2))

    gc.collect()
    gc.set_threshold(0)
    try:
        assert _collections(block) == []
    finally:
        gc.set_threshold(*before)


def test_a_block_that_made_little_does_not_scan_what_came_before_it() -> None:
    """The block's own net count decides: many young objects made before it are left to the
    collector (the oracle judging plans just made must not pay for scanning them)."""
    from refplan._gc import _promote_survivors

    gc.collect()
    gc.disable()  # so that nothing is collected between the steps below
    try:
        kept = [[i] for i in range(PROMOTE_AFTER * gc.get_threshold()[0] * 2)]  # young, made before the block
        before = gc.get_count()[0]
        small = [[i] for i in range(100)]
        assert _collections(lambda: _promote_survivors(before)) == []
        assert not _in_old_generation(kept[:1]) and not _in_old_generation(small[:1])
        _promote_survivors(0)  # counted from the start: promoted
        assert _in_old_generation(kept[:: len(kept) // 50]) and _in_old_generation(small)
    finally:
        gc.enable()
