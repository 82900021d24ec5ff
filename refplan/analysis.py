"""Per-process load of a plan batch: what ``refplan demo`` and ``refplan show`` print.

Load is what limits a sync: the busiest sender's bytes set its duration on equal links, so the
number worth printing is max load / even share (1.0 is perfect balance).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .plan import TransferPlan
from .requests import TransferEndpoints

__all__ = ["LoadReport", "sender_load"]


@dataclass(frozen=True)
class LoadReport:
    """Bytes (or elements) sent per source process (or location), local copies apart."""

    sent: dict[int, int]
    local: dict[int, int]
    by_process: bool

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    def imbalance(self, senders: int | None = None) -> float:
        """Busiest sender over the even share among ``senders`` (default: those that could send)."""
        count = senders if senders is not None else len(self.sent)
        if count == 0 or self.total_sent == 0:
            return 1.0
        return max(self.sent.values()) / (self.total_sent / count)


def sender_load(
    plans: Mapping[str, TransferPlan],
    *,
    endpoints: TransferEndpoints | None = None,
    element_size: Mapping[str, int] | None = None,
    senders: list[int] | None = None,
) -> LoadReport:
    """Sum each segment's bytes onto its sending process (or source location without endpoints).

    A segment whose source and target are the same process is a local copy and is counted apart,
    since it uses no link. ``senders`` pre-seeds zero rows so idle senders show up.
    """
    sent: dict[int, int] = dict.fromkeys(senders or [], 0)
    local: dict[int, int] = {}
    for name in sorted(plans):
        unit = 1 if element_size is None else element_size[name]
        for seg in plans[name].segments:
            size = seg.numel * unit
            if endpoints is None:
                sent[seg.source_rank] = sent.get(seg.source_rank, 0) + size
                continue
            src = endpoints.source[seg.source_rank]
            if src == endpoints.target[seg.target_rank]:
                local[src] = local.get(src, 0) + size
            else:
                sent[src] = sent.get(src, 0) + size
    return LoadReport(sent, local, endpoints is not None)
