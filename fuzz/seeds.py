"""Seed documents: valid layouts from the builders, the §4.6 golden layouts, refusal cases, and
hostile JSON. ``fuzz/make_corpus.py`` writes them to ``fuzz/corpus/``; the hypothesis engine also
uses them as starting points for its mutations.
"""

from __future__ import annotations

import json
from typing import Any

from refplan.files import MapsBatch, dump_maps, dump_plans
from refplan.formats import MAPS_FORMAT
from refplan.maps import (
    LAYOUTS,
    AffinePiece,
    ParamAffineMap,
    contiguous_split_map,
    replicate,
    replicated_map,
    split,
    sub_param_map,
)
from refplan.planner import plan_transfers
from refplan.requests import TransferEndpoints

__all__ = ["hostile_texts", "maps_doc", "refusal_docs", "split", "valid_docs", "valid_plans_docs"]

Pair = tuple[ParamAffineMap, ParamAffineMap]


def maps_doc(pairs: dict[str, Pair], **extra: Any) -> dict[str, Any]:
    """A ``refplan.maps/1`` document; ``pairs`` maps name -> (target, source)."""
    doc = dump_maps(MapsBatch(pairs))
    doc.update(extra)
    return json.loads(json.dumps(doc))  # type: ignore[no-any-return]


def _layouts(tp: int) -> dict[str, ParamAffineMap]:
    """The executed-coverage layouts of facts §4.6 at TP degree ``tp`` (``maps.LAYOUTS``)."""
    return {name: build(tp) for name, build in LAYOUTS.items()}


def _swapped_selector_source() -> ParamAffineMap:
    """Facts §4.6 selector-address test: two replicas storing the row halves swapped."""
    half = (2, 2)
    a = AffinePiece(half, 0, (2, 1), 0, (2, 1), [0, 1])
    b = AffinePiece(half, 4, (2, 1), 4, (2, 1), [0, 1])
    a1 = AffinePiece(half, 0, (2, 1), 4, (2, 1), [0, 1])
    b1 = AffinePiece(half, 4, (2, 1), 0, (2, 1), [0, 1])
    return ParamAffineMap((4, 2), {0: (4, 2), 1: (4, 2)}, {0: [a, b], 1: [a1, b1]})


def _reversed_pieces(m: ParamAffineMap) -> ParamAffineMap:
    return ParamAffineMap(m.logical_shape, m.shard_shapes, {r: list(p)[::-1] for r, p in m.pieces_by_rank.items()})


def valid_docs() -> dict[str, dict[str, Any]]:
    """Maps documents the planner accepts (and a few it must accept although they look odd)."""
    docs: dict[str, dict[str, Any]] = {}
    docs["row2_to_col4"] = maps_doc(
        {"w": (contiguous_split_map((8, 8), [2, 2, 2, 2], 1), contiguous_split_map((8, 8), [4, 4], 0))}
    )
    for s, t in ((1, 2), (2, 4), (4, 2), (2, 2)):
        src, tgt = _layouts(s), _layouts(t)
        docs[f"layouts_{s}to{t}"] = maps_doc({name: (tgt[name], src[name]) for name in src})
    docs["selector_swapped"] = maps_doc({"w": (replicated_map((4, 2), 1), _swapped_selector_source())})
    docs["identity"] = maps_doc(
        {"w": (contiguous_split_map((6, 4), [3, 3], 0), contiguous_split_map((6, 4), [3, 3], 0))}
    )
    rank39 = ParamAffineMap(
        (4, 16), {3: (4, 8), 9: (4, 8)},
        {3: [AffinePiece((4, 8), 0, (16, 1), 0, (8, 1), [3])], 9: [AffinePiece((4, 8), 8, (16, 1), 0, (8, 1), [9])]},
    )
    docs["rank_namespaces"] = maps_doc({"w": (replicated_map((4, 16), 1), rank39)})
    docs["scale_free_1e9_rows"] = maps_doc(
        {"w": (contiguous_split_map((10**9, 8), [2, 2, 2, 2], 1), contiguous_split_map((10**9, 8), split(10**9, 2), 0))}
    )
    col332 = contiguous_split_map((8, 8), [3, 3, 2], 1)
    docs["determinism_reversed"] = maps_doc({"w": (col332, _reversed_pieces(col332))})
    docs["uneven_tails"] = maps_doc({
        "a": (contiguous_split_map((11, 8), split(11, 4), 0), contiguous_split_map((11, 8), split(11, 2), 0)),
        "b": (contiguous_split_map((23, 5), split(23, 2), 0), contiguous_split_map((23, 5), split(23, 4), 0)),
        "c": (contiguous_split_map((7, 13), split(13, 3), 1), contiguous_split_map((7, 13), [7], 0)),
    })
    tpdp = replicate(contiguous_split_map((16, 8), [8, 8], 0), 2)
    docs["tp2dp2_to_tp4"] = maps_doc(
        {
            "w": (contiguous_split_map((16, 8), [4] * 4, 0), tpdp),
            "b": (replicated_map((8,), 4), replicated_map((8,), 4)),
        },
        endpoints=TransferEndpoints({0: 0, 1: 1, 2: 2, 3: 3}, {0: 0, 1: 1, 2: 2, 3: 3}).to_dict(),
        process_node={"0": 0, "1": 0, "2": 1, "3": 1},
        element_size={"w": 2, "b": 4},
    )
    docs["replicated_1e18"] = maps_doc({"w": (replicated_map((10**18,), 4), replicated_map((10**18,), 2))})
    docs["f_1e9x1e9_split_2to4"] = maps_doc({
        "w": (contiguous_split_map((10**9, 10**9), split(10**9, 4), 1),
              contiguous_split_map((10**9, 10**9), split(10**9, 2), 0)),
    })
    docs["extent_2p62"] = maps_doc(
        {"w": (contiguous_split_map((2**62,), [2**61, 2**61], 0), contiguous_split_map((2**62,), [2**62], 0))}
    )
    docs["empty_pieces"] = maps_doc({
        "w": (sub_param_map((6, 4), (4, 2), [[2, 2, 0], [0, 1, 1]], 0), contiguous_split_map((6, 4), [6], 0)),
    })
    docs["zero_size_tensor"] = maps_doc({"w": (replicated_map((0, 4), 2), replicated_map((0, 4), 1))})
    docs["scalar"] = maps_doc({"w": (replicated_map((), 3), replicated_map((), 1))})
    return docs


