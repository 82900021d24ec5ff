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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .requests import ReplicaAnswer, ReplicaPolicy, ReplicaRequest, ReplicaSelectionRequest

__all__ = ["POLICIES", "balanced", "first_holder", "from_selector", "request_load"]


def request_load(request: ReplicaRequest) -> int:
    """Bytes of a request, or elements when no element size was given."""
    return request.bytes if request.bytes is not None else request.elements


def first_holder(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
    """DeepSpeed's old default: the lowest holder location serves every request."""
    return [min(c.source_rank for c in r.candidates) for r in requests]


def _uses_processes(requests: Sequence[ReplicaRequest]) -> bool:
    return bool(requests) and all(
        r.target_process is not None and all(p is not None for p in r.candidate_processes) for r in requests
    )


def balanced(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
    """The default (RFC "Default policy"): local copy first, then the least-loaded holder.

    With endpoints (requests carry processes): a candidate in the target's own process wins
    (lowest such location), because a local copy uses no link. Otherwise the candidate whose
    process has the fewest bytes assigned so far in this batch wins, ties to the lowest location.
    Without endpoints the same rule runs per source location (nothing is known to be local).

    "So far" is made order-independent and tight: loads that cannot move (local copies and
    single-holder requests) are counted first, then the movable requests are assigned largest
    first (the LPT rule, ties by request order), which keeps the busiest sender within
    4/3 of the optimum for equal-speed links instead of depending on the order requests arrive in.
    Counts elements when no element size was given, which equals bytes only for one dtype.
    """
    by_process = _uses_processes(requests)

    def unit(request: ReplicaRequest, k: int) -> int:
        proc = request.candidate_processes[k]
        return proc if by_process and proc is not None else request.candidates[k].source_rank

    load: dict[int, int] = {}
    answers: list[ReplicaAnswer | None] = [None] * len(requests)
    movable: list[int] = []
    for i, r in enumerate(requests):
        local = [
            c.source_rank
            for c, p in zip(r.candidates, r.candidate_processes)
            if by_process and p == r.target_process
        ]
        if local or len(r.candidates) == 1:
            choice = min(local) if local else r.candidates[0].source_rank
            answers[i] = choice
            k = [c.source_rank for c in r.candidates].index(choice)
            load[unit(r, k)] = load.get(unit(r, k), 0) + request_load(r)
        else:
            movable.append(i)
    movable.sort(key=lambda i: (-request_load(requests[i]), i))
    for i in movable:
        r = requests[i]
        best = min(range(len(r.candidates)), key=lambda k: (load.get(unit(r, k), 0), r.candidates[k].source_rank))
        answers[i] = r.candidates[best].source_rank
        load[unit(r, best)] = load.get(unit(r, best), 0) + request_load(r)
    return [a for a in answers if a is not None]


def from_selector(selector: Callable[[ReplicaSelectionRequest], int]) -> ReplicaPolicy:
    """Wrap DeepSpeed's per-request ``replica_selector`` as a batch policy.

    As there, the selector is called only for requests with more than one holder, once each, in
    request order; single-holder requests are answered with their holder. Its results are checked
    like any other answer (``type(x) is int``, a validated candidate).
    """

    def policy(requests: Sequence[ReplicaRequest]) -> list[ReplicaAnswer]:
        answers: list[ReplicaAnswer] = []
        for r in requests:
            if len(r.candidates) == 1:
                answers.append(r.candidates[0].source_rank)
                continue
            answers.append(
                selector(
                    ReplicaSelectionRequest(
                        target_rank=r.target_location,
                        logical_origin=r.logical_origin,
                        shape=r.shape,
                        target_offset=r.target_offset,
                        target_strides=r.target_strides,
                        candidates=r.candidates,
                    )
                )
            )
        return answers

    return policy


POLICIES: dict[str, ReplicaPolicy] = {"balanced": balanced, "first_holder": first_holder}
"""Policies selectable by name (``refplan plan --policy NAME``)."""
