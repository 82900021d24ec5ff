"""Hypothesis strategies producing each harness's input bytes (the engine used without atheris).

Inputs are structure-aware: maps come from the layout builders (any family on either side, small
or with 10^9..2^62-sized extents), then are mutated at the document level (junk values where
integers belong, deleted keys, duplicated pieces, colliding location keys) and at the text level
(NaN/Infinity, duplicate keys, 5000-digit integers, deep nesting, truncation, byte flips), so the
same ``one_input`` sees what a coverage-guided byte mutator would reach only slowly.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from fuzz.seeds import hostile_texts, maps_doc, refusal_docs, split, valid_docs, valid_plans_docs
from refplan.files import dump_plans, parse_maps
from refplan.formats import PLANS_FORMAT
from refplan.maps import (
    AffinePiece,
    ParamAffineMap,
    block_gather_map,
    contiguous_split_map,
    replicate,
    replicated_map,
    segmented_map,
    sub_param_map,
)
from refplan.planner import plan_transfers

__all__ = ["STRATEGIES", "maps_bytes"]

BIG = (10**9, 2**31, 2**40, 10**18, 2**62, 2**62 + 1, 2**63)

_SEEDS: dict[str, list[Any]] = {}


def _seeds(kind: str) -> list[Any]:
    if not _SEEDS:
        _SEEDS["valid"] = list(valid_docs().values())
        _SEEDS["refusal"] = list(refusal_docs().values())
        _SEEDS["plans"] = list(valid_plans_docs().values())
        _SEEDS["hostile"] = list(hostile_texts().values())
    return _SEEDS[kind]


@st.composite
def _composition(draw: st.DrawFn, n: int, parts: int, allow_zero: bool = True) -> list[int]:
    """``n`` as ``parts`` non-negative sizes (even split for huge ``n``)."""
    if n > 4096 or parts <= 1:
        return split(n, parts) if parts > 1 else [n]
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=parts - 1, max_size=parts - 1)))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n])]
    if not allow_zero and 0 in sizes:
        return split(n, parts)
    return sizes


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, ...]:
    ndim = draw(st.integers(0, 3))
    if draw(st.integers(0, 9)) == 0:
        return tuple(draw(st.sampled_from((1, 2, 3, *BIG))) for _ in range(ndim))
    return tuple(draw(st.integers(0 if draw(st.integers(0, 15)) == 0 else 1, 12)) for _ in range(ndim))


@st.composite
def layouts(draw: st.DrawFn, shape: tuple[int, ...]) -> ParamAffineMap:
    """A map of ``shape`` from one of the builder families (valid unless the shape is hostile)."""
    ndim = len(shape)
    family = draw(st.sampled_from(("replicated", "contiguous", "tpdp", "sub", "segmented", "gather")))
    degree = draw(st.integers(1, 4))
    if ndim == 0 or family == "replicated":
        return replicated_map(shape, degree)
    axis = draw(st.integers(0, ndim - 1))
    n = shape[axis]
    if family in ("contiguous", "tpdp"):
        m = contiguous_split_map(shape, draw(_composition(n, degree)), axis)
        return replicate(m, draw(st.integers(2, 3))) if family == "tpdp" else m
    if family == "sub":
        subs = draw(_composition(n, draw(st.integers(1, 3))))
        widths = [draw(_composition(s, degree)) for s in subs]
        return sub_param_map(shape, subs, widths, axis)
    if family == "segmented":
        sizes = draw(_composition(n, draw(st.integers(1, 3)), allow_zero=False))
        flags = [draw(st.booleans()) for _ in sizes]
        widths = [draw(_composition(s, degree)) for s, f in zip(sizes, flags) if not f]
        return segmented_map(shape, list(zip(sizes, flags)), axis, degree, widths)
    blocks = [b for b in range(1, min(n, 64) + 1) if n % b == 0] or [1]
    block = draw(st.sampled_from(blocks))
    count = n // block if n else 0
    owner = [draw(st.integers(0, degree - 1)) for _ in range(min(count, 64))]
    if count > 64:
        return contiguous_split_map(shape, split(n, degree), axis)
    return block_gather_map(shape, {r: [b for b in range(count) if owner[b] == r] for r in range(degree)}, block, axis)


def _relabel(m: ParamAffineMap, names: dict[int, int]) -> ParamAffineMap:
    return ParamAffineMap(
        m.logical_shape,
        {names[r]: s for r, s in m.shard_shapes.items()},
        {
            names[r]: [
                AffinePiece(p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides,
                            [names[x] for x in p.locations if x in names], p.scale)
                for p in ps
            ]
            for r, ps in m.pieces_by_rank.items()
        },
    )


@st.composite
def generated_doc(draw: st.DrawFn) -> dict[str, Any]:
    pairs = {}
    for k in range(draw(st.integers(1, 3))):
        shape = draw(shapes())
        target, source = draw(layouts(shape)), draw(layouts(shape))
        if draw(st.integers(0, 7)) == 0:
            ranks = sorted(set(source.ranks))
            names = dict(zip(ranks, draw(st.permutations([r * 3 + 1 for r in ranks]))))
            source = _relabel(source, names)
        pairs[f"p{k}"] = (target, source)
    extra: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        locs = range(16)
        extra["endpoints"] = {"source": {str(r): r % 4 for r in locs}, "target": {str(r): r % 4 for r in locs}}
        if draw(st.booleans()):
            extra["process_node"] = {str(p): p // 2 for p in range(4)}
    if draw(st.integers(0, 3)) == 0:
        extra["element_size"] = {name: draw(st.sampled_from((1, 2, 4, 8))) for name in pairs}
    return maps_doc(pairs, **extra)


_JUNK: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from((True, False, None, 1.0, 0.5, float("nan"), float("inf"), -float("inf"), "1", "")),
    st.sampled_from(("[]", "{}", "[[0]]")).map(json.loads),  # fresh containers each draw: never shared
    st.sampled_from((0, -1, 1, 2**62, 2**62 + 1, 2**63, -(2**63), 10**18, 10**30, 10**400)),
    st.integers(-3, 20),
)


def _paths(doc: Any, prefix: tuple[Any, ...] = (), out: list[tuple[Any, ...]] | None = None) -> list[tuple[Any, ...]]:
    out = [] if out is None else out
    out.append(prefix)
    if len(out) > 2000:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            _paths(v, (*prefix, k), out)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            _paths(v, (*prefix, i), out)
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw: st.DrawFn, doc: Any) -> Any:
    """Up to three document-level edits of a JSON document (a deep copy is edited)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        paths = sorted(_paths(doc)[1:], key=len, reverse=True)  # leaves first: small draws hit values
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _get(doc, path[:-1])
        key = path[-1]
        op = draw(st.integers(0, 9))
        value = parent[key]
        if op <= 3:
            parent[key] = draw(_JUNK)
        elif op == 4:
            del parent[key]
        elif op == 5 and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(value)))  # duplicate (e.g. a duplicate piece)
        elif op == 6 and isinstance(value, int) and not isinstance(value, bool):
            parent[key] = value + draw(st.sampled_from((-1, 1, -value - 1, value, 2**62)))
        elif op == 7 and isinstance(parent, dict):
            new = draw(st.sampled_from(("0", "00", "-0", " 1", "1_0", "+1", "--1", "x", "\u00b2", "\u0661", "9" * 30)))
            parent[new] = parent.pop(key)  # a renamed (maybe colliding) key
        elif op == 8:
            parent[key] = [value] if draw(st.booleans()) else {"x": value}
        else:
            parent[key] = json.loads(json.dumps(_get(doc, draw(st.sampled_from(paths))))) if paths else value
    return doc


