"""Execute a batch of transfer plans between processes: one collective over a process group.

Why the protocol looks the way it does:

- **Nothing moves until everyone agrees.** Every check that can fail (dtypes, devices, endpoint
  bindings, segment shapes and strides, buffer bounds, aliasing, the schedule's size, the staging
  budget on both the sending and the receiving side, the plan against its maps, staging
  allocation) runs first, on every process, against only what that process can see. Each process
  then packs its protocol, its verdict, the device type of its buffers and a digest of the whole
  schedule (plans, endpoints, budget, dtypes) into one int64 tensor whose size never changes
  (``_HELLO_WORDS``), and the processes all-gather it, so that a peer of another protocol is a
  disagreement, never a collective of mismatched tensors (which gloo answers by aborting the
  process). Once that exchange has shown a group's processes all on this protocol, its later
  calls agree on a two-word brief instead (``verdict._BRIEF_WORDS``), through the group's store
  when every process could use it (``agree``), else by an all-reduce, and fall back to the full
  exchange whenever the brief does not settle the call. If any process
  refused, the digests differ, or the processes
  hold buffers on different device types, *every* process raises the same
  ``TransferRejectedError`` naming the processes and their reasons, and no byte has moved. A lone
  raise would strand the peers inside a collective, which is why no check may raise on its own,
  and why nothing before the verdict does work proportional to a segment's extents: every
  segment's addresses are bounded by its buffer, and the number of chunks and rounds is computed
  arithmetically and bounded before a single chunk is built.
- **After the verdict, nothing is left that can fail by our own logic**, so the only failures are
  the transport's (a dead or stuck peer). Every wait carries ``timeout``: a stuck round becomes a
  ``TransferExecutionError`` instead of a hang. Staging a transport may still write into after a
  timed-out wait is never freed (see ``_RETAINED``). After the last round the processes agree on
  the outcome (``_outcome``), so a failure anywhere is raised everywhere, with the same targets.
- **Rounds with receives before sends.** Each process derives, from the same plans, the same
  global order of chunks; the chunks between two processes form one FIFO queue per direction, and
  the r-th message of A's queue to B is the r-th of B's queue from A. Round r posts the receives
  of every queue's r-th message first and then the sends. Rounds are posted ahead of the waits
  as far as the two staging slots per queue allow, so packing, moving and unpacking overlap;
  a process only waits for rounds that every peer posts without waiting on anything later, so
  no cycle of waits can form.
- **Chunks are strided boxes that fit the budget by their real size.** A chunk is a slab of the
  segment along one axis (see ``chunk_segment``), so it stays a strided view on both shards and
  its byte count is exactly elements × element size (the published executor's span formula did
  not bound that product).
- **Staging is contiguous bytes, unless the shard already is.** gloo cannot send a non-contiguous
  tensor (and fails on one side only), so a message is packed into staging; a message of one
  chunk that is contiguous in this process's shard is sent from (or received into) the shard
  itself. Every chunk starts in staging at a multiple of its element size, so any dtype (complex128
  needs 16 bytes) can view its bytes. Staging is bounded per peer and in total, and allocated
  before the verdict so that running out of memory is a refusal, not a stranded peer.
- **Bits, not values.** Buffers are reinterpreted once, before the verdict, as an integer type of
  the same width (``complex128`` for 16 bytes), so every dtype torch can view moves bit for bit
  with the same copy kernels; the movement uses those validated views and never reads the
  caller's mappings again.
- **Local copies** (source and target location in the same process) are direct strided copies
  between the shards, spread over the rounds while messages are in flight.

Endpoint values are global ranks by default. ``endpoint_ranks="group"`` makes them ranks of
``group``; they are translated with ``get_global_rank`` because ``P2POp`` takes a global peer.
The transport follows the buffers' device and the group's backend for that device type (torch's
``"cpu:gloo,cuda:nccl"`` strings included): CPU tensors travel over gloo, CUDA tensors over NCCL.

The package follows the protocol's phases, one module each: ``checks`` (arguments, plans,
buffers and segments, before the verdict), ``schedule`` (chunks, messages, queues and staging),
``verdict`` (the brief, or the fixed-size all-gather), ``agree`` (the brief's and the outcome's
agreement through the group's store), ``transport`` (the rounds), ``outcome`` (the collective
outcome), with ``common`` (errors, budget, statistics, context) beneath them and ``call`` (the entry
points, and the registry of calls in flight) above them. A test that replaces a module-level name
must replace it in the module that *uses* it (``transport._pack``, ``call._move``): this package
re-exports the public API, and rebinding a name here changes no phase.
"""

from __future__ import annotations

from .call import SINGLE as SINGLE
from .call import execute_transfer, execute_transfers, release_staging
from .common import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    MIN_TIMEOUT,
    EndpointRanks,
    StagingBudget,
    TransferExecutionError,
    TransferRejectedError,
    TransferStats,
    parse_backend,
    retained_bytes,
)
from .schedule import Chunk, chunk_count, chunk_segment, pack_messages
from .summary import schedule_digest
from .verdict import _HELLO_WORDS as _HELLO_WORDS
from .verdict import _VERDICT_WORDS as _VERDICT_WORDS

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "MIN_TIMEOUT",
    "Chunk",
    "EndpointRanks",
    "StagingBudget",
    "TransferExecutionError",
    "TransferRejectedError",
    "TransferStats",
    "chunk_count",
    "chunk_segment",
    "execute_transfer",
    "execute_transfers",
    "pack_messages",
    "parse_backend",
    "release_staging",
    "retained_bytes",
    "schedule_digest",
]
