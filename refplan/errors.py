"""Error classes of refplan.

The hierarchy tells a caller what it may do next, which is why there are four classes rather than
one. ``AffineTransferError`` (a ``ValueError``) is the base and also the class of an exhausted
budget: the plan was refused because it would be too large, not because anything is wrong.
``InvalidMapError`` means a map contradicts itself or the other map; a caller must not fall back
to another path, because the map may describe a corrupt checkpoint. ``UnsupportedLayoutError``
means the geometry is legitimate but not expressible as strided box copies (a transpose, a
scale, replicas cut at different boundaries); a caller may rebuild and re-shard instead.
``InvalidReplicaPolicyError`` means a replica policy answered something the exact checks refuse.

The class names are the same as DeepSpeed's so that the conformance runner can map errors by name.
"""

from __future__ import annotations

__all__ = [
    "AffineTransferError",
    "InvalidMapError",
    "InvalidReplicaPolicyError",
    "UnsupportedLayoutError",
]


class AffineTransferError(ValueError):
    """Base class; raised as itself when a ``PlanBudget`` limit would be exceeded."""


class InvalidMapError(AffineTransferError):
    """A map is self-contradictory or does not match the other map; never fall back."""


class UnsupportedLayoutError(AffineTransferError):
    """Legitimate geometry that strided box copies cannot express; the caller may rebuild."""


class InvalidReplicaPolicyError(AffineTransferError):
    """A replica policy's answer failed one of the exact checks of ``check_answers``."""
