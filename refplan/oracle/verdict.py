"""The oracle's answers: ``Verdict`` for one parameter, ``BatchVerdict`` for a batch.

Kept apart from the checks so that a reader of a verdict (the CLI, the conformance runner, a
user's script) needs nothing else of the oracle, and so that the statuses and their order live in
one place.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BatchVerdict", "Status", "TooLarge", "Verdict", "ok_verdict", "unverifiable_internal", "worst"]

Status = Literal["ok", "invalid", "unverifiable", "invalid_map"]

_SEVERITY: dict[str, int] = {"ok": 0, "unverifiable": 1, "invalid": 2, "invalid_map": 3}
_EXIT: dict[str, int] = {"ok": 0, "invalid": 1, "invalid_map": 2, "unverifiable": 3}


@dataclass(frozen=True)
class Verdict:
    """The oracle's answer for one parameter.

    For ``invalid`` the counterexample fields say where: ``target_location`` and
    ``target_offset`` (an element address in that target shard; for a segment that writes outside
    its shard, the offending address), ``logical_coordinate`` (the element of F the target map puts
    there, when there is one), ``segments`` (plan indices involved) and ``reason``. ``map_error``
    is set for ``invalid_map``. ``checked_segments`` counts the segments examined;
    ``fallback_elements`` the elements the element-level fallback expanded.
    """

    status: Status
    parameter: str | None = None
    reason: str = ""
    target_location: int | None = None
    target_offset: int | None = None
    logical_coordinate: tuple[int, ...] | None = None
    segments: tuple[int, ...] = ()
    map_error: str | None = None
    checked_segments: int = 0
    fallback_elements: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def __bool__(self) -> bool:
        """True only for ``ok``. Without it every verdict was a true object (a dataclass is), so
        ``assert verify_plan(...)`` or ``if verify_plans(...):`` passed for an invalid or an
        unverifiable answer: the oracle said "no" and the caller read "yes"."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "parameter": self.parameter,
            "reason": self.reason,
            "target_location": self.target_location,
            "target_offset": self.target_offset,
            "logical_coordinate": None if self.logical_coordinate is None else list(self.logical_coordinate),
            "segments": list(self.segments),
            "map_error": self.map_error,
            "checked_segments": self.checked_segments,
            "fallback_elements": self.fallback_elements,
        }

    def __str__(self) -> str:
        name = f"parameter {self.parameter!r}: " if self.parameter is not None else ""
        where: list[str] = []
        if self.target_location is not None:
            where.append(f"target location {self.target_location}")
        if self.target_offset is not None:
            where.append(f"offset {self.target_offset}")
        if self.logical_coordinate is not None:
            where.append(f"logical {self.logical_coordinate}")
        if self.segments:
            where.append("segment" + ("s " if len(self.segments) > 1 else " ") + ", ".join(map(str, self.segments)))
        at = f" [{'; '.join(where)}]" if where else ""
        detail = self.map_error if self.status == "invalid_map" and self.map_error else self.reason
        return f"{self.status}: {name}{detail}{at}"

    def with_parameter(self, parameter: str | None) -> Verdict:
        """This verdict under ``parameter``'s name, every other field the same.

        A batch names every verdict this way (a remembered one is handed to each parameter that
        shares it), so it copies the fields in one step rather than through the frozen
        constructor's ten ``object.__setattr__`` calls: about a microsecond per parameter."""
        named = _new_verdict(Verdict)
        fields = self.__dict__.copy()
        fields["parameter"] = parameter
        _set_fields(named, "__dict__", fields)
        return named


@dataclass(frozen=True)
class BatchVerdict:
    """Verdicts for a batch of parameters; ``status`` is the worst one
    (``invalid_map`` > ``invalid`` > ``unverifiable`` > ``ok``)."""

    status: Status
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def __bool__(self) -> bool:
        """True only for ``ok``, as ``Verdict``'s: a batch with an invalid or unverifiable parameter
        was a true object."""
        return self.status == "ok"

    @property
    def exit_code(self) -> int:
        """0 ok, 1 invalid, 2 invalid map (bad input), 3 unverifiable."""
        return _EXIT[self.status]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(_SEVERITY, 0)
        for verdict in self.verdicts.values():
            out[verdict.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "counts": self.counts(),
            "parameters": {name: self.verdicts[name].to_dict() for name in sorted(self.verdicts)},
        }

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items() if n)
        # No command name: this is a library value (``refplan verify`` adds its own prefix).
        lines = [f"{len(self.verdicts)} parameter(s): {counts or 'none'} -> {self.status}"]
        for name in sorted(self.verdicts):
            lines.append(f"  {self.verdicts[name]}")
        return "\n".join(lines)


def worst(statuses: Iterable[str]) -> Status:
    """The most severe status (``ok`` for none): a batch is only as good as its worst parameter."""
    found: Status = "ok"
    for status in statuses:
        if _SEVERITY[status] > _SEVERITY[found]:
            found = status  # type: ignore[assignment]
    return found


_new_verdict = object.__new__
_set_fields = object.__setattr__
"""``Verdict.with_parameter``'s allocation and filling: a verdict without running the constructor."""


class TooLarge(Exception):
    """Coordinates beyond ``MAX_COORDINATE``: the oracle cannot reason exactly, so unverifiable."""


@functools.lru_cache(maxsize=256)
def ok_verdict(n_seg: int) -> Verdict:
    """The one ``ok`` answer for a plan of ``n_seg`` segments that needed no element-level fallback:
    the general judgement and the small-plan one (``oracle.small``) both return it, so the two can
    only agree on its text. Remembered per count: a verdict is immutable (frozen, every field an
    immutable value), and a batch of small plans asks for the same few counts again and again."""
    return Verdict(
        "ok",
        reason=(
            f"{n_seg} segment(s) verified: every target element is written exactly once with its own "
            "logical element, read from a source location that holds it"
        ),
        checked_segments=n_seg,
    )


def unverifiable_internal(what: str) -> Verdict:
    """An internal re-check failed (a box query missed a pair, cuts did not add up): the oracle
    says so instead of answering from a computation it no longer trusts."""
    return Verdict("unverifiable", reason=f"internal consistency check failed ({what}); not judged")
