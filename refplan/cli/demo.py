"""The built-in example behind ``make demo``: a TP×DP trainer syncing into a TP engine.

A 4-layer Llama-style block set (attention qkv/o, MLP up/down, norms) sharded TP=2 and replicated
over DP=2 (ZeRO-1/2 trainer layout: every TP slice held by two processes) is synced into a TP=4
inference engine on four other processes. Every TP slice has two holders, so the replica policy
decides who sends what: ``first_holder`` leaves the DP=1 replicas idle; ``balanced`` spreads the
bytes. Both plans are checked with the independent oracle when it is available.
"""

from __future__ import annotations

from ..analysis import sender_load
from ..maps import ParamAffineMap, contiguous_split_map, replicate, replicated_map, split
from ..plan import TransferPlan
from ..planner import plan_transfers
from ..policies import balanced, first_holder
from ..requests import ReplicaPolicy, TransferEndpoints

__all__ = ["demo_batch", "run_demo"]

HIDDEN = 512
FFN = 1376


def demo_batch(
    layers: int = 4, tp_source: int = 2, dp_source: int = 2, tp_target: int = 4
) -> tuple[dict[str, tuple[ParamAffineMap, ParamAffineMap]], TransferEndpoints, dict[str, int]]:
    """Pairs, endpoints and element sizes (bf16, 2 bytes) of the demo sync."""
    shapes = {
        "attn.qkv": ((3 * HIDDEN, HIDDEN), 0),
        "attn.o": ((HIDDEN, HIDDEN), 1),
        "mlp.up": ((2 * FFN, HIDDEN), 0),
        "mlp.down": ((HIDDEN, FFN), 1),
    }
    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    for layer in range(layers):
        for name, (shape, axis) in shapes.items():
            source = replicate(contiguous_split_map(shape, split(shape[axis], tp_source), axis), dp_source)
            target = contiguous_split_map(shape, split(shape[axis], tp_target), axis)
            pairs[f"layers.{layer}.{name}"] = (target, source)
        norm = (HIDDEN,)
        pairs[f"layers.{layer}.norm"] = (replicated_map(norm, tp_target), replicated_map(norm, tp_source * dp_source))
    sources = tp_source * dp_source
    endpoints = TransferEndpoints(
        source={loc: loc for loc in range(sources)},
        target={loc: sources + loc for loc in range(tp_target)},
    )
    return pairs, endpoints, dict.fromkeys(pairs, 2)


def _table(title: str, plans: dict[str, TransferPlan], endpoints: TransferEndpoints, sizes: dict[str, int]) -> str:
    senders = sorted(set(endpoints.source.values()))
    load = sender_load(plans, endpoints=endpoints, element_size=sizes, senders=senders)
    segments = sum(len(p.segments) for p in plans.values())
    lines = [f"{title}: {len(plans)} parameters, {segments} segments, {load.total_sent / 2**20:.2f} MiB sent"]
    for proc in senders:
        share = load.sent[proc] / load.total_sent if load.total_sent else 0.0
        bar = "#" * round(40 * share)
        lines.append(f"  process {proc}: {load.sent[proc] / 2**20:8.2f} MiB  {bar}")
    lines.append(f"  busiest sender / even share = {load.imbalance(len(senders)):.2f}x")
    return "\n".join(lines)


SYNC_NOTE = (
    "note: `make demo` then runs `refplan sync --nproc 4 --model demo`: with 4 processes, not the 8 above, it "
    "runs the colocated placement (location i of either side on process i mod 4), so trainer and engine share "
    "processes, part of each copy is local, and its per-process loads differ from these tables"
)
"""Said once after the tables: the sync that follows the demo is another placement of the same
batch, and without this its different loads read as a contradiction of the plan just printed."""


def run_demo() -> str:
    """Plan the demo batch with both policies and return the report ``refplan demo`` prints."""
    return demo_report()[0]


def demo_report(quiet: bool = False, verbose: bool = False) -> tuple[str, bool]:
    """The report ``refplan demo`` prints, and whether the oracle found every plan ok.

    ``quiet`` (``refplan demo -q``): only the oracle's verdict lines, the results; the tables,
    the note and the sample segments are the summary that ``-q`` promises to leave out. The
    verdicts decide the command's exit code, so a demo whose plans the oracle refuses fails.
    ``verbose`` (``-v``): also every parameter of each plan, its segments, elements and verdict;
    before, ``-v`` was accepted and changed nothing."""
    pairs, endpoints, sizes = demo_batch()
    out = [
        "refplan demo: TP=2 x DP=2 trainer (processes 0-3) -> TP=4 engine (processes 4-7), bf16",
        "",
    ]
    results: dict[str, dict[str, TransferPlan]] = {}
    policies: list[tuple[str, ReplicaPolicy]] = [("first_holder", first_holder), ("balanced", balanced)]
    for name, policy in policies:
        plans = plan_transfers(pairs, endpoints=endpoints, element_size=sizes, replica_policy=policy)
        results[name] = plans
        out.append(_table(f"policy {name}", plans, endpoints, sizes))
        out.append("")
    from ..verify import verify_plans  # the oracle ships with the package

    all_ok = True
    verdicts = []
    for name, plans in results.items():
        verdict = verify_plans(pairs, plans)
        all_ok = all_ok and verdict.status == "ok"
        verdicts.append(f"oracle verify_plans({name}): {verdict.status}")
    out.extend(verdicts)
    if quiet:
        return "\n".join(verdicts), all_ok
    if verbose:
        for name, plans in results.items():
            checked = verify_plans(pairs, plans)
            out.append("")
            out.append(f"policy {name}, per parameter:")
            for param in sorted(plans):
                plan = plans[param]
                out.append(f"  {param}: {len(plan.segments)} segments, {plan.moved_elements} elements, "
                           f"oracle {checked.verdicts[param].status}")
    out.append("")
    out.append(SYNC_NOTE)
    sample = "layers.0.attn.qkv"
    out.append("")
    out.append(f"balanced plan for {sample} (first segments):")
    for seg in results["balanced"][sample].segments[:6]:
        out.append(
            f"  src loc {seg.source_rank} @{seg.source_offset} -> tgt loc {seg.target_rank} @{seg.target_offset}"
            f"  shape {seg.shape}"
        )
    return "\n".join(out), all_ok
