"""Why a peer's plan is a ``fail``, ``quality`` or ``enhancement`` result: one entry per root cause.

Each ``Finding`` names the peer version, the file:line of the cause in the peer's installed
package, the user configuration that reaches it, the corpus cases that witness it, and the
standalone script under ``docs/peers/`` that shows it with the peer alone (expected beside
actual). ``cause_of`` finds the entry for a result; a ``fail`` or ``quality`` result that no entry
explains is reported as unexplained (and ``tests/test_peers.py`` refuses that).

An entry whose ``verdict`` is ``enhancement`` is a load result the peer's own documented design
makes (its docstring or comments say it chooses so): a maintainer would take it as a request for
an enhancement, not as a defect report. The runner turns the ``quality`` results it witnesses into
``enhancement``, counted apart, so that the counts of a peer's findings are its defects alone.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FINDINGS", "Finding", "cause_of"]


@dataclass(frozen=True)
class Finding:
    peer: str
    """A prefix of the planner names it belongs to: ``dcp`` (also ``dcp-lowest``), ``megatron-core 0.16``,
    ``megatron-core 0.19`` or ``awex``."""
    verdict: str
    """``fail`` or ``quality`` (a defect by the peer's own contract), or ``enhancement`` (a load
    result of the peer's documented design: only a ``quality`` result can be one)."""
    title: str
    version: str
    cause: str
    """file:line in the peer's installed package, with what that code does."""
    configuration: str
    """A real user's configuration that reaches the cause."""
    why: str
    witnesses: tuple[str, ...]
    script: str

    def note(self) -> str:
        """The text appended to a witness's reason."""
        return f"{self.title} ({self.version}, {self.cause}; reached by {self.configuration})"


# Megatron-Core 0.16.1's finding (every parameter from the first source replica) lost its ten corpus
# witnesses on 2026-12-06: one by one they were copies judged as sends, inputs its front door never
# builds (targets on some ranks of its one world), and the pure-DP case its docstring documents
# (contracts now). ``--explore`` over its own domain (both models spanning one world, collocated)
# found the behaviour again later that day, and its witness now is the input its script runs
# through the real front door: a collocated TP2xDP2 -> TP2xDP2 refit. A review the same day judged
# it by 0.16.1's own docstring: the local copy the case asks for is refplan's rule, not 0.16.1's,
# so it is an ``enhancement``.
# Three more cases were listed until 2026-12-06: in two of them one receiver reads a whole
# replicated parameter, which no choice of one training replica per inference replica can spread
# (``common.one_source_floor``: a ``contract`` now), and Awex's resolver would list the third's
# empty shard, which the adapter does not translate (unsupported).
_AWEX_LOAD = ("batches/balance-spans-two-parameters", "batches/balance-three-parameters", "batches/balance-by-bytes",
              "peers/finding-megatron-tp2dp2-uses-one-replica", "peers/finding-awex-one-inference-replica")

FINDINGS: tuple[Finding, ...] = (
    Finding(
        peer="dcp", verdict="quality",
        title="DCP's dedup sizes every SHARD write item by the whole tensor, not its chunk",
        version="torch 2.13.0",
        cause="the dedup's docstring (torch/distributed/checkpoint/_dedup_save_plans.py:20-21) says only the "
              "smallest SavePlan in terms of planned storage keeps a duplicate entry, but _dedup_save_plans.py:53 "
              "weighs each by `write_item.tensor_storage_size()`, which planner.py:80-82 computes from "
              "`tensor_data.size` (the whole tensor; its own docstring, planner.py:75, says so), for the DTensor "
              "write item "
              "planner_helpers.py:177-194 builds, empty chunks included",
        configuration="an HSDP save (DTensors on a (replicate, shard) mesh, default DefaultSavePlanner(), as "
                      "dcp.save runs it) whose FSDP shards differ in size, e.g. a 1-row parameter whose second FSDP "
                      "shard torch's chunking leaves empty, beside a 4-row weight, *and* a tensor replicated over the "
                      "whole mesh (a [Replicate(), Replicate()] DTensor, or a plain tensor such as a persistent "
                      "buffer in an FSDP2 state dict): with HSDP-sharded parameters alone the per-rank bytes skew "
                      "but the busiest writer is unchanged",
        why="Every duplicate item weighs its whole tensor, so the greedy dedup balances tensor sizes, not the bytes "
            "each rank writes: rank 3's empty chunk of w0 counts as all of w0, so w1's second chunk goes to rank 1, "
            "which already writes w2 (16 elements where 8 is reachable and a chunk-sized greedy reaches it). Load "
            "only: every chunk is written once and read back exactly.",
        witnesses=("peers/finding-dcp-dedup-dtensor-hsdp",),
        script="dcp_dedup_counts_items.py",
    ),
    Finding(
        peer="megatron-core 0.16", verdict="enhancement",
        title="Megatron-Core 0.16.1 reads every shard from the first source replica in a collocated TP x DP refit, "
              "local copies unused (by design: an enhancement, not a defect)",
        version="megatron-core 0.16.1",
        cause="megatron/core/resharding/utils.py:357-358: `select_src_metadata_balanced` picks a DP bucket by "
              "destination rank (354-355) and returns its first entry, as its comment says ('any representative "
              "metadata works; use the first'); a DP bucket holds one TP position across the replicas, so its "
              "first entry is always replica 0's, and `_determine_source_ranks_for_dst_param` "
              "(planner.py:306-308) reads every slice from that entry's TP group",
        configuration="a collocated refit inside one world (build_centralized_reshard_plan, planner.py:213, every "
                      "rank holding both models) from a trainer with TP > 1 and DP > 1, e.g. TP2xDP2 -> TP2xDP2 on "
                      "4 ranks, where the engine's shards equal the trainer's on every rank",
        why="Every bucket's first entry is replica 0's, so ranks 2-3 read their shards from ranks 0-1 although "
            "each holds the same shard itself, and replica 1 never sends. What refplan asks for here is a local "
            "copy first, which 0.16.1's docstring never promises; its promise, an even load across the DP "
            "buckets (utils.py:331-333), is kept in the letter (each bucket sends through its first entry), and "
            "its docstring's aim 'to avoid always reading from the same group' (327-328) leaves open whether a "
            "group is a bucket or a replica. So an enhancement to ask for, not a defect by its own contract; "
            "0.19.2 reads local copies first. Load only: the copies are exact.",
        witnesses=("peers/finding-megatron016-collocated-reads-replica-0",),
        script="megatron_tp2dp2_uses_one_replica.py",
    ),
    Finding(
        peer="megatron-core 0.19", verdict="quality",
        title="Megatron-Core 0.19.2's one-DP-group fast path reads a pure-DP parameter from one replica, "
              "against its round robin's docstring",
        version="megatron-core 0.19.2",
        cause="megatron/core/resharding/utils.py:514-516: `_round_robin_dp` returns the first entry when all "
              "sources share one DP group ('no balancing necessary'), although its docstring (utils.py:505-507) "
              "says it cycles within the chosen DP group by destination rank",
        configuration="an RL refit with the engine on ranks apart from the trainer's (build_plan_from_rosters, "
                      "planner.py:403) from a pure data-parallel trainer, e.g. TP1xDP4 -> TP4 (everything from "
                      "rank 0)",
        why="With one DP group the fast path skips the cycle its docstring promises, so four destination ranks "
            "that could each read from another replica all read from the first: one rank sends everything. A "
            "defect by its own docstring. Load only: the copies are exact.",
        witnesses=("peers/finding-megatron-pure-dp-reads-one-rank",),
        script="megatron_0_19_replica_zero.py",
    ),
    Finding(
        peer="megatron-core 0.19", verdict="enhancement",
        title="Megatron-Core 0.19.2 picks the source replica by destination rank alone, the same for every "
              "parameter (by design: an enhancement, not a defect)",
        version="megatron-core 0.19.2",
        cause="megatron/core/resharding/utils.py:498-529: `_round_robin_dp` picks from the destination rank "
              "alone, the same for every parameter, as its docstring describes (505-507: the DP group by "
              "`dst_rank % groups`, the entry by `(dst_rank // groups) % entries`). With several DP groups "
              "(peers/finding-megatron-tp2dp2-uses-one-replica) lines 521-529 run; with one (a pure data-parallel "
              "trainer: the other witnesses, destination rank 2 of DP group (0, 1)) the fast path at 514-516 "
              "runs instead and takes the first entry, which is also the entry the docstring's cycle gives "
              "there ((2 // 1) % 2 = 0). Where the cycle would give another entry the fast path is a defect: "
              "the quality finding above",
        configuration="an RL refit with the engine on ranks apart from the trainer's (build_plan_from_rosters, "
                      "planner.py:403) with fewer engine ranks than trainer replicas, e.g. a TP2xDP2 trainer -> a "
                      "TP2 engine on ranks 4-5 (every parameter from replica 0), or one engine rank fed by two "
                      "replicas",
        why="The round robin balances destination ranks, as designed (an engine on ranks 6-7 would read replica "
            "1), but never parameters, so one destination rank reads all its parameters from one replica and the "
            "other replicas stay idle where a per-parameter rotation (refplan's batch policy) would spread them: "
            "an enhancement to ask for, not a defect. The cases with one destination rank are here too: even the "
            "cycle the docstring promises, keyed by that one rank, would pick one replica. Load only: the copies "
            "are exact.",
        # ``peers/finding-dcp-dedup-counts-items`` was listed until 2026-12-06: its one receiver reads
        # a whole replicated parameter, which no per-(rank, parameter) choice spreads (a contract now).
        # peers/finding-dcp-dedup-dtensor-hsdp until 2026-12-06: a parameter on some ranks of its
        # model only, which no Megatron model's metadata describes (unsupported now).
        witnesses=("batches/balance-spans-two-parameters", "batches/balance-three-parameters",
                   "batches/balance-by-bytes", "peers/finding-megatron-tp2dp2-uses-one-replica",
                   "peers/finding-awex-one-inference-replica"),
        script="megatron_0_19_replica_zero.py",
    ),
    Finding(
        peer="awex", verdict="enhancement",
        title="Awex maps inference replica i to training replica i mod T for every parameter (by design: an "
              "enhancement, not a defect)",
        version="awex 0.9.0",
        cause="awex/transfer/transfer_plan.py:320-323: `train_replica_idx = inf_replica_idx % num_training_replicas`, "
              "the same for every parameter (no rotation)",
        configuration="one inference engine (num_infer_engines=1) fed by a trainer with DP > 1",
        why="Documented design, not a defect by Awex's contract: each inference replica receives from one "
            "assigned training replica (transfer_plan.py:284-288), and with fewer inference replicas than "
            "training replicas the equal share the comment at 315-316 aims at cannot exist, so training "
            "replicas 1.. never send and one inference engine reads every parameter from training replica 0. "
            "What refplan's batch policy does instead is rotate the replica per parameter; the cases listed are "
            "those where that rotation meets a bound Awex's assignment does not. Load only: the copies are "
            "exact. Awex's own test "
            "`test_build_parameter_plan_uses_original_training_replica_order` pins the first training replica "
            "for one parameter, and with a one-rank engine its receive link bounds the sync, so the gain in "
            "practice is below the 2x of the busiest sender.",
        witnesses=_AWEX_LOAD,
        script="awex_one_inference_replica.py",
    ),
)


def cause_of(planner: str, case_id: str, verdict: str) -> Finding | None:
    """The finding that explains ``planner``'s ``verdict`` on ``case_id``, or ``None``.

    ``enhancement`` is asked for by the verdict it becomes: the runner asks whether a ``quality``
    result is one with ``cause_of(planner, case_id, "enhancement")``."""
    for finding in FINDINGS:
        if planner.startswith(finding.peer) and finding.verdict == verdict and case_id in finding.witnesses:
            return finding
    return None
