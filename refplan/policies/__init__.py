"""Replica policies: who serves each request. All deterministic.

A policy is ``Callable[[Sequence[ReplicaRequest]], Sequence[ReplicaAnswer]]`` and sees the whole
batch at once, which is what makes balancing across parameters possible. Whatever it answers is
checked exactly (``check.check_answers``) before anything is emitted, so a policy can be wrong
but cannot make the plan wrong.

Determinism contract: the executor is collective, so every process must run the same plan. If
every process plans for itself, the policy must give the same answers for the same requests on
every process (no clocks, no randomness without a shared seed, no iteration over unordered sets).
If one process plans and ships the plan, the policy need not be deterministic. The policies here
depend only on the requests, in their fixed order.

Registered (``POLICIES``): ``first_holder`` (DeepSpeed's old default), ``balanced`` (the default:
local first, then fewest holders and largest first onto the least-loaded holder process), ``lpt`` (Megatron's
distributed-checkpoint rule, no locality) and ``split_balanced`` (α-β cost per path, may split a
region across holders; ``split_balanced_policy(...)`` makes one with other parameters). Their
measured quality against the lower bound is in ``docs/performance.md``.

The package, by job: ``simple`` (``first_holder``, ``balanced``, ``lpt``, ``from_selector``),
``cost`` (the α-β model), ``split_balanced`` (the cost-aware policy) and ``registry``
(``POLICIES``). Every name is importable from ``refplan.policies`` as before.
"""

from __future__ import annotations

from .cost import DEFAULT_ALPHA, DEFAULT_BETA, PATH_KINDS, CostModel, LinkCost, path_kind
from .registry import POLICIES
from .simple import balanced, first_holder, from_selector, lpt, request_load
from .split_balanced import split_balanced, split_balanced_policy

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "PATH_KINDS",
    "POLICIES",
    "CostModel",
    "LinkCost",
    "balanced",
    "first_holder",
    "from_selector",
    "lpt",
    "path_kind",
    "request_load",
    "split_balanced",
    "split_balanced_policy",
]
