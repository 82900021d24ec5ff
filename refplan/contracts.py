"""Small pure functions with PEP 316 contracts, for CrossHair to search for counterexamples.

CrossHair (``crosshair check refplan.contracts``) runs each function on symbolic inputs that
satisfy its ``pre:`` lines and reports any input that breaks a ``post:`` line. It is a bug finder,
not a prover: a clean run means no counterexample was found within the time limits, which is why
the contracts bound the inputs (at most 2 axes, sides of at most 3, at most 4 parts), so that the
search covers small cases thoroughly instead of large ones thinly.

``tiles_exactly`` is the answer checker seen as a predicate on boxes: it builds a one-candidate
request and asks ``refplan.check.check_answers`` itself (not a re-implementation), so CrossHair
searches the real checker. Its postconditions are the meaning of "tile", stated independently of
how the checker decides it: every point of the box is covered by exactly one part (enumerated
point by point), every part has positive extents and the volumes add up, so nothing lies outside.
The postcondition is an equivalence, so it states soundness (the checker never accepts a
non-tiling) and completeness (it accepts every tiling made of well-formed parts) in one condition:
CrossHair spends its time budget per condition, so one condition halves the cost of two.

What this search does not reach, said so that a clean run is not read as more: one candidate (so
a part naming another holder, or read with another holder's layout, is never drawn), split
answers only (never an ``int`` answer, nor the uniform-request path), at most 4 parts (the
pairwise branch; the ``covers`` branch beyond 8 parts is never taken), ``min_split_bytes=0``.
Those are held by ``proofs/differential.check_split_checks`` (three holders at distinct layouts,
each part resolved to the one it names, up to 12 parts) and by ``tests/test_check.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from .box import Box, row_major_strides
from .check import check_answers
from .errors import InvalidReplicaPolicyError
from .requests import ReplicaCandidate, ReplicaPart, ReplicaRequest

__all__ = ["covered_exactly_once", "tiles_exactly"]


def covered_exactly_once(box: Box, parts: Sequence[Box]) -> bool:
    """Whether ``parts`` tile ``box`` exactly, decided element by element (small boxes only).

    Every point of ``box`` must lie in exactly one part, every part must have the box's number
    of axes and positive extents, and the part volumes must sum to the box volume: with every
    box point covered once, that sum leaves no volume for a point outside the box.
    """
    ndim = len(box.extent)
    if any(len(p.origin) != ndim or len(p.extent) != ndim for p in parts):
        return False
    if any(e <= 0 for p in parts for e in p.extent):
        return False
    if sum(p.volume for p in parts) != box.volume:
        return False
    for point in itertools.product(*(range(o, o + e) for o, e in zip(box.origin, box.extent))):
        hits = 0
        for p in parts:
            if all(o <= x < o + e for x, o, e in zip(point, p.origin, p.extent)):
                hits += 1
        if hits != 1:
            return False
    return True


def _request(box: Box) -> ReplicaRequest:
    strides = row_major_strides(box.extent)
    return ReplicaRequest(
        parameter="contract",
        target_location=0,
        target_process=None,
        logical_origin=box.origin,
        shape=box.extent,
        target_offset=0,
        target_strides=strides,
        candidates=(ReplicaCandidate(0, 0, strides),),
        candidate_processes=(None,),
        bytes=None,
    )


def tiles_exactly(box: Box, parts: Sequence[Box]) -> bool:
    """Whether ``check_answers`` accepts ``parts`` (all served by the one holder) as a split of ``box``.

    pre: 1 <= len(box.origin) == len(box.extent) <= 2
    pre: all(0 < e <= 3 for e in box.extent)
    pre: all(-4 <= o <= 4 for o in box.origin)
    pre: 1 <= len(parts) <= 4
    pre: all(len(p.origin) == len(p.extent) == len(box.origin) for p in parts)
    post: __return__ == covered_exactly_once(box, parts)
    """
    answer = [ReplicaPart(tuple(p.origin), tuple(p.extent), 0) for p in parts]
    try:
        check_answers([_request(box)], [answer], min_split_bytes=0)
    except InvalidReplicaPolicyError:
        return False
    return True