def refusal_docs() -> dict[str, dict[str, Any]]:
    """Maps documents the planner must refuse (facts §6 cases and friends)."""
    docs: dict[str, dict[str, Any]] = {}
    full = replicated_map((16, 8), 1)
    half = ParamAffineMap((16, 8), {0: (8, 8)}, {0: [AffinePiece((8, 8), 0, (8, 1), 0, (8, 1), [0])]})
    docs["a1_source_partial"] = maps_doc({"w": (full, half)})
    transpose = ParamAffineMap((8, 8), {0: (8, 8)}, {0: [AffinePiece((8, 8), 0, (1, 8), 0, (8, 1), [0])]})
    docs["a3_transpose"] = maps_doc({"w": (replicated_map((8, 8), 1), transpose)})
    docs["a4_scale"] = maps_doc({"w": (replicated_map((4, 4), 1), replicated_map((4, 4), 2, scale=0.5))})
    double = ParamAffineMap(
        (4, 4), {0: (4, 2), 1: (4, 2)},
        {0: [AffinePiece((2, 2), 0, (4, 1), 0, (2, 1), [0]), AffinePiece((2, 2), 8, (4, 1), 0, (2, 1), [0])],
         1: [AffinePiece((2, 2), 2, (4, 1), 0, (2, 1), [1]), AffinePiece((2, 2), 10, (4, 1), 4, (2, 1), [1])]},
    )
    docs["a5_same_shard_addresses"] = maps_doc({"w": (replicated_map((4, 4), 1), double)})
    flat_shard = ParamAffineMap((4, 4), {0: (16,)}, {0: [AffinePiece((4, 4), 0, (4, 1), 0, (4, 1), [0])]})
    docs["a6_axes"] = maps_doc({"w": (replicated_map((4, 4), 1), flat_shard)})
    docs["a7_reshape"] = maps_doc({"w": (replicated_map((8, 8), 1), replicated_map((64,), 1))})
    no_shard = ParamAffineMap((4,), {0: (4,)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])], 7: []})
    docs["a9_no_shard_shape"] = maps_doc({"w": (replicated_map((4,), 1), no_shard)})
    short = ParamAffineMap((2, 2), {0: (2, 2)}, {0: [AffinePiece((2, 2), 0, (1,), 0, (2, 1), [0])]})
    docs["a12_stride_length"] = maps_doc({"w": (replicated_map((2, 2), 1), short)})
    docs["a14_nonempty_shard"] = maps_doc({"w": (replicated_map((4,), 1), ParamAffineMap((4,), {0: (4,)}, {0: []}))})
    partial = ParamAffineMap((4,), {0: (2,)}, {0: [AffinePiece((2,), 0, (1,), 0, (1,), [0])]})
    docs["a17_target_partial"] = maps_doc({"w": (partial, replicated_map((4,), 1))})
    docs["a18_target_empty"] = maps_doc({"w": (ParamAffineMap((4,), {}, {}), replicated_map((4,), 1))})
    cut = ParamAffineMap(
        (2, 4), {0: (2, 4), 1: (2, 4)},
        {0: [AffinePiece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
         1: [AffinePiece((1, 4), 0, (4, 1), 0, (4, 1), [0, 1]), AffinePiece((1, 4), 4, (4, 1), 4, (4, 1), [0, 1])]},
    )
    docs["a20_different_boundaries"] = maps_doc({"w": (replicated_map((2, 4), 1), cut)})
    docs["volume_above_2p62"] = maps_doc({"w": (replicated_map((2**40, 2**40), 2), replicated_map((2**40, 2**40), 1))})
    docs["extent_above_2p62"] = maps_doc({"w": (replicated_map((2**70,), 2), replicated_map((2**70,), 1))})
    negative = replicated_map((4,), 1).to_dict()
    negative["ranks"][0]["pieces"][0]["source"] = [-4, [1]]
    docs["negative_offset"] = {"format": MAPS_FORMAT, "parameters": {"w": {"target": negative, "source": negative}}}
    return json.loads(json.dumps(docs))  # type: ignore[no-any-return]


def valid_plans_docs() -> dict[str, dict[str, Any]]:
    """``refplan.plans/1`` documents for the valid maps above (small ones only)."""
    from refplan.files import parse_maps

    out: dict[str, dict[str, Any]] = {}
    for name, doc in valid_docs().items():
        batch = parse_maps(doc)
        plans = plan_transfers(batch.pairs, min_split_bytes=0)
        out[name] = json.loads(json.dumps(dump_plans(plans)))
    return out


def hostile_texts() -> dict[str, bytes]:
    """Maps files that are hostile as *text*: the JSON layer must refuse them cleanly."""
    base = json.dumps(maps_doc({"w": (replicated_map((4,), 2), replicated_map((4,), 1))}))
    texts = {
        "nan_shape": base.replace('"logical_shape": [4]', '"logical_shape": [NaN]', 1),
        "infinity_offset": base.replace('"source": [0, [1]]', '"source": [Infinity, [1]]', 1),
        "neg_infinity_stride": base.replace('"dest": [0, [1]]', '"dest": [0, [-Infinity]]', 1),
        "float_extent": base.replace('"shape": [4]', '"shape": [4.0]', 1),
        "bool_extent": base.replace('"shape": [4]', '"shape": [true]', 1),
        "string_extent": base.replace('"shape": [4]', '"shape": ["4"]', 1),
        "null_extent": base.replace('"shape": [4]', '"shape": [null]', 1),
        "exponent_extent": base.replace('"shape": [4]', '"shape": [4e0]', 1),
        "rank_keys_collide": base.replace('"1": {', '"01": {', 1).replace('"0": {', '"1": {', 1),
        "duplicate_key": base.replace('"ranks": {', '"ranks": {"0": {"shard_shape": [4], "pieces": []}, ', 1),
        "duplicate_parameter": base[:-2] + ', "w": ' + base[base.index('{"target"'):-2] + "}}",
        "huge_int_5000_digits": base.replace('"logical_shape": [4]', '"logical_shape": [' + "9" * 5000 + "]", 1),
        "deep_nesting": '{"format": "refplan.maps/1", "parameters": ' + "[" * 5000 + "]" * 5000 + "}",
        "deep_but_parseable": '{"format": "refplan.maps/1", "parameters": {"w": {"target": '
        + "[" * 900 + "]" * 900 + ', "source": 1}}}',
        "bom": "\ufeff" + base,
        "empty": "",
        "null": "null",
        "array": "[]",
        "truncated": base[: len(base) // 2],
        "unicode_digit_rank": base.replace('"1": {', '"\u0661": {', 1),
        "newline_in_name": base.replace('"w"', '"w\\nINJECTED"', 1),
    }
    out = {k: v.encode("utf-8") for k, v in texts.items()}
    out["invalid_utf8"] = base.encode("utf-8").replace(b'"w"', b'"\xff\xfe"', 1)
    out["utf16"] = base.encode("utf-16")
    return out
