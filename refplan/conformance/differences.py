"""Why DeepSpeed differs from the reference, per group of cases (the prose of ``docs/conformance.md``).

``explain(result)`` maps a non-passing DeepSpeed result to (group key, title, explanation). Failures
are matched by case id; unsupported cases by the most defining missing feature, so that each
feature DeepSpeed lacks is explained once. A result nothing here matches lands in a group titled
"Not yet explained", which is the signal to add a note.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import CaseResult

__all__ = ["budget_notes", "explain"]

FAILURES: list[tuple[str, str, str]] = []
"""(case glob, title, why) for DeepSpeed failures; empty while it fails none. A zero scale, refused by
its map constructor with a plain ``ValueError``, was listed here until 2026-12-06: that is its own
contract (the error classes are ``plan_transfer``'s), judged ``contract`` by the adapter instead."""

UNSUPPORTED: list[tuple[str, str, str]] = [
    (
        "splits",
        "Splitting a request across holders",
        "DeepSpeed's `replica_selector` answers one `int` per multi-holder intersection, so every region comes "
        "whole from one holder. The batch RFC lets a policy answer a list of `ReplicaPart`s that tile the request, "
        "and the planner must check them exactly: parts inside the box, positive extents, pairwise disjoint, "
        "volumes summing to the box, every part from a validated holder, parts no smaller than `min_split_bytes`, "
        "at most `max_parts_per_request`, and the extra segments within `max_segments`/`max_plan_bytes`. "
        "0.19.8 has none of this, so these cases (passing and failing answers) cannot run.",
    ),
    (
        "batch_policy",
        "A batch policy: balance across the whole sync, local copies first",
        "The RFC's default policy sees every request of every parameter at once and gives each to the holder "
        "whose process has sent the fewest bytes so far (counting load it cannot move), after preferring a "
        "holder in the target's own process. DeepSpeed plans one parameter at a time and, without a selector, "
        "always reads from the lowest holder (`holders[0]`): two replicated parameters both leave from "
        "location 0, and a DP replica idles. A per-request selector cannot see the rest of the batch, so the "
        "adapter does not emulate the policy and these cases are unsupported.",
    ),
    (
        "batch_answers",
        "Answers only a batch policy can be held to",
        "A per-request selector is called only for intersections with more than one holder, one at a time. "
        "These cases script answers that need the batch form: the wrong number of answers for the batch, or an "
        "answer for a single-holder request (the RFC hands those to the policy too, so that it sees load it "
        "cannot move; an answer naming anyone but the sole holder must be refused). The adapter will not drop "
        "or invent answers to make such a case fit a selector.",
    ),
    (
        "endpoints",
        "Locations bound to processes (`TransferEndpoints`), and nodes",
        "`plan_transfer` takes no `TransferEndpoints`: the location → process binding lives in the executor "
        "(`affine_transfer_executor.py`), after planning. So the planner cannot refuse a location that holds "
        "data but has no process, cannot prefer a local copy, and cannot take the RFC's `process_node` map.",
    ),
    (
        "process_node",
        "Process → node bindings",
        "No `process_node` input exists in 0.19.8; it is the RFC thread's addition for cost-aware policies.",
    ),
    (
        "element_size",
        "Bytes per element",
        "The planner counts elements only; `element_size` matters to a policy's byte counts and to "
        "`min_split_bytes`, and the reference refuses a missing or non-positive size.",
    ),
    (
        "min_split_bytes",
        "A floor on split parts",
        "No `min_split_bytes`: there are no splits to bound.",
    ),
]


def explain(result: CaseResult) -> tuple[str, str, str]:
    """(group key, title, explanation) for a DeepSpeed result that did not pass."""
    if result.verdict == "unsupported":
        missing = result.reason.removeprefix("needs ").split(", ")
        for feature, title, text in UNSUPPORTED:
            if feature in missing:
                return f"unsupported:{feature}", title, text
        return f"unsupported:{result.reason}", f"Not expressible: {result.reason}", ""
    for pattern, title, text in FAILURES:
        if fnmatch.fnmatchcase(result.case_id, pattern):
            return f"fail:{pattern}", title, text
    return f"other:{result.verdict}", "Not yet explained", "No note explains this difference yet."


def budget_notes(peer: str, peer_budget: Mapping[str, int]) -> list[str]:
    """Markdown lines comparing the peer's ``PlanBudget`` defaults with refplan's, and folding."""
    from ..limits import PlanBudget

    ours = {f.name: int(getattr(PlanBudget(), f.name)) for f in dataclasses.fields(PlanBudget)}
    lines = [
        "- **Budget defaults and what they count.** Budgets are policy, not correctness, and a case that",
        "  sets one uses a value both planners agree on (1, or the exact size of the objects both count).",
        "  The defaults differ because the two count different work: DeepSpeed bounds products of counts",
        "  (pieces² per rank, frames², regions², regions × target frames), refplan the comparisons its",
        "  sort, sweep and k-d partition really make, so its defaults admit maps of 10⁵ pieces.",
        "",
        f"  | field | {peer} | refplan |",
        "  |---|--:|--:|",
    ]
    for name in sorted(set(ours) | set(peer_budget)):
        theirs = peer_budget.get(name)
        lines.append(f"  | `{name}` | {'–' if theirs is None else theirs} | {ours.get(name, '–')} |")
    lines += [
        "",
        "- **Folding.** Both coalesce segments by physical adjacency in both shards. DeepSpeed's fold may",
        "  join copies into one that wraps from the end of a shard row into the next (still a correct",
        "  copy: the oracle checks read/write address pairs); refplan also keeps every merged segment a",
        "  box in both shards, which its executor's chunking relies on.",
    ]
    return lines
