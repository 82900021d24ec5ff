"""``TransferEndpoints``: which process holds each map location, for the source and the target side.

An input data type, not part of the planner's pipeline: the planner binds requests to processes
with it, the executor addresses peers with it, and the file format (``formats``) reads and writes
it. It lives apart from ``requests`` so that reading an endpoints file (or a maps file that has
one) loads no planner module. ``refplan.requests.TransferEndpoints`` is the same class.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidMapError, show_int
from .maps import parse_int_key

__all__ = ["TransferEndpoints"]


@dataclass(frozen=True)
class TransferEndpoints:
    """Location → process, separately for the source map and the target map.

    A source location 0 has no claim to be the process that is target location 0: a trainer
    syncing into a separate engine has disjoint process sets. Values are process ranks in
    whatever rank space the executor is told (global by default).
    """

    source: Mapping[int, int]
    target: Mapping[int, int]

    def __init__(self, source: Mapping[int, int], target: Mapping[int, int]) -> None:
        object.__setattr__(self, "source", _rank_table(source, "source"))
        object.__setattr__(self, "target", _rank_table(target, "target"))

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {
            "source": {str(k): v for k, v in sorted(self.source.items())},
            "target": {str(k): v for k, v in sorted(self.target.items())},
        }

    @classmethod
    def from_dict(cls, entry: Any) -> TransferEndpoints:
        if not isinstance(entry, Mapping) or set(entry) != {"source", "target"}:
            raise InvalidMapError("endpoints: expected {\"source\": {...}, \"target\": {...}}")
        return cls(_int_map(entry["source"], "endpoints.source"), _int_map(entry["target"], "endpoints.target"))


PROCESS_NODE_NEEDS_ENDPOINTS = "process_node needs endpoints: nodes are known per process, not per location"
"""The planner's refusal of a ``process_node`` without endpoints, which every tool that reads one
(``refplan verify``, ``analysis.estimate_sync_time``) repeats in its words."""


def check_endpoints(endpoints: object) -> None:
    """``endpoints`` must be a ``TransferEndpoints`` or ``None``, else ``TypeError``: checked where
    an entry point receives it, not where it is first read (deep inside, as an ``AttributeError``);
    a maps file's ``{"source": ..., "target": ...}`` object is the likely mistake."""
    if endpoints is not None and not isinstance(endpoints, TransferEndpoints):
        raise TypeError(
            f"endpoints must be a TransferEndpoints(source, target) (location -> process on each side) "
            f"or None, got a {type(endpoints).__name__}"
        )


def _rank(value: Any, what: str) -> int:
    """An integer location or process; ``TypeError`` for anything else, ``bool`` included.

    ``int(True)`` is 1, so a bool would silently bind location 1; integer-like values
    (``numpy.int64``) are accepted through ``__index__``, strings and floats are not.
    """
    if isinstance(value, bool):
        raise TypeError(f"TransferEndpoints: {what} is a bool ({value}), not an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"TransferEndpoints: {what} is a {type(value).__name__}, not an integer (TransferEndpoints.from_dict "
            "reads JSON string keys)"
        ) from None


def _rank_table(table: Mapping[int, int], side: str) -> dict[int, int]:
    if not isinstance(table, Mapping):
        raise TypeError(f"TransferEndpoints: {side} must map location -> process, got {type(table).__name__}")
    out: dict[int, int] = {}
    for key, value in table.items():
        location = _rank(key, f"a {side} location")
        out[location] = _rank(value, f"the process of {side} location {show_int(location)}")
    return out


def _int_map(value: Any, where: str) -> dict[int, int]:
    """Location -> process; keys are ints or ASCII decimal strings, each location listed once."""
    if not isinstance(value, Mapping):
        raise InvalidMapError(f"{where}: expected an object of location -> process")
    out: dict[int, int] = {}
    for key, item in value.items():
        parsed = parse_int_key(key)
        if parsed is None:
            raise InvalidMapError(f"{where}: key {str(key)[:40]!r} is not an integer")
        k = parsed
        if k in out:
            raise InvalidMapError(f"{where}: location {k} is listed twice")
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidMapError(f"{where}[{k}]: {str(item)[:40]!r} is not an integer")
        out[k] = item
    return out