@st.composite
def rendered(draw: st.DrawFn, doc: Any) -> bytes:
    """Serialize, sometimes with a text-level edit."""
    text = json.dumps(doc, indent=draw(st.sampled_from((None, None, 1))))
    op = draw(st.integers(0, 15)) - 10  # hypothesis favours small draws: 0..9 leave the text alone
    if op == 0 and "{" in text:
        opens = [i for i, ch in enumerate(text) if ch == "{"]
        at = draw(st.sampled_from(opens[:200]))
        text = text[: at + 1] + '"ranks": {}, ' + text[at + 1:]  # a (maybe duplicate) key
    elif op == 1:
        text = text.replace("[", "[" * 3000 + "[", 1).replace("]", "]" + "]" * 3000, 1)
    elif op == 2:
        text = text.replace("1", "1" + "0" * draw(st.sampled_from((18, 30, 4400))), 1)
    elif op == 3:
        text = text[: draw(st.integers(0, len(text)))]
    elif op == 4:
        raw = bytearray(text.encode("utf-8"))
        for _ in range(draw(st.integers(1, 4))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw).replace(b"\0", b" ")
    elif op == 5:
        text = text.replace("4", draw(st.sampled_from(("NaN", "Infinity", "-Infinity", "4.0", "4e0", "true"))), 1)
    return text.encode("utf-8")


