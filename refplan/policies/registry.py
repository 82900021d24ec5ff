"""The policies selectable by name (``refplan plan --policy NAME``, the bench, the runner)."""

from __future__ import annotations

from ..requests import ReplicaPolicy
from .simple import balanced, first_holder, lpt
from .split_balanced import split_balanced

__all__ = ["POLICIES"]

POLICIES: dict[str, ReplicaPolicy] = {
    "balanced": balanced,
    "first_holder": first_holder,
    "lpt": lpt,
    "split_balanced": split_balanced,
}
"""Policies selectable by name (``refplan plan --policy NAME``)."""
