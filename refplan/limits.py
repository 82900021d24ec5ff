"""Every limit and tuning number of the library, in one place.

Two kinds live here, kept apart on purpose:

- **Budgets** (``PlanBudget``): policy limits a caller sets. Exhausting one refuses the whole plan.
  They change what the library answers (a plan or a refusal), so they are part of the API.
- **Fast-path thresholds**: sizes from which a module takes an array (numpy) or memoized path
  instead of its plain per-item loop. Both paths decide the same; the thresholds only buy speed
  (each is a measured crossover, noted beside it). They are read at call time, as
  ``limits.NAME``, so ``fast_paths(enabled)`` can switch every one of them for a test instead of
  tests monkeypatching globals in five modules.

One check lives here too, ``element_sizes`` (bytes per element against ``MAX_ELEMENT_SIZE``): the
planner and the reports of ``analysis`` both take an ``element_size`` argument, and must accept
and refuse the same values with the same words.

This module imports nothing from the package but ``errors``: the planner, the checker and the
oracle all read it, so it must not pull any of them in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .errors import AffineTransferError, show_int

__all__ = [
    "ARRAY_MIN_PIECES",
    "LEAF",
    "MAX_COORDINATE",
    "MAX_ELEMENT_SIZE",
    "MEMO_MAX_PIECES",
    "ORACLE_ARRAY_SEGMENTS",
    "PAIRWISE_LIMIT",
    "QUIET_SEGMENTS",
    "REMEMBER_PIECES",
    "REMEMBER_SEGMENTS",
    "STREAM_PLANS_BYTES",
    "STREAM_REMEMBER_PLANS",
    "PlanBudget",
    "element_sizes",
    "fast_paths",
]


MAX_ELEMENT_SIZE = 1 << 16
"""The largest element size taken, in bytes per element, by the library (``plan_transfers``) and
by files and ``--element-size`` alike: the widest dtype torch has is 16 bytes, and a size past
this bound is a mistake (10**23 was accepted) that would only turn into absurd byte counts."""


def element_sizes(
    names: list[str], element_size: Mapping[str, int] | int | None
) -> dict[str, int] | None:
    """Bytes per element by parameter name, checked: ``None`` (sizes unknown), or one for each of
    ``names``. One ``int`` is every parameter's size, as one integer is in a maps file
    (``"element_size": 2``): the library takes what the files take. Shared by the planner and
    the reports of ``analysis``, so a size the planner takes the reports take too, and a bad
    one gets the same error from both (``ValueError``/``TypeError`` naming the parameter)."""
    if element_size is None:
        return None
    if type(element_size) is int:  # bool excluded: True is not a byte count
        if element_size <= 0:
            raise ValueError(f"element_size must be positive, got {element_size}")
        if element_size > MAX_ELEMENT_SIZE:
            raise ValueError(f"element_size must be at most {MAX_ELEMENT_SIZE} bytes, got {element_size}")
        return dict.fromkeys(names, element_size)
    if not isinstance(element_size, Mapping):
        raise TypeError(
            f"element_size must be an int (every parameter) or map parameter name -> bytes, "
            f"got {type(element_size).__name__}"
        )
    if type(element_size) is dict:  # the usual case, checked by C loops; any doubt takes the loop
        values: list[Any] = [*map(element_size.get, names)]
        if {*map(type, values)} <= _INT_ONLY and (not values or 0 < min(values) <= max(values) <= MAX_ELEMENT_SIZE):
            return dict(zip(names, values))
    out: dict[str, int] = {}
    for name in names:
        size = element_size.get(name)
        if size is None:
            raise ValueError(f"parameter {name!r}: element_size gives no size for it")
        if type(size) is not int:
            raise TypeError(f"parameter {name!r}: element_size must be an int, got {type(size).__name__}")
        if size <= 0:
            raise ValueError(f"parameter {name!r}: element_size must be positive, got {show_int(size)}")
        if size > MAX_ELEMENT_SIZE:
            raise ValueError(
                f"parameter {name!r}: element_size must be at most {MAX_ELEMENT_SIZE} bytes, got {show_int(size)}"
            )
        out[name] = size
    return out


_INT_ONLY = frozenset([int])  # ``element_sizes``: every value an exact int (bool excluded)


@dataclass(frozen=True)
class PlanBudget:
    """Limits on planning work and plan size: policy, not correctness.

    Exhausting any limit refuses the whole plan (``AffineTransferError`` naming the limit) — a
    truncated plan would silently leave target elements unwritten. Field names are DeepSpeed's;
    the defaults are larger because refplan counts the comparisons it really performs (sort,
    sweep and k-d partition) rather than products of piece counts, so 10⁵ pieces per map fit.
    ``max_parts_per_request`` bounds how finely a policy may split one request.
    """

    max_ndim: int = 8
    max_pieces_per_map: int = 1 << 20
    max_pair_checks: int = 1 << 26
    max_segments: int = 1 << 20
    max_merge_passes: int = 8
    max_plan_bytes: int = 1 << 28
    max_merge_checks: int = 1 << 24
    max_parts_per_request: int = 1024

    def __post_init__(self) -> None:
        """Refuse a budget that is not a non-negative int up front, not deep inside planning."""
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise AffineTransferError(
                    f"PlanBudget.{name} must be a non-negative int, got "
                    f"{(show_int(value) if isinstance(value, int) else str(value))[:40]!r}"
                )


def as_budget(value: object, name: str = "limits") -> PlanBudget:
    """``value`` as a planning budget: ``None`` is the default one, a ``PlanBudget`` itself, and
    anything else a ``TypeError`` naming the argument. Before, a string or a dict ended in a bare
    ``AttributeError`` deep inside planning, and a falsy value (``0``, ``{}``) silently planned with
    the default budget."""
    if value is None:
        return PlanBudget()
    if not isinstance(value, PlanBudget):
        raise TypeError(f"{name} must be a PlanBudget or None, got {type(value).__name__} {str(value)[:40]!r}")
    return value


MIN_TIMEOUT = timedelta(milliseconds=1)
MAX_TIMEOUT = timedelta(days=365)
"""The timeouts the executor accepts (``execute.common._checked_timeout``), and the bounds of every
other timeout the library takes from a user (``refplan sync --timeout``, a ``cmd:`` planner's).
Why a floor: gloo and the store count whole milliseconds, so less is no time at all (every wait
fails at once, and a timed-out gloo wait closes every connection of the group). Why a ceiling:
gloo turns a wait's timeout into an absolute time in nanoseconds of the system clock, which
overflows for a timeout of about 234 years or more (and ``timedelta.max``) — measured here: a wait
of 10^5 days on a finished all-gather never returned, one of ``timedelta.max`` failed at once. A
year is far below that and above any real sync. Here, not in the executor, so that the command
line checks them without importing torch."""


MAX_COORDINATE = 1 << 62
"""Largest logical or shard numel, offset, extent or stride the planner and the oracle reason
about: coordinates travel through int64 numpy arrays, and this bound keeps every sum of two of
them exact. Not a threshold: a correctness bound, which is why ``fast_paths`` leaves it alone."""

LEAF = 32
"""``box``'s k-d partition stops cutting a cell at this many boxes and compares them pairwise.
The leaf size of the partition, not a shortcut (any value decides the same, and small ones only
cost time), so ``fast_paths`` leaves it alone."""

ARRAY_MIN_PIECES = 32
"""``frames`` decodes a location's pieces on arrays (``_common_frames``) from this many on; below
it numpy's fixed cost per call outweighs the per-piece loop (``_common_frame``), which decides
the same (tests/test_fast_paths.py runs both at every size)."""

ORACLE_ARRAY_SEGMENTS = 128
"""The oracle decodes a plan's segments on arrays (``oracle.segments.fast_boxes``) from this many
on: below it numpy's fixed cost per call outweighs the per-segment loop. Both paths decide the
same (the ``fast_path`` tests of tests/test_verify.py run both)."""

QUIET_SEGMENTS = 256
"""``plan.coalesce`` first screens plans with at least this many segments with numpy for groups
where nothing can merge (``_quiet_groups``); smaller ones go straight to the exact loop."""

MEMO_MAX_PIECES = 256
"""``planner`` remembers the validated layout of maps with at most this many pieces within one
batch (see ``planner._content_key``); larger maps are validated afresh."""

SMALL_MAP_PIECES = 64
"""``frames.normalize`` validates a map of at most this many pieces in one pure-Python pass
(``frames._small_normalize``) when it is plainly valid; below it numpy's set-up costs more than
the work. Anything unusual, and every refusal, takes the general path, which decides the same
(tests/test_small_fast_path.py runs both)."""

SLAB_MAP_PIECES = 64
"""``planner._slab_layout`` settles a layout whose maps (at most this many pieces each) are
slabs along one axis without frames, regions or intersection objects; anything else
takes the general path, which decides the same (tests/test_small_fast_path.py runs both)."""

REMEMBER_PIECES = 256
"""The oracle remembers the validated layout of maps with at most this many pieces within one
``verify_plans`` batch (``oracle.layout.validated``), and its reading of them for the quick
judgement (``oracle.judge._quick``)."""

REMEMBER_SEGMENTS = 64
"""Within one ``verify_plans`` batch the oracle reuses the verdict of a plan with at most this many
segments for a later parameter whose layouts and segments are identical (``oracle.judge``); longer
plans are judged afresh, so that the remembered keys stay small next to the plans themselves —
unless a later plan holds the very same segments tuple object (``oracle.judge.Twins``: reuse by
identity builds no key, so no length bound applies; off, with the rest, below zero)."""

PAIRWISE_LIMIT = 8
"""``check.check_answers`` compares at most this many parts of one answer pairwise; for more,
one ``box.covers`` query decides whether they are disjoint."""

STREAM_PLANS_BYTES = 256 << 20
"""``refplan verify`` reads a plans file of at least this many bytes one parameter at a time
(``formats.PlansStream``, ``oracle.stream.verify_stream``) instead of as one document, and says
so on stderr. Loaded whole, a plan costs about 1.1 KB of Python objects per segment (JSON dicts,
then ``TransferSegment`` objects), so a 256 MiB file (about 3.5·10⁶ segments) needs ~3.6 GB;
streamed, memory follows the largest parameter instead of the file (docs/performance.md). Both paths give the same
verdicts, report and exit code (tests/test_verify_stream.py). Not one of the ``fast_paths``
switches: it changes memory, not speed, and the streamed path prints one more line."""

STREAM_REMEMBER_PLANS = 1024
"""The streamed ``refplan verify`` (``oracle.stream.verify_stream``) forgets the verdicts it keeps
for reuse (``REMEMBER_SEGMENTS``) once this many distinct plans are remembered, so that a file of
distinct small plans does not hold a key per segment (at most 1024 × 64 segment keys, ~20 MB);
a model's few dozen distinct layouts stay well below it."""

_SWITCHES = ("ARRAY_MIN_PIECES", "ORACLE_ARRAY_SEGMENTS", "QUIET_SEGMENTS", "MEMO_MAX_PIECES",
             "REMEMBER_PIECES", "REMEMBER_SEGMENTS", "PAIRWISE_LIMIT", "SMALL_MAP_PIECES",
             "SLAB_MAP_PIECES")
_ALWAYS = 1 << 62  # a count no input reaches
_ON: dict[str, int] = {
    # Taken at any size: thresholds of the "from this many on" kind go to 0 or 1, limits of the
    # "up to this many" kind to a count no input reaches.
    "ARRAY_MIN_PIECES": 1, "ORACLE_ARRAY_SEGMENTS": 1, "QUIET_SEGMENTS": 0,
    "MEMO_MAX_PIECES": _ALWAYS, "REMEMBER_PIECES": _ALWAYS, "REMEMBER_SEGMENTS": _ALWAYS,
    "PAIRWISE_LIMIT": _ALWAYS, "SMALL_MAP_PIECES": _ALWAYS, "SLAB_MAP_PIECES": _ALWAYS,
}
_OFF: dict[str, int] = {
    # Never taken: the plain loop (or, for the pairwise limit, the k-d query) decides everything.
    "ARRAY_MIN_PIECES": _ALWAYS, "ORACLE_ARRAY_SEGMENTS": _ALWAYS, "QUIET_SEGMENTS": _ALWAYS,
    "MEMO_MAX_PIECES": -1, "REMEMBER_PIECES": -1, "REMEMBER_SEGMENTS": -1, "PAIRWISE_LIMIT": -1,
    "SMALL_MAP_PIECES": -1, "SLAB_MAP_PIECES": -1,
}


@contextmanager
def fast_paths(enabled: bool) -> Iterator[None]:
    """For tests: take every fast path at any size (``True``) or none at all (``False``).

    Why a switch and not per-module monkeypatching: the claim each threshold rests on is "both
    paths decide the same", and a test of that claim should flip all of them the same way, from
    one place, and put them back even when it fails. Not thread-safe (it rebinds module globals);
    tests only.
    """
    import sys

    module = sys.modules[__name__]
    saved = {name: getattr(module, name) for name in _SWITCHES}
    try:
        for name, value in (_ON if enabled else _OFF).items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