@st.composite
def maps_bytes(draw: st.DrawFn, mutate_odds: int = 2) -> bytes:
    """A maps file: generated or seed, mutated with probability 1/``mutate_odds``."""
    source = draw(st.integers(0, 9))
    if source == 0:
        return draw(st.sampled_from(_seeds("hostile")))  # type: ignore[no-any-return]
    doc = draw(st.sampled_from(_seeds("valid") + _seeds("refusal"))) if source <= 2 else draw(generated_doc())
    if draw(st.integers(0, mutate_odds - 1)) == 0:
        doc = draw(mutated(doc))
    return draw(rendered(doc))


@st.composite
def plans_bytes(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 3)) == 0:
        doc = draw(st.sampled_from(_seeds("plans")))
    else:
        maps = draw(generated_doc())
        try:
            doc = dump_plans(plan_transfers(parse_maps(maps).pairs, min_split_bytes=0))
        except ValueError:
            doc = {"format": PLANS_FORMAT, "parameters": {}}
        doc = json.loads(json.dumps(doc))
    if draw(st.booleans()):
        doc = draw(mutated(doc))
    return draw(rendered(doc))


@st.composite
def with_control(draw: st.DrawFn, mutate_odds: int) -> bytes:
    return draw(maps_bytes(mutate_odds)) + b"\0" + draw(st.binary(max_size=48))


@st.composite
def cli_input(draw: st.DrawFn) -> bytes:
    command = draw(st.integers(0, 255))
    maps = draw(maps_bytes(4))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        second = draw(plans_bytes())
    elif kind == 1:
        try:
            doc = json.loads(maps)
            plans = dump_plans(plan_transfers(parse_maps(doc).pairs, min_split_bytes=0))
            second = draw(rendered(draw(mutated(json.loads(json.dumps(plans))))))
        except (ValueError, RecursionError):
            second = b"{}"
    elif kind == 2:
        ends = {"source": {str(r): r for r in range(8)}, "target": {str(r): r for r in range(8)}}
        second = draw(rendered(draw(mutated(ends)) if draw(st.booleans()) else ends))
    else:
        second = draw(st.binary(max_size=64)).replace(b"\0", b" ")
    return bytes([command]) + maps.replace(b"\0", b" ") + b"\0" + second


STRATEGIES: dict[str, Any] = {
    "maps_loader": lambda: maps_bytes(2),
    "plans_loader": plans_bytes,
    "planner": lambda: with_control(4),
    "verify": lambda: with_control(8),
    "cli": cli_input,
}
"""Harness name -> zero-argument factory of its ``SearchStrategy[bytes]``."""
