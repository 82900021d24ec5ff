"""The α-β cost model: what a message costs on each kind of path.

``CostModel`` prices a message of ``B`` bytes on a path as ``α + B/β``, with one (α, β) per path
kind: ``process`` (a local copy), ``node`` (same node, e.g. NVLink) and ``network``. Its defaults
are *model inputs*, round numbers of the right order for current hardware, not measurements:
pass calibrated values (the RFC thread quotes α = 0.3 ms, β = 48 GB/s for one GH200 link,
unverified) to compare policies on a given machine.

Why it lives with the policies: the cost-aware policy (``split_balanced``) decides with it, and
``analysis`` only reports with it, so the model sits upstream of both and ``analysis`` imports it
from here (no back edge from a policy into the reports).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_ALPHA", "DEFAULT_BETA", "PATH_KINDS", "CostModel", "LinkCost", "path_kind"]

DEFAULT_ALPHA = 30e-6
"""Network α (seconds per message): a model input, of the order of an RDMA/NCCL message start."""

DEFAULT_BETA = 25e9
"""Network β (bytes per second): a model input, about one 200 Gb/s NIC per process."""

PATH_KINDS = ("process", "node", "network")
"""Path kinds from cheapest to dearest: same process (local copy), same node, across nodes."""


@dataclass(frozen=True)
class LinkCost:
    """One path kind's α (seconds per message) and β (bytes per second)."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        # Finite too: an infinite alpha or beta made every time infinite, and the split policy's
        # levelling then failed on its own arithmetic (``round(inf)``) for a model it had accepted.
        if not (math.isfinite(self.alpha) and math.isfinite(self.beta) and self.alpha >= 0.0 and self.beta > 0.0):
            raise ValueError(
                f"a link needs a finite alpha >= 0 and a finite beta > 0, got alpha={self.alpha}, beta={self.beta}"
            )

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        """``messages·α + nbytes/β``."""
        return messages * self.alpha + nbytes / self.beta


@dataclass(frozen=True)
class CostModel:
    """(α, β) per path kind. Model inputs, not measurements (see the module docstring).

    Defaults: ``process`` (a local device copy) α = 2 µs, β = 400 GB/s; ``node`` (NVLink-class)
    α = 10 µs, β = 150 GB/s; ``network`` α = ``DEFAULT_ALPHA`` (30 µs), β = ``DEFAULT_BETA``
    (25 GB/s). Without ``process_node`` every path between two processes is ``network``.
    """

    process: LinkCost = field(default_factory=lambda: LinkCost(2e-6, 400e9))
    node: LinkCost = field(default_factory=lambda: LinkCost(10e-6, 150e9))
    network: LinkCost = field(default_factory=lambda: LinkCost(DEFAULT_ALPHA, DEFAULT_BETA))

    def link(self, kind: str) -> LinkCost:
        if kind == "process":
            return self.process
        if kind == "node":
            return self.node
        if kind == "network":
            return self.network
        raise ValueError(f"unknown path kind {kind!r}; expected one of {PATH_KINDS}")

    def with_network(self, alpha: float, beta: float) -> CostModel:
        """This model with the network path replaced by ``(alpha, beta)``."""
        return CostModel(self.process, self.node, LinkCost(alpha, beta))


def path_kind(
    source_process: int | None,
    target_process: int | None,
    process_node: Mapping[int, int] | None = None,
) -> str:
    """``process`` if both ends are one process, ``node`` if ``process_node`` puts them on one
    node, else ``network`` (also when processes are unknown: nothing is known to be close)."""
    if source_process is None or target_process is None:
        return "network"
    if source_process == target_process:
        return "process"
    if process_node is not None:
        a = process_node.get(source_process)
        if a is not None and a == process_node.get(target_process):
            return "node"
    return "network"
