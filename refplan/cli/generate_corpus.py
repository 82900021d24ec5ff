"""Generate the conformance corpus: ``python -m refplan.cli.generate_corpus [--check] [DIR]``.

Every case is written down here, with the outcome the facts demand (``deepspeed-affine-facts.md``
§4.4 rules R0-R32, §4.6 accepted layouts, §6 refusal cases A1-A22, and the batch RFC's answer
checks). Expected outcomes are stated by hand, never computed by running the planner: the only
things derived with refplan's code are the maps (its builders, which match DeepSpeed's piece for
piece) and the informational ``requests`` list that scripted answers index into. Expected
``sources`` of scripted cases follow from the answers alone.

The output is deterministic (fixed case order, fixed key order, compact values), so the committed
JSON can be checked for drift: ``--check`` exits 1 if regenerating would change any file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..box import row_major_strides, volume
from ..conformance.corpus import CASES_DIR, dump_case_file
from ..maps import (
    LAYOUTS,
    AffinePiece,
    ParamAffineMap,
    contiguous_split_map,
    replicate,
    replicated_map,
    split,
    sub_param_map,
)

__all__ = ["build_corpus", "main", "write_corpus"]

Pair = tuple[Any, Any]
"""(target, source): each a ``ParamAffineMap`` or an already-serialized map dict."""

SIDES = ("source", "target")
IME = "InvalidMapError"
ULE = "UnsupportedLayoutError"
ATE = "AffineTransferError"
IRP = "InvalidReplicaPolicyError"


# ---------------------------------------------------------------------------------------------
# Building blocks.


def piece(
    shape: Sequence[int],
    source_offset: int,
    source_strides: Sequence[int],
    dest_offset: int,
    dest_strides: Sequence[int],
    locations: Sequence[int],
    scale: float = 1.0,
) -> AffinePiece:
    return AffinePiece(shape, source_offset, source_strides, dest_offset, dest_strides, locations, scale)


def pmap(
    logical: Sequence[int], shards: Mapping[int, Sequence[int]], pieces: Mapping[int, Sequence[AffinePiece]]
) -> ParamAffineMap:
    return ParamAffineMap(logical, shards, pieces)


def map_dict(value: Any) -> dict[str, Any]:
    """A map's dict form with string location keys (what JSON stores)."""
    doc = value.to_dict() if isinstance(value, ParamAffineMap) else json.loads(json.dumps(value))
    doc["ranks"] = {str(k): v for k, v in doc["ranks"].items()}
    return doc


def as_map(value: Any) -> ParamAffineMap:
    return value if isinstance(value, ParamAffineMap) else ParamAffineMap.from_dict(value)


def relabel(m: ParamAffineMap, names: Mapping[int, int]) -> ParamAffineMap:
    """The same layout with location ``r`` renamed ``names[r]``."""
    return ParamAffineMap(
        m.logical_shape,
        {names[r]: s for r, s in m.shard_shapes.items()},
        {
            names[r]: [
                AffinePiece(p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides,
                            [names[x] for x in p.locations], p.scale)
                for p in ps
            ]
            for r, ps in m.pieces_by_rank.items()
        },
    )


def with_pieces(m: ParamAffineMap, pieces: Mapping[int, Sequence[AffinePiece]]) -> ParamAffineMap:
    return ParamAffineMap(m.logical_shape, m.shard_shapes, {**m.pieces_by_rank, **pieces})


def requests_of(pairs: Mapping[str, Pair]) -> list[dict[str, Any]]:
    """The replica requests of a batch in the RFC's order, as the case's ``requests`` list.

    Informational (the index space of ``answers``); computed with refplan's request builder and
    checked here to be sorted by (parameter, target location, logical origin) as the RFC fixes.
    """
    from ..errors import AffineTransferError
    from ..planner import plan_transfers
    from ..policies import first_holder

    seen: list[Any] = []

    def record(requests: Sequence[Any]) -> Any:
        seen.extend(requests)
        return first_holder(requests)

    maps = {name: (as_map(t), as_map(s)) for name, (t, s) in pairs.items()}
    try:
        plan_transfers(maps, replica_policy=record)
    except AffineTransferError as exc:
        if not seen:
            raise RuntimeError(f"requests_of: the maps are refused before the policy runs: {exc}") from exc
    out = [
        {
            "parameter": r.parameter,
            "target_location": r.target_location,
            "logical_origin": list(r.logical_origin),
            "shape": list(r.shape),
            "candidates": [c.source_rank for c in r.candidates],
        }
        for r in seen
    ]
    keys = [(r["parameter"], r["target_location"], r["logical_origin"]) for r in out]
    if keys != sorted(keys):
        raise RuntimeError("requests_of: requests are not in the RFC's order")
    return out


def sources_from(requests: Sequence[Mapping[str, Any]], answers: Sequence[Any]) -> list[dict[str, Any]]:
    """Where each target region must come from, given well-formed scripted answers."""
    out: list[dict[str, Any]] = []
    for request, answer in zip(requests, answers):
        base = {"parameter": request["parameter"], "target_location": request["target_location"]}
        if isinstance(answer, list):
            for part in answer:
                out.append({**base, "logical_origin": list(part["logical_origin"]), "shape": list(part["shape"]),
                            "source_location": part["source_location"]})
        else:
            out.append({**base, "logical_origin": list(request["logical_origin"]), "shape": list(request["shape"]),
                        "source_location": answer})
    return out


def part(origin: Sequence[Any], shape: Sequence[Any], location: Any) -> dict[str, Any]:
    return {"logical_origin": list(origin), "shape": list(shape), "source_location": location}


