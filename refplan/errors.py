"""Error classes of refplan.

The hierarchy tells a caller what it may do next, which is why there are four classes rather than
one. ``AffineTransferError`` (a ``ValueError``) is the base and also the class of an exhausted
budget: the plan was refused because it would be too large, not because anything is wrong.
``InvalidMapError`` means a map contradicts itself or the other map; a caller must not fall back
to another path, because the map may describe a corrupt checkpoint. ``UnsupportedLayoutError``
means the geometry is legitimate but not expressible as strided box copies (a transpose, a
scale, replicas cut at different boundaries); a caller may rebuild and re-shard instead.
``InvalidReplicaPolicyError`` means a replica policy answered something the exact checks refuse;
``PolicyRaisedError`` (one of those) means the policy itself raised, so that a bug in a policy can
never read as a corrupt map.

Two errors sit outside that family on purpose. ``InputFileError`` (an ``OSError``) is a file that
cannot be read at all: nothing is known about its maps, so it must not read as a map error. Bad
*arguments* (a negative ``min_split_bytes``, a zero ``element_size``, a ``bool`` rank) are plain
``TypeError`` / ``ValueError``: no map or policy is involved, the caller simply called wrongly.

The class names are the same as DeepSpeed's so that the conformance runner can map errors by name.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "AffineTransferError",
    "InputFileError",
    "InvalidMapError",
    "InvalidReplicaPolicyError",
    "PolicyRaisedError",
    "UnsupportedLayoutError",
    "describe_exception",
]


class AffineTransferError(ValueError):
    """Base class; raised as itself when a ``PlanBudget`` limit would be exceeded."""


class InvalidMapError(AffineTransferError):
    """A map is self-contradictory or does not match the other map; never fall back."""


class UnsupportedLayoutError(AffineTransferError):
    """Legitimate geometry that strided box copies cannot express; the caller may rebuild."""


class InvalidReplicaPolicyError(AffineTransferError):
    """A replica policy's answer failed one of the exact checks of ``check_answers``."""


class PolicyRaisedError(InvalidReplicaPolicyError):
    """The replica policy raised instead of answering; ``__cause__`` is what it raised.

    Wrapping matters most when a policy raises one of our own classes: an ``InvalidMapError``
    escaping a policy would tell the caller "corrupt checkpoint, never fall back" about what is
    really a bug in the policy.
    """


class InputFileError(OSError):
    """An input file could not be read (missing, a directory, no permission): not a map error.

    ``str()`` is the whole one-line message (path first); ``errno`` is the operating system's.
    """

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def type_name(value: object) -> str:
    """The name of ``value``'s class, read past its metaclass: never raises.

    ``type(x).__name__`` asks the metaclass first, and a policy's object (or exception) whose
    metaclass makes ``__name__`` a raising property turned the refusal being worded into that
    exception, escaping the planner with a bare traceback (an outside probe, 2026-12-07)."""
    name = type.__dict__["__name__"].__get__(type(value), type)
    return name if isinstance(name, str) else "object"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of an exception, whatever its ``__str__`` does (it may raise too).

    Refusal reasons and one-line CLI reports are built from exceptions raised by code we do not
    control (a policy, torch, a peer); formatting one must never raise in turn.
    """
    try:
        text = str(exc)
    except Exception:
        text = "(message unavailable)"
    if not text:  # e.g. a bare ``assert``: "AssertionError: " read as if the text had been cut off
        return f"{type_name(exc)} (no message)"
    return f"{type_name(exc)}: {text}"


_HUGE_BITS = 4096
"""Integers longer than this many bits are shown by their length: Python refuses to print one of
more than 4 300 decimal digits (``sys.get_int_max_str_digits``), so ``str`` in an error message
would raise ``ValueError`` in place of the error being worded. No field of a map or a plan is
valid above 2**62, so a value this long is only ever shown as the reason for a refusal."""


def show_int(value: int) -> str:
    """An integer (a location, extent, offset or stride) for an error message: in full unless it is
    longer than ``_HUGE_BITS`` bits, which ``str`` could not print."""
    if value.bit_length() > _HUGE_BITS:
        return f"<an integer of {value.bit_length()} bits>"
    return str(value)


def show_ints(values: Iterable[int]) -> str:
    """A tuple of integers as ``str(tuple(values))`` prints it, each by ``show_int``."""
    items = [show_int(v) for v in values]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def show_list(values: Iterable[int]) -> str:
    """A list of integers as ``str(list(values))`` prints it, each by ``show_int``."""
    return f"[{', '.join(show_int(v) for v in values)}]"
