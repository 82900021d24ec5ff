"""The independent oracle: is this plan a correct transfer between these two maps?

``verify_plan(target_map, source_map, plan)`` judges any plan — one of ours, or a foreign one given
as segment dicts (DeepSpeed's ``TransferPlan.to_dict()``) — and answers a ``Verdict``:

- ``ok``: every segment reads and writes inside its shards; every target shard address is written
  exactly once; and every written element receives the logical element the target map puts there,
  read from a source location whose own pieces hold that element.
- ``invalid``: a concrete counterexample (parameter, target location and offset, the logical
  coordinate that belongs there, the segment(s), and why).
- ``unverifiable``: part of the plan is outside what this oracle can reason about (a segment that
  is not a box in its shard, in bulk beyond the element-level fallback budget, or coordinates too
  large for exact int64 arithmetic). It never says ``ok`` for what it did not check.
- ``invalid_map``: a map is itself invalid (``map_error`` names the error class and message), so
  the plan was not judged. A map error is a property of the input, not of the plan, which is why it
  is its own status (the CLI exits 2, "bad input", for it).

A malformed plan (not parseable as segments) is an ``invalid`` verdict with reason
``malformed plan: ...``; ``verify_plan`` does not raise on plan or map input.

Why it is written the way it is: this package shares **no logic** with the planner (``frames``,
``regions``, ``requests``, ``check``, ``planner``, ``policies`` are not imported, directly or
through another module; ``tests/test_oracle_stands_alone.py`` holds it to that). It re-derives every premise
from the raw maps with its own code, so a reasoning bug in the planner cannot hide in the oracle
too. It does **no per-element work** on its fast path and **no all-pairs loops**: boxes are
compared through ``box.overlapping_pairs`` (k-d partition, output-sensitive) and ``box.covers``,
so cost grows with pieces, segments and their actual intersections, never with tensor size.
Only segments that are not boxes in their shards are expanded to elements, and only under
``fallback_elements``.

The argument, in the order the checks run:

1. Maps (``layout.validate_map``, both sides): pieces are boxes in F and in their shard (row-major
   strides on axes of size > 1, offsets that decode to coordinates, boxes inside); per location
   the local boxes are disjoint and account for the whole shard (Premise A: every shard address
   belongs to exactly one piece, so "what a shard address holds" is a function); logical boxes
   within a location are disjoint; declared ``locations`` are exact; source boxes are disjoint or
   equal and cover F; target boxes cover F. An empty piece holds nothing and is skipped, but only
   after the rules the planner holds it to (R5, R7-R11): a map the planner refuses is never judged.
2. Segments: known locations, stride vectors of the right length, positive extents, non-negative
   strides, and both footprints inside their shards. A segment whose strides are the shard's
   row-major strides and whose offset decodes to a coordinate with the box inside the shard *is*
   that box; address ``k`` of the segment is then coordinate ``origin + k`` on both sides.
3. Exactly once: per target location the segments' write boxes are pairwise disjoint, and their
   volumes sum to the shard numel (disjoint + inside + full volume = exact tiling).
4. Same element from a real holder: each write box is cut by the target location's pieces, each
   cut is carried to the read box by the segment's translation, and cut again by the source
   location's pieces. On each final sub-box both maps are translations, so the target's logical
   origin equals the source's logical origin iff every element of the sub-box is right. The source
   piece belongs to the location the segment reads, so that location really holds the element.

The package, by job: ``verdict`` (the answers), ``layout`` (maps: the oracle's own validation),
``segments`` (plans: parsing, structure, segments as boxes), ``judge`` (exactly once and the
values; the entry points; within a batch, a verdict handed on only to a parameter whose map
contents and plan are the very objects already judged, or whose content equals it), ``small``
(the same judgement in plain Python for small plain layouts and plans, which only ever
confirms: anything else, and every error, is the general path's). It
imports only ``box``, ``maps``, ``plan`` (types and their dict forms), ``limits``, ``errors`` and
``_gc``. Its trusted base, shared with the planner, is
``box``'s arithmetic (the scalar and array row-major decodes, ``box_in_shard``, the k-d queries
and ``covers``); ``proofs/theorem3.md`` names it.
"""

from __future__ import annotations

from ..limits import MAX_COORDINATE
from .judge import FALLBACK_MAX_ELEMENTS, verify_plan, verify_plans
from .verdict import BatchVerdict, Status, Verdict

__all__ = [
    "FALLBACK_MAX_ELEMENTS",
    "MAX_COORDINATE",
    "BatchVerdict",
    "Status",
    "Verdict",
    "verify_plan",
    "verify_plans",
]