def accept(sources: Any = None, max_sender_load: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": "accept"}
    if sources is not None:
        out["sources"] = sources
    if max_sender_load is not None:
        out["max_sender_load"] = max_sender_load
    return out


def refuse(error: str, message: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": "refuse", "error": error}
    if message is not None:
        out["message"] = message
    return out


FROM_ANSWERS = "from-answers"
"""``sources=FROM_ANSWERS``: derive the expected sources from the scripted answers."""


class Family:
    """The cases of one file, in the order they are added."""

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description
        self.cases: list[dict[str, Any]] = []
        self._seen: dict[str, str] = {}
        """Each case's content (all but its id, reason and tags) -> the first id that holds it."""

    def add(
        self,
        slug: str,
        why: str,
        tags: Sequence[str],
        pairs: Pair | Mapping[str, Pair],
        expect: dict[str, Any],
        *,
        endpoints: Mapping[str, Mapping[int, int]] | None = None,
        process_node: Mapping[int, int] | None = None,
        element_size: Mapping[str, int] | None = None,
        min_split_bytes: int | None = None,
        budget: Mapping[str, int] | None = None,
        answers: Sequence[Any] | None = None,
        unless_seen: bool = False,
        same_as: str | None = None,
    ) -> bool:
        """Add one case, or refuse one that repeats an earlier case's content (maps, bindings, budget,
        answers and expectation; only its id, reason and tags differ). Why: a repeated case is the
        same input counted twice, in every planner's totals and in each finding's count of cases,
        which a peer's maintainer reads as inflation (nine such pairs had crept in through loops over
        degrees, e.g. TP=2 replicated over DP=2 is the replicated layout on 4 locations). A loop that
        can reach an earlier case's maps again passes ``unless_seen=True`` and adds nothing then
        (returns False); a deliberate repeat names the earlier slug in ``same_as``."""
        named: Mapping[str, Pair] = {"param": pairs} if isinstance(pairs, tuple) else pairs
        case: dict[str, Any] = {
            "id": f"{self.name}/{slug}",
            "why": why,
            "tags": list(tags),
            "parameters": {
                name: {"target": map_dict(t), "source": map_dict(s)} for name, (t, s) in sorted(named.items())
            },
        }
        if endpoints is not None:
            case["endpoints"] = {
                side: {str(k): v for k, v in sorted(endpoints[side].items())} for side in ("source", "target")
            }
        if process_node is not None:
            case["process_node"] = {str(k): v for k, v in sorted(process_node.items())}
        if element_size is not None:
            case["element_size"] = dict(sorted(element_size.items()))
        if min_split_bytes is not None:
            case["min_split_bytes"] = min_split_bytes
        if budget is not None:
            case["budget"] = dict(budget)
        if answers is not None:
            requests = requests_of(named)
            case["requests"] = requests
            case["answers"] = list(answers)
            if expect.get("sources") == FROM_ANSWERS:
                expect = {**expect, "sources": sources_from(requests, answers)}
        if expect.get("sources") == FROM_ANSWERS:
            raise RuntimeError(f"{case['id']}: sources from answers, but the case has no answers")
        case["expect"] = expect
        if any(c["id"] == case["id"] for c in self.cases):
            raise RuntimeError(f"duplicate case id {case['id']}")
        key = json.dumps({k: v for k, v in case.items() if k not in ("id", "why", "tags")}, sort_keys=True)
        earlier = self._seen.get(key)
        if earlier is not None and same_as is None:
            if unless_seen:
                return False
            raise RuntimeError(f"{case['id']} repeats {earlier}: pass same_as= if that is deliberate")
        if same_as is not None and earlier != f"{self.name}/{same_as}":
            raise RuntimeError(f"{case['id']}: same_as={same_as!r}, but it repeats {earlier or 'no earlier case'}")
        self._seen.setdefault(key, case["id"])
        self.cases.append(case)
        return True


def full(shape: Sequence[int]) -> ParamAffineMap:
    """One location holding all of F: the valid 'other side' of a one-sided refusal."""
    return replicated_map(shape, 1)


def sided(bad: Any, side: str, other: Any = None) -> Pair:
    """(target, source) with ``bad`` on ``side`` and a valid map on the other."""
    good = other if other is not None else full(as_map(bad).logical_shape if isinstance(bad, ParamAffineMap)
                                                  else bad["logical_shape"])
    return (good, bad) if side == "source" else (bad, good)


# ---------------------------------------------------------------------------------------------
# rules: R0-R32 and A1-A22, refusals with their accepted counterparts.


def rules() -> Family:
    f = Family("rules", "Validation rules R0-R32 (facts §4.4) and refusal cases A1-A22 (§6), with "
               "accepted counterparts at the edge of each rule.")
    f.add("R0-a7-reshape", "A7: target (8,8) vs source (64,); equal numel is not a transfer, a reshape is refused",
          ["R0", "A7"], (full((8, 8)), full((64,))), refuse(IME, "describes"))
    for side in SIDES:
        f.add(f"R1-max-ndim-{side}", f"R1: a 2-d {side} map under max_ndim=1 exceeds the axis budget"
              + ("" if side == "source" else " (R0 makes both sides 2-d and the source is checked first, so "
                 "this is R1-max-ndim-source again; kept so that results keyed by its id line up)"),
              ["R1", "budget"], sided(full((4, 4)), side), refuse(ULE, "max_ndim"), budget={"max_ndim": 1},
              same_as=None if side == "source" else "R1-max-ndim-source")
    nine, eight = (1,) * 9, (1,) * 7 + (2,)
    f.add("R1-default-max-ndim-9", "R1: the default max_ndim is 8, so a 9-axis parameter is refused",
          ["R1"], (full(nine), full(nine)), refuse(ULE, "max_ndim"))
    f.add("R1-default-max-ndim-8-accepted", "R1: an 8-axis parameter is within the default max_ndim and plans",
          ["R1", "accept"], (full(eight), full(eight)), accept())
    a6 = pmap((4, 4), {0: (16,)}, {0: [piece((4, 4), 0, (4, 1), 0, (4, 1), [0])]})
    for side in SIDES:
        f.add(f"R2-a6-shard-ndim-{side}", f"A6: a (16,) shard for a (4,4) F on the {side} side has no axis "
              "correspondence", ["R2", "A6"], sided(a6, side), refuse(ULE, "number of axes"))
    four_rows = contiguous_split_map((8, 8), [2, 2, 2, 2], 0)
    for side in SIDES:
        f.add(f"R3-max-pieces-{side}", f"R3: 4 {side} pieces exceed max_pieces_per_map=3",
              ["R3", "budget"], sided(four_rows, side), refuse(ATE, "max_pieces_per_map"),
              budget={"max_pieces_per_map": 3})
    f.add("R3-max-pieces-at-limit", "R3: exactly max_pieces_per_map pieces is within the budget",
          ["R3", "budget", "accept"], (four_rows, full((8, 8))), accept(), budget={"max_pieces_per_map": 4})
    a14 = pmap((4,), {0: (4,)}, {0: []})
    for side in SIDES:
        f.add(f"R4-a14-nonempty-shard-{side}", f"A14: a (4,) {side} shard with no pieces holds nothing it declares",
              ["R4", "A14"], sided(a14, side), refuse(IME, "nonempty shard"))
    half = contiguous_split_map((8, 4), [4, 4], 0)
    a9 = pmap((8, 4), half.shard_shapes, {**half.pieces_by_rank, 7: []})
    for side in SIDES:
        f.add(f"R5-a9-no-shard-shape-{side}", f"A9: {side} location 7 lists pieces ([]) but declares no shard shape",
              ["R5", "A9"], sided(a9, side), refuse(IME, "no shard shape"))
    r6 = pmap((4, 8), {0: (4, 8), 1: (0, 8)}, {
        0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])],
        1: [piece((0, 8), 0, (8, 1), 0, (8, 1), [1]), piece((2, 8), 0, (8, 1), 0, (8, 1), [1])],
    })
    for side in SIDES:
        f.add(f"R6-empty-shard-full-piece-{side}", f"R6: a {side} location with an empty (0,8) shard holds a "
              "(2,8) piece", ["R6"], sided(r6, side), refuse(IME, "empty shard"))
    r6ok = pmap((4, 8), {0: (4, 8), 1: (0, 8)}, {
        0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])], 1: [piece((0, 8), 0, (8, 1), 0, (8, 1), [1])],
    })
    for side in SIDES:
        f.add(f"R6-empty-shard-empty-pieces-{side}", f"R6: a {side} location with an empty shard and only empty "
              "pieces is skipped, and the rest plans", ["R6", "accept"],
              sided(r6ok, side, contiguous_split_map((4, 8), [4, 4], 1)), accept())
    r6skip = pmap((4, 8), {0: (4, 8), 1: (0, 8)}, {
        0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])], 1: [piece((0, 8), 0, (8, 1), 0, (8, 1), [])],
    })
    for side in SIDES:
        f.add(f"R6-empty-shard-rank-skipped-{side}", f"R6: a {side} location with an empty shard and no non-empty "
              "piece is skipped, so its empty piece naming no holder is never checked", ["R6", "R12", "accept"],
              sided(r6skip, side, contiguous_split_map((4, 8), [4, 4], 1)), accept())
    r7 = pmap((4, 4), {0: (4, 4)}, {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]), piece((8,), 8, (1,), 8, (1,), [0])]})
    for side in SIDES:
        f.add(f"R7-piece-ndim-{side}", f"R7: a 1-axis {side} piece in a 2-axis parameter",
              ["R7"], sided(r7, side), refuse(IME, "axes"))
    r8 = pmap((4, 4), {0: (4, 4)}, {0: [piece((4, 4), 0, (4, 1), 0, (4, 1), [0]),
                                         piece((-1, 4), 0, (4, 1), 0, (4, 1), [0])]})
    for side in SIDES:
        f.add(f"R8-negative-extent-{side}", f"R8: a {side} piece of shape (-1,4) must not pass as empty",
              ["R8"], sided(r8, side), refuse(IME, "negative extent"))
    r8b = pmap((4, 4), {0: (4, 4)}, {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]),
                                          piece((-2, -4), 8, (4, 1), 8, (4, 1), [0])]})
    f.add("R8-negative-extents-positive-numel-source", "R8: a (-2,-4) source piece has numel +8 and the "
          "numels account for the shard, yet it is refused", ["R8"], sided(r8b, "source"),
          refuse(IME, "negative extent"))
    r9 = pmap((4, 4), {0: (4, 4)}, {0: [piece((4, 4), 0, (4, 1), 0, (4, 1), [])]})
    for side in SIDES:
        f.add(f"R9-no-holder-{side}", f"R9: a {side} piece with empty locations names no holder",
              ["R9"], sided(r9, side), refuse(IME, "names no holder"))
    for side in SIDES:
        f.add(f"R10-a4-scale-{side}", f"A4: replicated_map((4,4),2,scale=0.5) on the {side} side is a scaled "
              "layout, not a copy", ["R10", "A4"],
              sided(replicated_map((4, 4), 2, scale=0.5), side, replicated_map((4, 4), 2)), refuse(ULE, "scale"))
    for side in SIDES:
        for which in ("source", "dest"):
            for length in (1, 3):
                strides = (1,) if length == 1 else (2, 1, 1)
                src = strides if which == "source" else (2, 1)
                dst = strides if which == "dest" else (2, 1)
                bad = pmap((2, 2), {0: (2, 2)}, {0: [piece((2, 2), 0, src, 0, dst, [0])]})
                f.add(f"R11-a12-{which}-strides-len{length}-{side}",
                      f"A12: a (2,2) {side} piece with a length-{length} {which} stride vector", ["R11", "A12"],
                      sided(bad, side), refuse(IME, "stride vector length"))
    base = contiguous_split_map((8, 4), [4, 4], 0)
    junk = piece((0, 4), 10**6, (5, 5), 999, (7, 7), [1])
    r12 = with_pieces(base, {1: [junk, *base.pieces_by_rank[1]]})
    for side in SIDES:
        f.add(f"R12-empty-piece-not-checked-{side}", f"R12: an empty {side} piece with absurd offsets and wrong "
              "strides is skipped, not checked", ["R12", "accept"],
              sided(r12, side, contiguous_split_map((8, 4), [3, 5], 0)), accept())
    variants = [((1, 8), (8, 1), "source-transpose-a3"), ((8, 1), (1, 8), "dest-transpose"),
                ((16, 1), (8, 1), "source-wrong-row"), ((8, 1), (8, 2), "dest-wrong-col")]
    for side in SIDES:
        for src_s, dst_s, name in variants:
            bad = pmap((8, 8), {0: (8, 8)}, {0: [piece((8, 8), 0, src_s, 0, dst_s, [0])]})
            what = ("a transpose is not a box copy" if "transpose" in name else
                    "strides other than the row-major ones of F and of the shard are not a box copy")
            f.add(f"R13-{name}-{side}", f"R13: {side} piece with strides {src_s}/{dst_s}; {what}",
                  ["R13", "A3"] if "a3" in name else ["R13"], sided(bad, side), refuse(ULE, "strides"))
    free = pmap((4, 8), {r: (1, 8) for r in range(4)},
                {r: [piece((1, 8), 8 * r, (123, 1), 0, (77, 1), [r])] for r in range(4)})
    for side in SIDES:
        f.add(f"R13-size-one-axis-free-{side}", f"R13: strides of size-1 axes are never stepped, so any value is "
              f"accepted ({side})", ["R13", "size-1", "accept"],
              sided(free, side, contiguous_split_map((4, 8), [4, 4], 1)), accept())
    for side in SIDES:
        for src_off, dst_off, name in [(64, 0, "source-past-end"), (0, 16, "dest-past-end"),
                                        (-4, 0, "source-negative"), (0, -4, "dest-negative")]:
            bad = pmap((4, 4), {0: (4, 4)}, {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]),
                                                 piece((2, 4), src_off, (4, 1), dst_off, (4, 1), [0])]})
            f.add(f"R14-{name}-{side}", f"R14: a {side} piece whose offset ({src_off}/{dst_off}) does not decode "
                  "to a coordinate", ["R14"], sided(bad, side), refuse(IME, "not a coordinate"))
    out_f = pmap((4, 4), {0: (4, 4)}, {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]),
                                            piece((2, 4), 12, (4, 1), 8, (4, 1), [0])]})
    out_s = pmap((4, 4), {0: (2, 4), 1: (2, 4)}, {0: [piece((2, 4), 0, (4, 1), 4, (4, 1), [0])],
                                                   1: [piece((2, 4), 8, (4, 1), 0, (4, 1), [1])]})
    for side in SIDES:
        f.add(f"R15-outside-logical-{side}", f"R15: a {side} box at row 3 of height 2 runs past F's 4 rows",
              ["R15"], sided(out_f, side), refuse(IME, "outside the logical parameter"))
        f.add(f"R15-outside-shard-{side}", f"R15: a {side} shard box at row 1 of height 2 runs past its (2,4) shard",
              ["R15"], sided(out_s, side), refuse(IME, "outside the .*shard"))
    many = pmap((16, 2), {0: (16, 2)}, {0: [piece((1, 2), 2 * i, (2, 1), 2 * i, (2, 1), [0]) for i in range(16)]})
    for side in SIDES:
        f.add(f"R16-pair-budget-{side}", f"R16: tiling 16 {side} pieces of one location needs more than one "
              "comparison", ["R16", "budget"], sided(many, side), refuse(ATE, "max_pair_checks|budget"),
              budget={"max_pair_checks": 1})
    a5 = pmap((4, 4), {0: (4, 2), 1: (4, 2)}, {
        0: [piece((2, 2), 0, (4, 1), 0, (2, 1), [0]), piece((2, 2), 8, (4, 1), 0, (2, 1), [0])],
        1: [piece((2, 2), 2, (4, 1), 0, (2, 1), [1]), piece((2, 2), 10, (4, 1), 4, (2, 1), [1])],
    })
    c8624 = pmap((4,), {0: (4,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0]), piece((2,), 2, (1,), 0, (1,), [0])]})
    for side in SIDES:
        f.add(f"R17-a5-same-shard-addresses-{side}", f"A5: numels sum to 16 and logical boxes tile F, yet {side} "
              "location 0 writes dest 0 twice", ["R17", "A5"], sided(a5, side), refuse(IME, r"same\s+shard addresses"))
        f.add(f"R17-8624-double-write-{side}", f"#8624: {side} pieces src[0:2] and src[2:4] both land at "
              "dest[0:2] of a (4,) shard", ["R17", "8624"], sided(c8624, side),
              refuse(IME, r"same\s+shard addresses"))
    r18 = pmap((4, 4), {0: (4, 4), 1: (2, 4)}, {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0])],
                                                 1: [piece((2, 4), 8, (4, 1), 0, (4, 1), [1])]})
    for side in SIDES:
        f.add(f"R18-account-for-shard-{side}", f"R18: {side} location 0's pieces fill 8 of its 16 shard elements",
              ["R18"], sided(r18, side), refuse(IME, "account for"))
    tpdp = replicate(contiguous_split_map((8, 4), [2, 2, 2, 2], 0), 4)
    for side in SIDES:
        f.add(f"R19-holder-pair-budget-{side}", f"R19: checking 16 replicated {side} frames' holders needs more "
              "than one comparison", ["R19", "budget"], sided(tpdp, side), refuse(ATE, "max_pair_checks"),
              budget={"max_pair_checks": 1})
    r20 = pmap((4, 4), {0: (4, 4), 1: (1, 4)}, {
        0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]), piece((2, 4), 4, (4, 1), 8, (4, 1), [0])],
        1: [piece((1, 4), 12, (4, 1), 0, (4, 1), [1])],
    })
    for side in SIDES:
        f.add(f"R20-overlapping-logical-{side}", f"R20: {side} location 0 stores rows 0-1 and rows 1-2 at "
              "disjoint addresses", ["R20"], sided(r20, side), refuse(IME, "overlapping logical pieces"))
    r21 = pmap((2, 4), {0: (2, 4), 1: (1, 4)}, {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
                                                 1: [piece((1, 4), 0, (4, 1), 0, (4, 1), [0, 1])]})
    a2 = pmap((8, 8), {0: (4, 8), 1: (4, 8), 2: (4, 8)}, {
        0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])], 1: [piece((4, 8), 0, (8, 1), 0, (8, 1), [1])],
        2: [piece((4, 8), 32, (8, 1), 0, (8, 1), [2])],
    })
    a15 = pmap((4,), {0: (4,), 1: (4,)}, {r: [piece((4,), 0, (1,), 0, (1,), [0])] for r in (0, 1)})
    a16 = pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0, 1])]})
    for side in SIDES:
        f.add(f"R21-not-hold-all-{side}", f"R21: {side} location 1 is declared a holder of all of F but holds "
              "only row 0", ["R21"], sided(r21, side), refuse(IME, "does not hold all of|different locations"))
        f.add(f"R21-a2-undeclared-holder-{side}", f"A2: {side} locations 0 and 1 both hold rows 0-3 but declare "
              "{0} and {1}", ["R21", "A2"], sided(a2, side), refuse(IME, "different locations"))
        f.add(f"R21-a15-both-hold-declare-one-{side}", f"A15: {side} locations 0 and 1 both hold F (4,) but declare "
              "[0]", ["R21", "A15"], sided(a15, side), refuse(IME, "different locations"))
        f.add(f"R21-a16-declared-holder-missing-{side}", f"A16: the only {side} location declares [0,1] and "
              "location 1 does not exist", ["R21", "A16"], sided(a16, side), refuse(IME, "different locations"))
    a19 = pmap((2, 4), {0: (2, 4), 1: (2, 4)}, {
        0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
        1: [piece((1, 4), 0, (4, 1), 0, (4, 1), [0, 1]), piece((1, 4), 4, (4, 1), 4, (4, 1), [1])],
    })
    f.add("R21-a19-target-partial-declaration", "A19: target location 1 declares row 1 as [1] while location 0 "
          "also holds it", ["R21", "A19"], sided(a19, "target"), refuse(IME, "different locations"))
    f.add("R22-region-pair-budget", "R22: 16 source regions cannot be checked pairwise with max_pair_checks=1 "
          "(the map's own pair checks, R16/R19, already need more, so the budget refuses it there)",
          ["R22", "R19", "max_pair_checks", "budget"], (full((16, 2)), contiguous_split_map((16, 2), [1] * 16, 0)),
          refuse(ATE, "max_pair_checks"), budget={"max_pair_checks": 1})
    r23 = pmap((4,), {0: (4,), 1: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0, 1])],
                                           1: [piece((4,), 0, (1,), 0, (1,), [1])]})
    f.add("R23-holders-disagree", "R23: two source holders of the same box declare [0,1] and [1]",
          ["R23", "R21"], sided(r23, "source"), refuse(IME, "different locations"))
    a20 = pmap((2, 4), {0: (2, 4), 1: (2, 4)}, {
        0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
        1: [piece((1, 4), 0, (4, 1), 0, (4, 1), [0, 1]), piece((1, 4), 4, (4, 1), 4, (4, 1), [0, 1])],
    })
    f.add("R24-a20-source-replicas-cut-differently", "A20: source replicas of F cut at different boundaries are "
          "legitimate but need a rebuild", ["R24", "A20"], sided(a20, "source"),
          refuse(ULE, "different piece boundaries"))
    f.add("R24-target-replicas-cut-differently-accepted", "R24 is source-only: target replicas cut at different "
          "boundaries plan fine (v3 test)", ["R24", "accept", "target-replicas"],
          (a20, contiguous_split_map((2, 4), [1, 1], 0)), accept())
    a1 = pmap((16, 8), {0: (8, 8)}, {0: [piece((8, 8), 0, (8, 1), 0, (8, 1), [0])]})
    f.add("R25-a1-source-covers-half", "A1: the source holds only rows 0-7 of a (16,8) F", ["R25", "A1"],
          (full((16, 8)), a1), refuse(IME, "of its"))
    f.add("R26-a17-target-half", "A17: the target holds only a (2,) shard of a (4,) F", ["R26", "A17"],
          (pmap((4,), {0: (2,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0])]}), full((4,))),
          refuse(IME, "target pieces do not cover"))
    f.add("R26-a18-target-nothing", "A18: a target with no shards and no pieces drops all of F", ["R26", "A18"],
          (pmap((4,), {}, {}), full((4,))), refuse(IME, "target pieces do not cover"))
    row2, col4 = contiguous_split_map((8, 8), [4, 4], 0), contiguous_split_map((8, 8), [2] * 4, 1)
    f.add("R27-a8-pair-checks", "A8: row2 -> col4 (8,8) with max_pair_checks=1 (the source map's own pair checks, "
          "R16/R19, already need more, so the budget refuses it there)", ["R27", "R19", "A8", "max_pair_checks",
                                                                           "budget"],
          (col4, row2), refuse(ATE, "max_pair_checks"), budget={"max_pair_checks": 1})
    f.add("R28-gap-under-target-frame", "4 target frames over a source holding half of F: refused by R25 (the "
          "source does not cover F), which runs first; R28 cannot fire once R15, R24 and R25 hold, since the source "
          "regions then tile F", ["R25", "R28"], (contiguous_split_map((16, 8), [4] * 4, 0), a1),
          refuse(IME, "of its"))
    reverse = pmap((16, 2), {0: (16, 2)}, {0: [piece((1, 2), 2 * i, (2, 1), 2 * i, (2, 1), [0])
                                               for i in reversed(range(16))]})
    f.add("R30-a22-merge-checks", "A22: folding 16 single-row target pieces listed in reverse needs more than 10 "
          "merge checks", ["R30", "A22", "budget"], (reverse, full((16, 2))), refuse(ATE, "max_merge_checks"),
          budget={"max_merge_checks": 10})
    f.add("R30-a22-default-budget-accepted", "A22: the same 16 reversed pieces plan under the default merge budget",
          ["R30", "A22", "accept"], (reverse, full((16, 2))), accept())
    f.add("R31-a8-max-segments-1", "A8: row2 -> col4 needs 8 segments, max_segments=1", ["R31", "A8", "budget"],
          (col4, row2), refuse(ATE, "max_segments"), budget={"max_segments": 1})
    f.add("R31-max-segments-7", "R31: row2 -> col4's 8 disjoint (4,2) copies cannot fold below 8 segments",
          ["R31", "budget"], (col4, row2), refuse(ATE, "max_segments"), budget={"max_segments": 7})
    f.add("R31-max-segments-8-accepted", "R31: row2 -> col4 fits exactly in max_segments=8", ["R31", "budget",
          "accept"], (col4, row2), accept(), budget={"max_segments": 8})
    f.add("R32-a8-max-plan-bytes-1", "A8: no plan encodes to 1 byte", ["R32", "A8", "budget"], (col4, row2),
          refuse(ATE, "max_plan_bytes"), budget={"max_plan_bytes": 1})
    one = replicated_map((4,), 1)
    envelope = {"logical_shape": [4], "segments": [{"shape": [4], "source": [0, 0, [1]], "target": [0, 0, [1]]}]}
    size = len(json.dumps(envelope, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    f.add("R32-a21-envelope-minus-one", f"A21: (4,) to itself encodes to a {size}-byte envelope; "
          f"max_plan_bytes={size - 1} refuses it", ["R32", "A21", "budget"], (one, one),
          refuse(ATE, "max_plan_bytes"), budget={"max_plan_bytes": size - 1})
    f.add("R32-a21-envelope-exact", f"A21: max_plan_bytes={size}, the envelope's exact size, plans",
          ["R32", "A21", "budget", "accept"], (one, one), accept(), budget={"max_plan_bytes": size})
    a10_base = contiguous_split_map((16, 8), [8, 8], 0)
    for index in (0, 1):
        for corruption, expected in [("source-offset-72", refuse(IME, "outside the logical parameter")),
                                     ("source-strides-1-16", refuse(ULE, "strides")),
                                     ("scale-2", refuse(ULE, "scale"))]:
            p = a10_base.pieces_by_rank[index][0]
            off = 72 if corruption == "source-offset-72" else p.source_offset
            a10_strides = (1, 16) if corruption == "source-strides-1-16" else p.source_strides
            scale = 2.0 if corruption == "scale-2" else 1.0
            bad = with_pieces(a10_base, {index: [piece(p.shape, off, a10_strides, p.dest_offset, p.dest_strides,
                                                       sorted(p.locations), scale)]})
            f.add(f"A10-{corruption}-location{index}", f"A10: the (16,8) 2-row split with location {index}'s piece "
                  f"corrupted ({corruption}) into a 4-row target", ["A10", "R15" if "offset" in corruption else
                  ("R13" if "strides" in corruption else "R10")],
                  (contiguous_split_map((16, 8), [4] * 4, 0), bad), expected)
    three = pmap((0, 1), {0: (0, 1)}, {0: [piece((0, 1), 0, (1, 1), 0, (1, 1), [0])] * 3})
    none = pmap((0, 1), {}, {})
    for side in SIDES:
        pair = (three, none) if side == "target" else (none, three)
        f.add(f"A13-empty-pieces-count-{side}", f"A13: 3 empty {side} pieces of an empty F still count against "
              "max_pieces_per_map=2", ["A13", "R3", "budget"], pair, refuse(ATE, "max_pieces_per_map"),
              budget={"max_pieces_per_map": 2})
    f.add("A13-empty-parameter-accepted", "A13: an empty F (0,1) plans to no segments under the default budget",
          ["A13", "accept"], (three, none), accept())
    zero_scale = map_dict(full((4,)))
    zero_scale["ranks"]["0"]["pieces"][0]["scale"] = 0.0
    f.add("scale-zero-not-invertible", "A zero scale is not invertible: the map is invalid (InvalidMapError, when "
          "the piece is built), not merely unsupported as R10's other scales are", ["R10", "scale-0"],
          sided(zero_scale, "source"), refuse(IME, "scale"))
    return f


# ---------------------------------------------------------------------------------------------
# layouts: §4.6 accepted layouts across degrees, goldens, uneven tails, random contiguous splits.


bigcode = LAYOUTS["bigcode"]
"""§4.6's bigcode layout at a TP degree (``maps.LAYOUTS["bigcode"]``; the name the tests import)."""


def layouts() -> Family:
    f = Family("layouts", "Accepted layouts of facts §4.6 across degrees {1,2,4}x{1,2,4}, with replicated "
               "(TPxDP) sources, goldens, uneven tails and seeded random contiguous splits.")
    for name, build in LAYOUTS.items():
        for s in (1, 2, 4):
            for t in (1, 2, 4):
                f.add(f"{name}-{s}to{t}", f"§4.6 executed-coverage layout {name}, TP={s} -> TP={t}, must plan "
                      "exactly", ["layout", name], (build(t), build(s)), accept())
        for s, t in ((2, 4), (4, 2), (1, 1)):
            f.add(f"{name}-{s}x2dp-to{t}", f"§4.6 layout {name}, TP={s} replicated over DP=2 -> TP={t}: every "
                  "region has two holders", ["layout", name, "replicas"], (build(t), replicate(build(s), 2)),
                  accept(), unless_seen=True)  # replicated at TP=s over DP=2 is replicated-{2s}to{t}
    row2, col4 = contiguous_split_map((8, 8), [4, 4], 0), contiguous_split_map((8, 8), [2] * 4, 1)
    f.add("golden-hand-derived-row2-col4", "§4.6 worked example: row2 -> col4 (8,8), eight (4,2) copies",
          ["golden"], (col4, row2), accept())
    f.add("golden-identity", "§4.6 identity: (6,4) 2-row split to itself is still a plan (not a no-op)",
          ["golden", "identity"], (contiguous_split_map((6, 4), [3, 3], 0),) * 2, accept())
    ns = pmap((4, 16), {3: (4, 8), 9: (4, 8)}, {3: [piece((4, 8), 0, (16, 1), 0, (8, 1), [3])],
                                                 9: [piece((4, 8), 8, (16, 1), 0, (8, 1), [9])]})
    f.add("golden-location-namespaces", "§4.6 rank namespaces: source locations {3,9} into target location 0",
          ["golden", "non-contiguous"], (full((4, 16)), ns), accept())
    rows = 10**9
    f.add("golden-billion-rows-row2-col4", "§4.6 scale-free size: a (1e9,8) row2 -> col4 plan (8e9 elements) "
          "without per-element work", ["golden", "1e9"],
          (contiguous_split_map((rows, 8), [2] * 4, 1), contiguous_split_map((rows, 8), [rows // 2] * 2, 0)),
          accept())
    col3 = contiguous_split_map((8, 8), [3, 3, 2], 1)
    col3_rev = ParamAffineMap(col3.logical_shape, col3.shard_shapes,
                              {r: list(reversed(ps)) for r, ps in reversed(list(col3.pieces_by_rank.items()))})
    f.add("golden-determinism-reversed", "§4.6 determinism: a [3,3,2] column split listed in reverse plans",
          ["golden"], (col3_rev, row2), accept())
    for shape, (s, t) in (((11, 8), (2, 4)), ((23, 5), (4, 2)), ((7, 13), (1, 3))):
        for a_src in (0, 1):
            for a_tgt in (0, 1):
                src = contiguous_split_map(shape, split(shape[a_src], s), a_src)
                tgt = contiguous_split_map(shape, split(shape[a_tgt], t), a_tgt)
                f.add(f"uneven-{shape[0]}x{shape[1]}-{s}to{t}-axis{a_src}{a_tgt}",
                      f"§4.6 uneven tails: {shape} split {s} ways on axis {a_src} -> {t} ways on axis {a_tgt}",
                      ["layout", "uneven"], (tgt, src), accept(),
                      unless_seen=True)  # one way has no axis; (11,8) 2 -> 4 on rows is row_uneven-2to4
    rng = random.Random(20260922)
    shapes = [(12, 4), (16, 8), (24, 12), (7, 13), (23, 5), (48, 8)]
    degrees = [(1, 2), (2, 1), (2, 3), (3, 2), (2, 4), (4, 2), (4, 4), (3, 5)]
    for trial in range(16):
        shape = rng.choice(shapes)
        a_src, a_tgt = rng.choice([(0, 0), (0, 1), (1, 0), (1, 1)])
        s, t = rng.choice(degrees)
        src = contiguous_split_map(shape, split(shape[a_src], s), a_src)
        tgt = contiguous_split_map(shape, split(shape[a_tgt], t), a_tgt)
        f.add(f"random-{trial:02d}", f"§4.6 random (seed 20260922): {shape} {s}-way axis {a_src} -> {t}-way axis "
              f"{a_tgt}", ["layout", "random"], (tgt, src), accept(),
              unless_seen=True)  # a draw that repeats an earlier case is left out, its number with it
    return f


# ---------------------------------------------------------------------------------------------
# replicas: holders at different offsets, target replicas, namespaces, empty pieces, size-1, 1e9.


def swapped_holders() -> ParamAffineMap:
    """(4,2) on locations 0 and 1; location 1 stores the two row pairs swapped (facts §4.6)."""
    return pmap((4, 2), {0: (4, 2), 1: (4, 2)}, {
        0: [piece((2, 2), 0, (2, 1), 0, (2, 1), [0, 1]), piece((2, 2), 4, (2, 1), 4, (2, 1), [0, 1])],
        1: [piece((2, 2), 0, (2, 1), 4, (2, 1), [0, 1]), piece((2, 2), 4, (2, 1), 0, (2, 1), [0, 1])],
    })


def replicas() -> Family:
    f = Family("replicas", "Replica edge cases: holders at different offsets, target replicas, non-contiguous "
               "locations, empty pieces, size-1 axes and 1e9-element parameters, with exact sources where "
               "the answers are scripted.")
    sw = swapped_holders()
    f.add("holders-at-different-offsets-pick-1", "§4.6 selector address test: location 1 stores the rows swapped; "
          "reading from it must use its own offsets", ["holders-offsets", "answers"], (full((4, 2)), sw),
          accept(FROM_ANSWERS), answers=[1, 1])
    f.add("holders-at-different-offsets-pick-0", "§4.6 selector address test with location 0 for both regions",
          ["holders-offsets", "answers"], (full((4, 2)), sw), accept(FROM_ANSWERS), answers=[0, 0])
    f.add("holders-at-different-offsets-mixed", "Holders at different offsets, one region from each holder",
          ["holders-offsets", "answers"], (full((4, 2)), sw), accept(FROM_ANSWERS), answers=[1, 0])
    f.add("holders-at-different-offsets-split", "A split across holders that store the region at different "
          "offsets: each part reads its own holder's address", ["holders-offsets", "splits"],
          (full((4, 2)), sw), accept(FROM_ANSWERS), min_split_bytes=1,
          answers=[[part((0, 0), (1, 2), 1), part((1, 0), (1, 2), 0)], 1])
    f.add("target-replicas-three", "A target replicated over 3 locations gets its own copy per replica",
          ["target-replicas"], (replicated_map((6, 4), 3), contiguous_split_map((6, 4), [2, 2, 2], 0)), accept())
    tcut = pmap((2, 4), {0: (2, 4), 1: (2, 4)}, {
        0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
        1: [piece((1, 4), 0, (4, 1), 4, (4, 1), [0, 1]), piece((1, 4), 4, (4, 1), 0, (4, 1), [0, 1])],
    })
    f.add("target-replicas-cut-differently-swapped", "Target replicas cut differently and stored in swapped order "
          "(v3 test) plan exactly", ["target-replicas"], (tcut, contiguous_split_map((2, 4), [1, 1], 0)), accept())
    partial = pmap((4, 4), {0: (4, 4), 1: (2, 4)}, {
        0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1]), piece((2, 4), 8, (4, 1), 8, (4, 1), [0])],
        1: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
    })
    f.add("target-partial-replica", "Target location 1 replicates only rows 0-1 (declared [0,1] by both holders); "
          "location 0 alone holds rows 2-3", ["target-replicas", "R21", "R26", "answers"],
          (partial, replicated_map((4, 4), 2)), accept(FROM_ANSWERS), answers=[1, 0, 0])
    f.add("target-and-source-replicas", "Replicated source (2 holders) into a replicated target (3 locations): "
          "scripted answers per target replica", ["target-replicas", "answers"],
          (replicated_map((4, 4), 3), replicated_map((4, 4), 2)), accept(FROM_ANSWERS), answers=[1, 0, 1])
    ns_src = pmap((4, 16), {3: (4, 8), 9: (4, 8)}, {3: [piece((4, 8), 0, (16, 1), 0, (8, 1), [3])],
                                                     9: [piece((4, 8), 8, (16, 1), 0, (8, 1), [9])]})
    ns_tgt = pmap((4, 16), {5: (1, 16), 2: (3, 16)}, {5: [piece((1, 16), 0, (16, 1), 0, (16, 1), [5])],
                                                       2: [piece((3, 16), 16, (16, 1), 0, (16, 1), [2])]})
    f.add("non-contiguous-locations", "Source locations {3,9} and target locations {5,2}: names, not indices",
          ["non-contiguous"], (ns_tgt, ns_src), accept())
    sparse = relabel(replicate(contiguous_split_map((8, 8), [4, 4], 0), 2), {0: 10, 1: 31, 2: 7, 3: 1000})
    f.add("non-contiguous-replica-holders", "Replica holders named {1000,7,10,31}: candidates follow location "
          "order, answers name locations", ["non-contiguous", "answers"],
          (contiguous_split_map((8, 8), [2] * 4, 1), sparse), accept(FROM_ANSWERS),
          answers=[10, 1000, 7, 31, 10, 31, 7, 1000])
    big = replicate(contiguous_split_map((8, 8), [4, 4], 0), 3,
                    location_of=lambda r, c: 100 * c + 5 * r + 3)
    f.add("replicate-location-of", "replicate() with location_of giving ids {3,8,103,108,203,208}",
          ["non-contiguous", "replicas"], (contiguous_split_map((8, 8), [2] * 4, 1), big), accept())
    m = sub_param_map((12, 8), (8, 4), [[4, 4], [4, 0]], 0)
    other = contiguous_split_map((12, 8), split(12, 3), 0)
    f.add("empty-piece-running-offset-source", "An empty source piece starting one past the end of its shard and "
          "of F is skipped", ["empty-pieces", "R12"], (other, m), accept())
    f.add("empty-piece-running-offset-target", "An empty target piece with an out-of-range running offset is "
          "skipped", ["empty-pieces", "R12"], (m, other), accept())
    z = sub_param_map((12, 8), (8, 4), [[8, 0], [2, 2]], 0)
    f.add("empty-pieces-zero-width", "sub_param_map with a zero width for location 1 emits an empty piece",
          ["empty-pieces"], (contiguous_split_map((12, 8), [6, 6], 0), z), accept())
    zero_shard = contiguous_split_map((4, 8), [4, 0], 0)
    f.add("empty-shard-location", "A (0,8) target shard with only an empty piece receives nothing",
          ["empty-pieces"], (zero_shard, contiguous_split_map((4, 8), [2, 2], 0)), accept())
    base = contiguous_split_map((8, 8), [4, 4], 0)
    idle = pmap((8, 8), {**base.shard_shapes, 2: (0, 8)},
                {**base.pieces_by_rank, 2: [piece((0, 8), 64, (8, 1), 0, (8, 1), [2])]})
    f.add("empty-source-location", "A source location with an empty shard and an empty piece is no holder",
          ["empty-pieces"], (contiguous_split_map((8, 8), [2] * 4, 1), idle), accept())
    f.add("size-one-axes-3d", "(1,6,1) split on its middle axis, 2 -> 3 ways: size-1 axes everywhere",
          ["size-1"], (contiguous_split_map((1, 6, 1), [2, 2, 2], 1), contiguous_split_map((1, 6, 1), [3, 3], 1)),
          accept())
    f.add("size-one-axes-replicated", "(1,1,4) replicated over 2 into a 4-way split on the last axis",
          ["size-1", "answers"], (contiguous_split_map((1, 1, 4), [1] * 4, 2), replicated_map((1, 1, 4), 2)),
          accept(FROM_ANSWERS), answers=[1, 0, 1, 0])
    f.add("size-one-axis-split-over-it", "(2,1) split on the size-1 axis: one location holds nothing",
          ["size-1", "empty-pieces"],
          (contiguous_split_map((2, 1), [1, 0], 1), contiguous_split_map((2, 1), [1, 1], 0)),
          accept())
    g = 10**9
    f.add("billion-replicated-answers", "A (1e9,) parameter replicated on 2 locations into 2 halves; each half from "
          "the named holder", ["1e9", "answers"],
          (contiguous_split_map((g,), [g // 2] * 2, 0), replicated_map((g,), 2)),
          accept(FROM_ANSWERS), answers=[1, 0])
    f.add("billion-replicated-split", "A (1e9,) request split across 2 holders; parts of 5e8 elements clear the "
          "default min_split_bytes", ["1e9", "splits"], (full((g,)), replicated_map((g,), 2)), accept(FROM_ANSWERS),
          answers=[[part((0,), (g // 2,), 1), part((g // 2,), (g // 2,), 0)]])
    f.add("billion-2d-tpdp", "A (1e9,8) TP=2 x DP=2 source into TP=4 columns, last candidate everywhere",
          ["1e9", "answers", "replicas"],
          (contiguous_split_map((g, 8), [2] * 4, 1), replicate(contiguous_split_map((g, 8), [g // 2] * 2, 0), 2)),
          accept(FROM_ANSWERS), answers=[2, 3] * 4)
    return f


# ---------------------------------------------------------------------------------------------
# answers: every check on scripted answers, passing and failing (RFC "What the planner checks").


def answers() -> Family:
    f = Family("answers", "Scripted replica-policy answers: every check of the batch RFC (and R29) with a "
               "passing and a failing answer; passing ones pin the source of every target region.")
    tgt2, rep2 = contiguous_split_map((4, 4), [2, 2], 0), replicated_map((4, 4), 2)
    pair = (tgt2, rep2)
    f.add("int-pass", "Two requests with holders [0,1], answered 1 and 0", ["answer:int"], pair, accept(FROM_ANSWERS),
          answers=[1, 0])
    f.add("count-too-few", "One answer for two requests: exactly one answer per request", ["answer:count"], pair,
          refuse(IRP), answers=[1])
    f.add("count-too-many", "Three answers for two requests", ["answer:count"], pair, refuse(IRP), answers=[1, 0, 0])
    f.add("count-none", "No answers for two requests", ["answer:count"], pair, refuse(IRP), answers=[])
    f.add("location-not-candidate", "Location 7 holds nothing of the request", ["answer:location", "R29"], pair,
          refuse(IRP), answers=[7, 0])
    bt, bs = LAYOUTS["bigcode"](4), LAYOUTS["bigcode"](2)
    for value, name in [(999, "999"), (True, "true"), (1.5, "float"), (None, "null"), ("0", "string")]:
        ans = [value if len(r["candidates"]) > 1 else r["candidates"][0] for r in requests_of({"param": (bt, bs)})]
        f.add(f"R29-a11-{name}", f"A11: bigcode 2 -> 4 with every kv request answered {json.dumps(value)}: not a "
              "validated int holder", ["R29", "A11", "answer:type"], (bt, bs), refuse(IRP), answers=ans)
    req = requests_of({"param": (bt, bs)})
    half = [r["target_location"] // 2 if len(r["candidates"]) > 1 else r["candidates"][0] for r in req]
    f.add("bigcode-selector-target-half", "§4.6 bigcode selector target_rank // 2: kv from location t//2",
          ["golden", "answer:int"], (bt, bs), accept(FROM_ANSWERS), answers=half)
    first = [r["candidates"][0] for r in req]
    f.add("bigcode-first-holder", "§4.6 bigcode with the lowest holder everywhere", ["golden", "answer:int"],
          (bt, bs), accept(FROM_ANSWERS), answers=first)
    last = [r["candidates"][-1] for r in req]
    f.add("bigcode-max-candidate", "§4.6 bigcode selector max(candidates)", ["golden", "answer:int"], (bt, bs),
          accept(FROM_ANSWERS), answers=last)
    f.add("single-holder-wrong-location", "A single-holder request answered with a location that holds nothing "
          "of it", ["answer:location", "answer:single-holder"], (bt, bs), refuse(IRP),
          answers=[1 if len(r["candidates"]) == 1 and r["candidates"][0] == 0 else r["candidates"][0] for r in req])
    f.add("single-holder-as-one-part", "A single-holder request answered with one part covering its box",
          ["answer:single-holder", "splits"], (bt, bs), accept(FROM_ANSWERS),
          answers=[[part(r["logical_origin"], r["shape"], r["candidates"][0])] if i == 0 else r["candidates"][0]
                   for i, r in enumerate(req)])
    rows = [[part((0, 0), (1, 4), 0), part((1, 0), (1, 4), 1)], 1]
    f.add("split-rows-pass", "Request rows 0-1 split into one row per holder", ["answer:split"], pair,
          accept(FROM_ANSWERS), answers=rows, min_split_bytes=1)
    f.add("split-columns-pass", "Arbitrary sub-boxes: a request split into column halves",
          ["answer:split"], pair, accept(FROM_ANSWERS), answers=[[part((0, 0), (2, 2), 1), part((0, 2), (2, 2), 0)],
                                                                  [part((2, 0), (2, 3), 0), part((2, 3), (2, 1), 1)]],
          min_split_bytes=1)
    f.add("split-three-parts-pass", "A split into three parts, two from the same holder but not adjacent in order",
          ["answer:split"], (full((6, 4)), replicated_map((6, 4), 2)), accept(FROM_ANSWERS),
          answers=[[part((0, 0), (2, 4), 0), part((2, 0), (2, 4), 1), part((4, 0), (2, 4), 0)]], min_split_bytes=1)
    f.add("split-one-part-pass", "A one-part list is not a split: the default min_split_bytes does not apply",
          ["answer:split", "min-split"], pair, accept(FROM_ANSWERS), answers=[[part((0, 0), (2, 4), 1)], 0])
    f.add("split-outside-box", "A part shifted one row up leaves the request's box", ["answer:outside"], pair,
          refuse(IRP), answers=[[part((0, 0), (1, 4), 0), part((1, 0), (1, 4), 1)],
                                [part((1, 0), (1, 4), 0), part((3, 0), (1, 4), 1)]], min_split_bytes=1)
    f.add("split-overlap", "Two parts overlap in row 1 (and hold 12 elements of an 8-element box)",
          ["answer:overlap"], pair, refuse(IRP),
          answers=[[part((0, 0), (2, 4), 0), part((1, 0), (1, 4), 1)], 0], min_split_bytes=1)
    f.add("split-overlap-with-gap", "A gap and an overlap of equal size: volumes sum, the parts do not tile",
          ["answer:overlap", "answer:gap"], pair, refuse(IRP),
          answers=[[part((0, 0), (1, 4), 0), part((0, 0), (1, 4), 1)], 0], min_split_bytes=1)
    f.add("split-gap", "One row of a two-row request is left unwritten", ["answer:gap"], pair, refuse(IRP),
          answers=[[part((0, 0), (1, 4), 0)], 1], min_split_bytes=1)
    f.add("split-part-not-candidate", "A part names location 5, which holds nothing", ["answer:location"], pair,
          refuse(IRP), answers=[[part((0, 0), (1, 4), 0), part((1, 0), (1, 4), 5)], 1], min_split_bytes=1)
    f.add("split-part-bool-location", "A part's location is true, not an int", ["answer:type"], pair, refuse(IRP),
          answers=[[part((0, 0), (1, 4), 0), part((1, 0), (1, 4), True)], 1], min_split_bytes=1)
    f.add("split-part-wrong-ndim", "A part with 1 axis in a 2-axis request", ["answer:ndim"], pair, refuse(IRP),
          answers=[[part((0,), (4,), 0), part((1, 0), (1, 4), 1)], 1], min_split_bytes=1)
    f.add("split-part-zero-extent", "A zero-extent part beside one covering the box: inside, disjoint, volumes sum, "
          "but a part must have positive extents (and 0 < min_split_bytes)", ["answer:extent"], pair,
          refuse(IRP), answers=[[part((0, 0), (0, 4), 0), part((0, 0), (2, 4), 1)], 1], min_split_bytes=1)
    f.add("split-part-negative-extent", "Rows 0-2 plus a (-1,-4) part of volume +4: volumes sum to 16 but row 3 "
          "is never written", ["answer:extent"], (full((4, 4)), rep2), refuse(IRP),
          answers=[[part((0, 0), (3, 4), 0), part((3, 0), (-1, -4), 1)]], min_split_bytes=1)
    f.add("split-empty-list", "An empty split leaves the whole box unwritten", ["answer:gap"], pair, refuse(IRP),
          answers=[[], 1], min_split_bytes=1)
    f.add("split-part-float-origin", "A part origin of floats (0.0) is not a coordinate", ["answer:type"], pair,
          refuse(IRP), answers=[[part((0.0, 0), (1, 4), 0), part((1, 0), (1, 4), 1)], 1], min_split_bytes=1)
    f.add("split-part-not-object", "A part that is a string", ["answer:malformed"], pair, refuse(IRP),
          answers=[["part"], 1], min_split_bytes=1)
    f.add("split-part-missing-field", "A part without source_location", ["answer:malformed"], pair, refuse(IRP),
          answers=[[{"logical_origin": [0, 0], "shape": [2, 4]}], 1], min_split_bytes=1)
    f.add("answer-object", "An answer that is an object, neither an int nor a list of parts", ["answer:type"], pair,
          refuse(IRP), answers=[{"location": 0}, 1])
    f.add("min-split-pass-at-floor", "Parts of 4 elements meet min_split_bytes=4 (no element_size: elements)",
          ["min-split", "answer:split"], pair, accept(FROM_ANSWERS), answers=rows, min_split_bytes=4)
    f.add("min-split-below-floor", "Parts of 4 elements are below min_split_bytes=5", ["min-split"], pair,
          refuse(IRP), answers=rows, min_split_bytes=5)
    f.add("min-split-bytes-pass", "With element_size 4 a 4-element part is 16 bytes, meeting min_split_bytes=16",
          ["min-split", "element_size", "answer:split"], pair, accept(FROM_ANSWERS), answers=rows,
          min_split_bytes=16, element_size={"param": 4})
    f.add("min-split-bytes-below", "With element_size 4 a 4-element part is 16 bytes, below min_split_bytes=17",
          ["min-split", "element_size"], pair, refuse(IRP), answers=rows, min_split_bytes=17,
          element_size={"param": 4})
    f.add("min-split-default-floor", "Without min_split_bytes the default floor (8 MiB, the staging budget) "
          "refuses splitting a 16-element request", ["min-split"], pair, refuse(IRP), answers=rows)
    f.add("max-parts-per-request-pass", "Two parts within max_parts_per_request=2", ["budget", "answer:split"], pair,
          accept(FROM_ANSWERS), answers=rows, budget={"max_parts_per_request": 2}, min_split_bytes=1)
    f.add("max-parts-per-request-exceeded", "Two parts exceed max_parts_per_request=1", ["budget"], pair,
          refuse(IRP, "max_parts_per_request"), answers=rows, budget={"max_parts_per_request": 1}, min_split_bytes=1)
    alternating = [[part((i, 0), (1, 4), i % 2) for i in range(4)]]
    one_target = (full((4, 4)), rep2)
    f.add("splits-exceed-max-segments", "Four alternating parts need four segments, max_segments=2: the policy's "
          "splits break the budget", ["budget", "max_segments"], one_target, refuse(IRP, "max_segments"),
          answers=alternating, budget={"max_segments": 2}, min_split_bytes=1)
    f.add("splits-within-max-segments", "The same four alternating parts within max_segments=4", ["budget",
          "answer:split"], one_target, accept(FROM_ANSWERS), answers=alternating, budget={"max_segments": 4},
          min_split_bytes=1)
    whole = {"logical_shape": [4, 4], "segments": [{"shape": [4, 4], "source": [0, 0, [4, 1]],
                                                     "target": [0, 0, [4, 1]]}]}
    unsplit = len(json.dumps(whole, separators=(",", ":"), sort_keys=True))
    f.add("splits-exceed-max-plan-bytes", f"Unsplit, the plan encodes to {unsplit} bytes; four alternating parts "
          "encode past max_plan_bytes=150, and the RFC makes a split over budget a policy error",
          ["budget", "max_plan_bytes", "rfc"], one_target, refuse(IRP, "max_plan_bytes"), answers=alternating,
          budget={"max_plan_bytes": 150}, min_split_bytes=1)
    rows4 = {"logical_shape": [4, 4], "segments": [
        {"shape": [1, 4], "source": [i % 2, 4 * i, [4, 1]], "target": [0, 4 * i, [4, 1]]} for i in range(4)
    ]}
    split_size = len(json.dumps(rows4, separators=(",", ":"), sort_keys=True))
    f.add("splits-within-max-plan-bytes", f"The four alternating one-row parts cannot fold and encode to exactly "
          f"{split_size} bytes = max_plan_bytes", ["budget", "max_plan_bytes", "answer:split"], one_target,
          accept(FROM_ANSWERS), answers=alternating, budget={"max_plan_bytes": split_size}, min_split_bytes=1)
    rev_t = pmap((4, 4), {5: (2, 4), 2: (2, 4)}, {5: [piece((2, 4), 0, (4, 1), 0, (4, 1), [5])],
                                                   2: [piece((2, 4), 8, (4, 1), 0, (4, 1), [2])]})
    f.add("request-order-by-location", "Target location 2 (rows 2-3) comes before location 5 (rows 0-1): "
          "answers index requests in (location, origin) order", ["answer:order"], (rev_t, rep2),
          accept(FROM_ANSWERS), answers=[1, 0])
    return f


# ---------------------------------------------------------------------------------------------
# batches: multi-parameter batches, balancing across parameters, endpoints, nodes, no partial plan.


def batches() -> Family:
    f = Family("batches", "Multi-parameter batches: balancing that must span parameters, endpoints (local first, "
               "per-process load), element sizes, process nodes, no partial plans.")
    rep = replicated_map((4, 4), 2)
    one = full((4, 4))
    f.add("balance-spans-two-parameters", "Two (4,4) parameters held by locations 0 and 1: balanced per batch each "
          "holder sends one (16 elements); per parameter both come from location 0", ["balance", "batch_policy"],
          {"a": (one, rep), "b": (one, rep)}, accept(max_sender_load=16))
    f.add("balance-three-parameters", "Sizes 8, 4, 4 over two holders: the busiest sender can be held to 8",
          ["balance", "batch_policy"],
          {"a": (full((8,)), replicated_map((8,), 2)), "b": (full((4,)), replicated_map((4,), 2)),
           "c": (full((4,)), replicated_map((4,), 2))}, accept(max_sender_load=8))
    f.add("balance-by-bytes", "Element sizes 2, 8, 4 bytes make 8-, 4- and 4-element parameters weigh 16, 32 and "
          "16 bytes: balance bytes, not elements", ["balance", "batch_policy", "element_size"],
          {"a": (full((8,)), replicated_map((8,), 2)), "b": (full((4,)), replicated_map((4,), 2)),
           "c": (full((4,)), replicated_map((4,), 2))}, accept(max_sender_load=32),
          element_size={"a": 2, "b": 8, "c": 4})
    three = replicated_map((4,), 3)
    f.add("balance-by-process", "Source locations 0 and 1 run in process 0, location 2 in process 1: balance per "
          "process, so the two parameters leave from different processes", ["balance", "batch_policy", "endpoints"],
          {"a": (full((4,)), three), "b": (full((4,)), three)}, accept(max_sender_load=4),
          endpoints={"source": {0: 0, 1: 0, 2: 1}, "target": {0: 5}})
    src = replicate(contiguous_split_map((8, 8), [4, 4], 0), 2)
    tgt = contiguous_split_map((8, 8), [4, 4], 0)
    local = [{"parameter": "w", "target_location": 0, "logical_origin": [0, 0], "shape": [4, 8], "source_location": 2},
             {"parameter": "w", "target_location": 1, "logical_origin": [4, 0], "shape": [4, 8], "source_location": 3}]
    f.add("local-first", "Targets run in the processes of source locations 2 and 3: every request has a local "
          "holder and must use it", ["local-first", "batch_policy", "endpoints"], {"w": (tgt, src)},
          accept(local), endpoints={"source": {0: 0, 1: 1, 2: 2, 3: 3}, "target": {0: 2, 1: 3}})
    local2 = [{**e, "parameter": n} for n in ("a", "b") for e in local]
    f.add("local-first-over-balance", "Two parameters whose every request is local: local copies win even though "
          "locations 2 and 3 then serve everything", ["local-first", "batch_policy", "endpoints"],
          {"a": (tgt, src), "b": (tgt, src)}, accept(local2),
          endpoints={"source": {0: 0, 1: 1, 2: 2, 3: 3}, "target": {0: 2, 1: 3}})
    row2, col4 = contiguous_split_map((8, 8), [4, 4], 0), contiguous_split_map((8, 8), [2] * 4, 1)
    f.add("endpoints-missing-source", "Endpoints bind no process to source location 1, which holds data",
          ["endpoints"], {"w": (col4, row2)}, refuse(IME, "location 1"),
          endpoints={"source": {0: 0}, "target": {0: 0, 1: 1, 2: 2, 3: 3}})
    f.add("endpoints-missing-target", "Endpoints bind no process to target location 3, which receives data",
          ["endpoints"], {"w": (col4, row2)}, refuse(IME, "location 3"),
          endpoints={"source": {0: 0, 1: 1}, "target": {0: 0, 1: 1, 2: 2}})
    idle = pmap((8, 8), {**row2.shard_shapes, 2: (0, 8)},
                {**row2.pieces_by_rank, 2: [piece((0, 8), 64, (8, 1), 0, (8, 1), [2])]})
    f.add("endpoints-skip-dataless-location", "A source location with an empty shard needs no process binding",
          ["endpoints"], {"w": (col4, idle)}, accept(),
          endpoints={"source": {0: 0, 1: 1}, "target": {0: 0, 1: 1, 2: 2, 3: 3}})
    f.add("endpoints-disjoint-processes", "Source locations on processes 0-3, target locations on 4-7 (the "
          "disjoint-endpoints layout)", ["endpoints"],
          {"w": (contiguous_split_map((32, 32), [8] * 4, 1), contiguous_split_map((32, 32), [8] * 4, 0))}, accept(),
          endpoints={"source": {i: i for i in range(4)}, "target": {i: 4 + i for i in range(4)}})
    ends = {"source": {0: 0, 1: 1}, "target": {0: 0, 1: 1, 2: 2, 3: 3}}
    f.add("process-node-accepted", "Endpoints plus process -> node bindings plan", ["process_node", "endpoints"],
          {"w": (col4, row2)}, accept(), endpoints=ends, process_node={0: 0, 1: 0, 2: 1, 3: 1})
    f.add("process-node-needs-endpoints", "Nodes are known per process, so process_node without endpoints is "
          "refused", ["process_node"], {"w": (col4, row2)}, refuse(IME, "endpoints"), process_node={0: 0})
    f.add("process-node-missing-process", "process_node names no node for target process 3", ["process_node",
          "endpoints"], {"w": (col4, row2)}, refuse(IME, "process 3"), endpoints=ends,
          process_node={0: 0, 1: 0, 2: 1})
    bad = pmap((4,), {0: (4,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0]), piece((2,), 2, (1,), 0, (1,), [0])]})
    f.add("no-partial-plan", "One invalid parameter refuses the whole batch, even after a valid one",
          ["no-partial-plan", "R17"], {"a_good": (col4, row2), "b_bad": (full((4,)), bad)},
          refuse(IME, "b_bad"))
    f.add("no-partial-plan-reshape", "R0 in the second parameter refuses the batch", ["no-partial-plan", "R0"],
          {"a": (col4, row2), "b": (full((8, 8)), full((64,)))}, refuse(IME, "describes"))
    f.add("budget-per-parameter", "max_segments=8 applies per parameter: two 8-segment parameters fit",
          ["budget"], {"a": (col4, row2), "b": (col4, row2)}, accept(), budget={"max_segments": 8})
    f.add("budget-per-parameter-exceeded", "max_segments=7 refuses the batch when one parameter needs 8",
          ["budget", "no-partial-plan"], {"a": (full((8, 8)), full((8, 8))), "b": (col4, row2)},
          refuse(ATE, "max_segments"), budget={"max_segments": 7})
    f.add("element-size-zero", "An element size of 0 bytes is refused", ["element_size"], {"w": (col4, row2)},
          refuse(IME, "element_size"), element_size={"w": 0})
    f.add("element-size-missing-parameter", "element_size must name every parameter of the batch",
          ["element_size"], {"a": (col4, row2), "b": (col4, row2)}, refuse(IME, "element_size"),
          element_size={"a": 2})
    pairs = {"b": (full((4, 4)), rep), "a": (contiguous_split_map((4, 4), [2, 2], 0), rep)}
    f.add("answers-span-parameters", "Scripted answers index one request list over all parameters, in name order",
          ["answers", "answer:order"], pairs, accept(FROM_ANSWERS), answers=[1, 0, 1])
    f.add("answers-span-parameters-count", "Two answers for three requests across two parameters", ["answers",
          "answer:count"], pairs, refuse(IRP), answers=[1, 0])
    f.add("answers-split-in-second-parameter", "A split in the second parameter's request, ints elsewhere",
          ["answers", "splits"], pairs, accept(FROM_ANSWERS), min_split_bytes=1,
          answers=[1, 0, [part((0, 0), (4, 2), 0), part((0, 2), (4, 2), 1)]])
    suite: dict[str, Pair] = {}
    for name, build in LAYOUTS.items():
        for s, t in ((1, 2), (2, 4), (4, 2)):
            suite[f"{name}.{s}to{t}"] = (build(t), replicate(build(s), 2))
    src_locs = sorted({r for _, s in suite.values() for r in s.shard_shapes})
    tgt_locs = sorted({r for t, _ in suite.values() for r in t.shard_shapes})
    f.add("layout-suite-one-batch", "The §4.6 layouts (TPxDP=2 sources) as one 21-parameter batch with endpoints",
          ["layout", "endpoints", "replicas"], suite, accept(),
          endpoints={"source": {r: r for r in src_locs}, "target": {r: 100 + r for r in tgt_locs}})
    return f


# ---------------------------------------------------------------------------------------------
# peers: layouts the planners people run can express (DCP, Megatron-Core, Awex), and one minimal
# reproduction per finding about them.


def _stacked(shape: Sequence[int], rows: Sequence[int], holders: Sequence[int]) -> ParamAffineMap:
    """Every holder keeps the whole tensor as separate row chunks of the given sizes (one piece
    each, stacked in its shard): several chunks per rank, as a DCP save of a sharded tensor has."""
    shape = tuple(shape)
    cols = volume(shape[1:])
    strides = tuple(row_major_strides(shape))
    pieces: list[AffinePiece] = []
    start = 0
    for r in rows:
        pieces.append(piece((r, *shape[1:]), start * cols, strides, start * cols, strides, holders))
        start += r
    return pmap(shape, {h: shape for h in holders}, {h: list(pieces) for h in holders})


def _experts(hidden: int, ffn: int, experts: int, ep: int, dp: int) -> dict[str, ParamAffineMap]:
    """Per-expert weights under EP x DP: expert ``e`` lives on EP rank ``e // (experts/ep)`` of
    every DP replica (locations ``copy * ep + ep_rank``)."""
    per = experts // ep
    out: dict[str, ParamAffineMap] = {}
    for e in range(experts):
        owners = [c * ep + e // per for c in range(dp)]
        out[f"experts.{e}.w1"] = pmap((ffn, hidden), {o: (ffn, hidden) for o in owners},
                                      {o: [piece((ffn, hidden), 0, (hidden, 1), 0, (hidden, 1), owners)]
                                       for o in owners})
    return out


def peers() -> Family:
    f = Family("peers", "Realistic trainer -> engine layouts that DCP, Megatron-Core and Awex can express (pure DP, "
               "TPxDP on either axis, interleaved fused weights, EP experts, PP stages, uneven TP, replicated "
               "parameters), and one minimal reproduction per finding about those planners.")
    h, ffn = 16, 32
    for tp_s, dp_s, tp_t in ((1, 4, 4), (1, 2, 2), (2, 2, 4), (2, 2, 2), (4, 2, 2), (2, 4, 8), (4, 1, 2), (8, 1, 4)):
        for axis, shape in ((0, (ffn, h)), (1, (h, ffn))):
            src = replicate(contiguous_split_map(shape, split(shape[axis], tp_s), axis), dp_s)
            tgt = contiguous_split_map(shape, split(shape[axis], tp_t), axis)
            f.add(f"tp{tp_s}xdp{dp_s}-to-tp{tp_t}-axis{axis}", f"Trainer TP={tp_s} x DP={dp_s} -> engine TP={tp_t}, "
                  f"both split on axis {axis} ({'column-parallel' if axis == 0 else 'row-parallel'} weight)",
                  ["peers", "layout", "replicas"], (tgt, src), accept())
    for tp_s, dp_s in ((1, 2), (2, 2), (1, 4)):
        src = replicate(replicated_map((h,), 1), tp_s * dp_s)
        f.add(f"layernorm-{tp_s}x{dp_s}-to-tp4", f"A replicated parameter (layer norm) on TP={tp_s} x DP={dp_s} -> "
              "replicated on 4 engine ranks", ["peers", "replicated"], (replicated_map((h,), 4), src), accept(),
              unless_seen=True)  # only TP x DP counts: 1x4 holds what 2x2 holds
    for stride, tp_s, tp_t in ((2, 2, 4), (2, 4, 2), (3, 2, 1), (3, 1, 2)):
        size = 3 * 2 * 4 * 4
        def fused(tp: int, st: int = stride, n: int = size) -> ParamAffineMap:
            unit = n // (tp * st)
            shards = {r: (unit * st, h) for r in range(tp)}
            pieces = {r: [piece((unit, h), (k * tp + r) * unit * h, (h, 1), k * unit * h, (h, 1), [r])
                          for k in range(st)] for r in range(tp)}
            return pmap((n, h), shards, pieces)
        f.add(f"fused-stride{stride}-tp{tp_s}-to-tp{tp_t}", f"A fused weight interleaved {stride} ways (gate/up or "
              f"QKV, Megatron's partition_stride={stride}) on TP={tp_s} -> TP={tp_t}", ["peers", "fused"],
              (fused(tp_t), fused(tp_s)), accept())
    for ep_s, dp_s, ep_t in ((2, 2, 4), (4, 1, 2), (2, 1, 1)):
        src_e = _experts(h, ffn, 4, ep_s, dp_s)
        tgt_e = _experts(h, ffn, 4, ep_t, 1)
        f.add(f"experts-ep{ep_s}xdp{dp_s}-to-ep{ep_t}", f"Four experts, EP={ep_s} x DP={dp_s} -> EP={ep_t}: each "
              "expert a parameter of its own, "
              + ("read from one of its DP copies" if dp_s > 1 else "held once (no replica to choose)"),
              ["peers", "experts", "replicas"] if dp_s > 1 else ["peers", "experts"],
              {n: (tgt_e[n], src_e[n]) for n in sorted(src_e)}, accept())
    def stage(i: int) -> ParamAffineMap:
        return relabel(contiguous_split_map((ffn, h), [16, 16], 0), {0: 2 * (i // 2), 1: 2 * (i // 2) + 1})

    stages = {f"layers.{i}.w": (contiguous_split_map((ffn, h), [8] * 4, 0), stage(i)) for i in range(4)}
    f.add("pp2-stages-to-tp4", "Four layers in two PP stages on disjoint locations (0-1, 2-3), TP=2 each -> "
          "one TP=4 engine", ["peers", "pp"], stages, accept())
    for shape, s, t in (((10, 8), 3, 2), ((10, 8), 4, 3), ((7, 5), 2, 3)):
        f.add(f"uneven-tp{s}-to-tp{t}-{shape[0]}x{shape[1]}", f"Uneven TP: {shape[0]} rows over {s} -> {t} ranks "
              "(DeepSpeed's split: the first rows % ranks ranks hold one row more)", ["peers", "uneven"],
              (contiguous_split_map(shape, split(shape[0], t), 0), contiguous_split_map(shape, split(shape[0], s), 0)),
              accept())
    # Layouts as torch places DTensors (refplan.interop.from_dtensor), the form DCP users save and load.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from ..interop import from_dtensor

    dt: list[tuple[str, tuple[int, ...], tuple[int, ...], list[Any], tuple[int, ...], list[Any], str]] = [
        ("fsdp4-to-fsdp2", (24, 16), (4,), [Shard(0)], (2,), [Shard(0)], "FSDP2 on 4 ranks -> 2"),
        ("fsdp3-uneven-to-fsdp4", (10, 8), (3,), [Shard(0)], (4,), [Shard(0)],
         "FSDP2 over 3 ranks of 10 rows (torch's chunks 4,4,2) -> 4 ranks (3,3,3,1)"),
        ("fsdp4-empty-shard-to-fsdp2", (3, 8), (4,), [Shard(0)], (2,), [Shard(0)],
         "3 rows over 4 ranks: the last rank's local tensor is empty"),
        ("hsdp-2x2-to-tp4", (16, 8), (2, 2), [Replicate(), Shard(0)], (4,), [Shard(1)],
         "HSDP (2 replicas x FSDP 2) -> TP 4 on columns"),
        ("fsdp2-tp2-to-tp4", (16, 8), (2, 2), [Shard(0), Shard(1)], (4,), [Shard(1)],
         "2-D: FSDP 2 on rows x TP 2 on columns -> TP 4 on columns"),
        ("nested-shard-to-fsdp2", (16, 4), (2, 2), [Shard(0), Shard(0)], (2,), [Shard(0)],
         "Two mesh axes both sharding rows (nested) -> FSDP 2"),
        ("tp2-fsdp2-strided-to-tp4", (16, 4), (2, 2), [_StridedShard(0, split_factor=2), Shard(0)], (4,),
         [Shard(0)], "FSDP2 over TP: rows strided-sharded on the FSDP axis (_StridedShard) -> TP 4"),
    ]
    for slug, gshape, s_mesh, s_pl, t_mesh, t_pl, why in dt:
        f.add(f"dtensor-{slug}", f"DTensor layouts: {why}", ["peers", "dtensor"],
              (from_dtensor(gshape, t_mesh, t_pl), from_dtensor(gshape, s_mesh, s_pl)), accept())
    # Findings, one minimal reproduction each.
    rows = [8, 1, 1, 1, 1, 1, 1]
    # The id is kept from an early reading of DCP's dedup, so that results keyed by it stay comparable.
    # What it states is a property of any balancing policy, not a DCP result: DCP's front door saves
    # this tensor as one 56-element chunk per replica (a contract result there), and the DCP finding
    # proper is the HSDP case below.
    f.add("finding-dcp-dedup-counts-items", "Two replicas each hold 14 rows in pieces of 8,1,1,1,1,1,1 rows: "
          "balanced by bytes, no holder sends more than 8 rows; balanced by the number of pieces, one sends 11 "
          "(a property of balancing, not a DCP result: DCP saves this tensor as one chunk per replica)",
          ["peers", "balance"],
          (full((14, 4)), _stacked((14, 4), rows, [0, 1])), accept(max_sender_load=8 * 4))
    # The same cause through DCP's front door: real DTensors on an HSDP mesh (2 replicas x FSDP 2).
    # torch's chunking leaves FSDP shard 1 of the 1-row w0 empty, and DCP weighs that empty chunk
    # as all of w0 (8 elements), so w1's second chunk goes to rank 1, which already writes the
    # replicated w2: rank 1 writes 16 elements, rank 3 none, where every rank can write 8.
    hsdp = [Replicate(), Shard(0)]
    f.add("finding-dcp-dedup-dtensor-hsdp", "HSDP DTensors (2 replicas x FSDP 2): a 1-row w0 (torch's chunking "
          "leaves FSDP shard 1 empty), a 4-row w1 and a replicated w2, saved by DCP and loaded on one rank: every "
          "rank can write 8 elements (DCP's dedup weighs rank 3's empty chunk of w0 as all of w0 and gives w1's "
          "second chunk to rank 1, which already writes w2: 16)", ["peers", "finding", "dcp", "balance", "dtensor"],
          {"w0": (full((1, 8)), from_dtensor((1, 8), (2, 2), hsdp)),
           "w1": (full((4, 4)), from_dtensor((4, 4), (2, 2), hsdp)),
           "w2": (full((2, 4)), from_dtensor((2, 4), (2, 2), [Replicate(), Replicate()]))},
          accept(max_sender_load=8))
    half = pmap((8, 4), {0: (4, 4)}, {0: [piece((4, 4), 0, (4, 1), 0, (4, 1), [0])]})
    f.add("finding-dcp-one-plan-skips-coverage", "One source location holds only half of the tensor: refused (the "
          "source does not cover it). Named for DCP's global plan check, which by design tests coverage only across "
          "several plans; no DTensor states this layout, so DCP's front door never sees it (no DCP defect)",
          ["peers", "finding", "dcp", "R25"],
          (full((8, 4)), half), refuse(IME))
    f.add("finding-megatron-pure-dp-reads-one-rank", "Pure data parallel source (TP=1, DP=4) -> TP=4: four holders "
          "can each send a quarter (Megatron's one-DP-group fast path reads everything from the first: documented "
          "in 0.16.1, against the round robin's own docstring in 0.19.2)",
          ["peers", "finding", "megatron", "balance"],
          (contiguous_split_map((ffn, h), [8] * 4, 0), replicated_map((ffn, h), 4)), accept(max_sender_load=8 * h))
    tp2 = contiguous_split_map((ffn, h), [16, 16], 0)
    f.add("finding-megatron-tp2dp2-uses-one-replica", "Two parameters, TP=2 x DP=2 -> TP=2 on other ranks: one can "
          "be read from each replica, so no sender moves more than half a parameter (Megatron reads both from "
          "one replica per destination rank)", ["peers", "finding", "megatron", "balance"],
          {"a": (tp2, replicate(tp2, 2)), "b": (tp2, replicate(tp2, 2))}, accept(max_sender_load=16 * h))
    ranks = {r: r for r in range(4)}
    f.add("finding-megatron016-collocated-reads-replica-0", "Collocated refit on four processes, TP=2 x DP=2 -> "
          "TP=2 x DP=2 (each engine shard on the process of the trainer shard it equals, as a refit inside one world "
          "places them): every target has a local holder, so nothing need leave its process (Megatron-Core 0.16.1 "
          "reads every shard from the first replica, processes 0-1 sending to 2-3, by its documented choice of a "
          "DP bucket's first entry: an enhancement for 0.16.1, not a defect)",
          ["peers", "finding", "megatron", "local-first", "endpoints"],
          {"a": (replicate(tp2, 2), replicate(tp2, 2)), "b": (replicate(tp2, 2), replicate(tp2, 2))},
          accept(max_sender_load=0), endpoints={"source": ranks, "target": ranks})
    f.add("finding-awex-one-inference-replica", "Two parameters, two training replicas, one inference replica: "
          "each training replica can send one parameter (Awex, by design, pairs inference replica i with training "
          "replica i mod T, so replica 0 sends both: an enhancement for Awex, not a defect)",
          ["peers", "finding", "awex", "balance"],
          {"a": (full((ffn, h)), replicated_map((ffn, h), 2)), "b": (full((ffn, h)), replicated_map((ffn, h), 2))},
          accept(max_sender_load=ffn * h))
    overlap = pmap((8, 4), {0: (6, 4), 1: (4, 4)}, {0: [piece((6, 4), 0, (4, 1), 0, (4, 1), [0])],
                                                    1: [piece((4, 4), 16, (4, 1), 0, (4, 1), [1])]})
    f.add("finding-awex-overlapping-shards", "Source shards [0,6) and [4,8) overlap without being equal (and "
          "declare one holder each): refused. Awex's meta resolver never builds such shards, so its front door "
          "never sees them (no Awex defect)",
          ["peers", "finding", "awex", "R21"], (full((8, 4)), overlap), refuse(IME))
    f.add("finding-awex-shape-mismatch", "The two sides disagree on the logical shape ((8,4) vs (4,8)): refused "
          "with a clear error, as Awex's own metadata check refuses it (Inconsistent shape)",
          ["peers", "finding", "awex", "R0"],
          (full((8, 4)), full((4, 8))), refuse(IME))
    return f


# ---------------------------------------------------------------------------------------------


FAMILIES: tuple[Callable[[], Family], ...] = (rules, layouts, replicas, answers, batches, peers)


def build_corpus() -> dict[str, str]:
    """File name -> file text for every family, deterministically."""
    out: dict[str, str] = {}
    for make in FAMILIES:
        family = make()
        out[f"{family.name}.json"] = dump_case_file(family.name, family.description, family.cases)
    return out


def write_corpus(directory: Path = CASES_DIR, *, check: bool = False) -> list[str]:
    """Write (or with ``check``, compare) the corpus; return the names of files that differ."""
    changed: list[str] = []
    files = build_corpus()
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = directory / name
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old != text:
            changed.append(name)
            if not check:
                path.write_text(text, encoding="utf-8")
    stale = sorted(p.name for p in directory.glob("*.json") if p.name not in files)
    changed.extend(stale)
    if not check:
        for name in stale:
            (directory / name).unlink()
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refplan.cli.generate_corpus", description=__doc__.split("\n")[0])
    parser.add_argument("directory", nargs="?", default=str(CASES_DIR), help="where the case files go")
    parser.add_argument("--check", action="store_true", help="exit 1 if regenerating would change any file")
    args = parser.parse_args(argv)
    changed = write_corpus(Path(args.directory), check=args.check)
    verb = "would change" if args.check else "rewrote"
    print(f"{verb} {len(changed)} file(s){': ' + ', '.join(changed) if changed else ''}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
