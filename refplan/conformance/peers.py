"""Adapters for the planners people run: PyTorch DCP, Megatron-Core's refit planner, and Awex.

Each adapter calls the peer's real, pinned package on CPU, outside any process group, through the
functions its users' code paths reach:

``dcp`` / ``dcp-lowest``
    torch's ``torch.distributed.checkpoint``: every source location is one rank's ``SavePlan`` of
    SHARD ``WriteItem``s (one per piece: a chunk of the logical tensor); ``DefaultSavePlanner``'s
    global planning deduplicates them (DCP's replica choice, by planned bytes or, for
    ``dcp-lowest``, to the lowest rank) and writes the ``Metadata``; every target location's pieces
    are its local chunks, and ``planner_helpers.create_read_items_for_chunk_list`` turns them into
    ``ReadItem``s, which become strided segments.
``megatron``
    ``megatron.core.resharding`` (megatron-core 0.16.1): one ``ParameterMetadata`` per rank and
    parameter, then, as ``build_centralized_reshard_plan`` does on rank 0, for every destination
    rank and parameter ``select_src_metadata_balanced`` and ``_determine_source_ranks_for_dst_param``.
``awex``
    ``awex.transfer.transfer_plan.TransferPlanBuilder.build_weights_mapping_operations`` (awex
    0.9.0) on ``ParameterMeta``s with their replicas.

Why every translation is checked: a conformance result only means something if the peer saw the
case's problem and not a neighbour of it. So an adapter translates a parameter only when the
peer's own description expresses both maps *exactly*: it rebuilds the maps from the peer's input
objects alone (``rebuild``) and compares them with the case's maps piece for piece (tests compare
them element for element as well). Anything else is ``unsupported`` with the reason ("uneven TP
split", "more than one box per rank", ...), so it can never pass or fail.

How outcomes read: a peer that raises a deliberate error (``ValueError``, ``RuntimeError``,
``AssertionError``, ``NotImplementedError``) refuses; any other exception is a crash (a failure
with the peer's own message). Peers have their own error classes, so a refusal of a case that
must be refused passes whatever its class (noted); refusing a valid case fails. The batch policy
expectations (busiest-sender bound, local-first sources) are judged as *quality*, not
correctness (see ``runner.judge``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..box import decode_row_major, row_major_strides, volume
from ..errors import AffineTransferError, describe_exception
from ..maps import AffinePiece, ParamAffineMap
from ..simulate import extract_shards, logical_markers
from .adapters import Adapter, Outcome
from .corpus import Case

__all__ = [
    "PEER_PINS",
    "PEER_SPECS",
    "AwexAdapter",
    "DCPAdapter",
    "Inexpressible",
    "MegatronAdapter",
    "maps_differ",
    "peer_version",
]

PEER_PINS = {"dcp": "torch==2.13.0", "megatron": "megatron-core==0.16.1", "awex": "awex==0.9.0"}
"""The versions the adapters were written against (``make peers`` installs them)."""

PEER_SPECS = ("dcp", "dcp-lowest", "megatron", "awex")

PEER_NOTES = {
    "dcp": (
        "Called as a DCP save and load would: every source location is one rank's `SavePlan` (one SHARD "
        "`WriteItem` per piece), `DefaultSavePlanner(flatten_state_dict=False).create_global_plan` deduplicates "
        "replicas (DCP's only replica choice: by planned bytes, or to the lowest rank for `dcp-lowest`) and "
        "writes the `Metadata`, and `create_read_items_for_chunk_list` gives each target location's reads. "
        "Expressible: pieces that are boxes of the logical tensor (any placement in the rank's memory); not: "
        "flattened or transposed views, scaled pieces, endpoints, scripted answers, budgets."
    ),
    "megatron": (
        "Called as rank 0 of `build_centralized_reshard_plan` does: one `ParameterMetadata` per rank and "
        "parameter (source locations are global ranks 0.., target locations follow them), then for every "
        "destination rank and parameter `select_src_metadata_balanced` and `_determine_source_ranks_for_dst_param`. "
        "Expressible: an even TP split along one axis (with `partition_stride` interleaving) replicated over DP, "
        "and fully replicated parameters; not: uneven splits, several boxes per rank outside the stride pattern."
    ),
    "awex": (
        "Called as its weight sync does: `TransferPlanBuilder(infer_world, train_world)."
        "build_weights_mapping_operations` on one `ParameterMeta` per parameter and side, with replicas "
        "(replica c: the c-th holder of every box). Expressible: one dense box per rank per parameter; not: "
        "several boxes per rank (fused weights), boxes with unequal numbers of holders."
    ),
}
"""How each peer is called and what it can express, for the generated ``docs/conformance.md``."""

PEER_FINDINGS_OUTSIDE_CORPUS = {
    "megatron": [
        (
            "Expert weights copied from a rank that does not hold the expert (silently wrong weights). "
            "A corpus map does not say which parameters are experts, but Megatron's metadata does "
            "(`is_ep`, EP group, local `weightK` names): in a refit from EP=2 to EP=1 on 4 ranks the "
            "replicated fallback sees equal DP groups and plans a local copy of every expert on every "
            "rank, e.g. expert 2 on rank 0, which holds experts 0-1; the op names the source's local "
            "`weight0`, which on rank 0 is expert 0. Found by `tests/test_interop.py::test_megatron_experts` "
            "(`interop.from_megatron` against Megatron's own routing).",
            "megatron_expert_misrouted.py",
        ),
        (
            "Weights lose their TP marking without initialization: with `perform_initialization=False` "
            "(loading from a checkpoint), `ColumnParallelLinear`/`RowParallelLinear` weights never get "
            "their tensor-parallel attributes, so `extract_param_metadata` reports TP-split weights as "
            "replicated (`is_tp=False`) on every rank alike, which no consumer of the metadata can detect. "
            "Seen on CPU in `tests/test_interop.py`.",
            "",
        ),
    ],
}
"""Findings about a peer that the corpus cannot state (they need the peer's own richer metadata)."""

_ROW_TO_COLUMN = ("batches/endpoints-disjoint-processes", "layouts/golden-hand-derived-row2-col4",
                  "layouts/golden-billion-rows-row2-col4",
                  "replicas/replicate-location-of", "replicas/empty-source-location", "peers/dtensor-hsdp-2x2-to-tp4",
                  "rules/R13-size-one-axis-free-source", "rules/R13-size-one-axis-free-target")
REPRODUCTIONS: dict[str, dict[str, str]] = {
    "dcp": {
        "replicas/empty-pieces-zero-width": "dcp_empty_chunk_collides.py",
        "rules/R25-a1-source-covers-half": "dcp_one_plan_skips_coverage.py",
        "peers/finding-dcp-one-plan-skips-coverage": "dcp_one_plan_skips_coverage.py",
    },
    "megatron": {
        **dict.fromkeys(_ROW_TO_COLUMN, "megatron_partition_dim_change.py"),
        "peers/finding-megatron-pure-dp-reads-one-rank": "megatron_pure_dp_reads_one_rank.py",
        "peers/finding-megatron-tp2dp2-uses-one-replica": "megatron_tp2dp2_uses_one_replica.py",
    },
    "awex": {
        "rules/R0-a7-reshape": "awex_reshape_crash.py",
        "batches/no-partial-plan-reshape": "awex_reshape_crash.py",
        "rules/R25-a1-source-covers-half": "awex_no_coverage_check.py",
        "peers/finding-dcp-one-plan-skips-coverage": "awex_no_coverage_check.py",
        "peers/finding-awex-one-inference-replica": "awex_one_inference_replica.py",
        "batches/balance-spans-two-parameters": "awex_one_inference_replica.py",
        "batches/balance-three-parameters": "awex_one_inference_replica.py",
        "batches/balance-by-bytes": "awex_one_inference_replica.py",
    },
}
"""Peer -> case id -> the script under ``docs/peers/`` that shows that result with the peer alone
(a ``finding-<peer>-...`` case is matched by name without being listed)."""

_DELIBERATE = (ValueError, RuntimeError, AssertionError, NotImplementedError)
"""Exception classes a peer raises on purpose when it refuses; anything else is a crash."""

_DTYPE_BY_SIZE = {1: "uint8", 2: "bfloat16", 4: "float32", 8: "float64", 16: "complex128"}
_DEFAULT_DTYPE = "float32"


class Inexpressible(Exception):
    """The peer's description cannot say this case exactly; the message says why."""


def peer_version(dist: str) -> str | None:
    """The installed version of a distribution, or ``None``."""
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Peers log and warn on import and on every plan; keep the report readable."""
    sink = io.StringIO()
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _import(name: str) -> Any:
    with _quiet():
        return importlib.import_module(name)


# ---------------------------------------------------------------------------------------------
# Reading a case's maps as boxes


@dataclass(frozen=True)
class Chunk:
    """One non-empty or empty piece read as a box of the logical tensor, with its shard placement."""

    location: int
    origin: tuple[int, ...]
    shape: tuple[int, ...]
    dest_offset: int
    dest_strides: tuple[int, ...]
    holders: tuple[int, ...]


def _case_maps(case: Case, same_shape: str | None) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
    """(target, source) maps per parameter name; with ``same_shape``, a pair whose sides differ in
    logical shape is ``Inexpressible`` for that reason (a peer that keys tensors by name alone)."""
    out: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    for name in sorted(case.parameters):
        pair = case.parameters[name]
        t = _map_of(pair["target"], f"parameter {name!r}, target")
        s = _map_of(pair["source"], f"parameter {name!r}, source")
        if same_shape is not None and t.logical_shape != s.logical_shape:
            raise Inexpressible(f"parameter {name!r}: shapes {t.logical_shape} and {s.logical_shape} ({same_shape})")
        out[name] = (t, s)
    return out


def _map_of(doc: Mapping[str, Any], what: str) -> ParamAffineMap:
    try:
        return ParamAffineMap.from_dict(doc)
    except (AffineTransferError, ValueError, TypeError, KeyError) as exc:
        raise Inexpressible(f"{what}: the map dict does not load ({type(exc).__name__})") from None


def _chunks(m: ParamAffineMap, what: str, *, keep_empty: bool = False) -> list[Chunk]:
    """Every piece as a logical box; ``Inexpressible`` for a piece that is not one."""
    logical = m.logical_shape
    rm = row_major_strides(logical)
    out: list[Chunk] = []
    for loc in sorted(m.pieces_by_rank):
        for index, p in enumerate(m.pieces_by_rank[loc]):
            where = f"{what}, location {loc}, piece {index}"
            if len(p.shape) != len(logical):
                raise Inexpressible(f"{where}: a reshaped view ({len(p.shape)}-d piece of a {len(logical)}-d tensor)")
            if p.scale != 1.0:
                raise Inexpressible(f"{where}: scale {p.scale} (peers copy values unscaled)")
            if volume(p.shape) == 0:
                if keep_empty:
                    origin = decode_row_major(p.source_offset, logical) if volume(logical) else None
                    out.append(Chunk(loc, origin or (0,) * len(logical), p.shape, p.dest_offset, p.dest_strides,
                                     tuple(sorted(p.locations))))
                continue
            if any(e > 1 and s != r for e, s, r in zip(p.shape, p.source_strides, rm)):
                raise Inexpressible(f"{where}: not a box of the logical tensor (strides {p.source_strides})")
            origin = decode_row_major(p.source_offset, logical)
            if origin is None or any(o + e > n for o, e, n in zip(origin, p.shape, logical)):
                raise Inexpressible(f"{where}: reaches outside the logical tensor")
            out.append(Chunk(loc, origin, p.shape, p.dest_offset, p.dest_strides, tuple(sorted(p.locations))))
    return out


def _norm_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    return tuple(s if e > 1 else 0 for e, s in zip(shape, strides))


def _canonical(m: ParamAffineMap) -> tuple[Any, ...]:
    """A map's meaning as a sorted tuple: the shard shape (or ``None``) of every location that
    holds data, and each non-empty piece as (location, source offset and strides, shape, dest
    offset and strides, holders, scale). Strides of extent-1 axes do not matter and are zeroed;
    stride vectors of the wrong length are kept whole, so they can never compare equal."""
    holding = {loc for loc, ps in m.pieces_by_rank.items() for p in ps if volume(p.shape) > 0}
    holding |= {loc for loc, s in m.shard_shapes.items() if volume(s) > 0}
    holding |= {loc for loc in m.pieces_by_rank if m.shard_shapes.get(loc) is None}  # declared, shapeless
    shards = tuple(sorted((loc, m.shard_shapes.get(loc)) for loc in holding))

    def strides(shape: tuple[int, ...], value: tuple[int, ...]) -> tuple[int, ...]:
        return _norm_strides(shape, value) if len(value) == len(shape) else (-1, *value)

    pieces = sorted(
        (loc, p.source_offset, strides(p.shape, p.source_strides), p.shape, p.dest_offset,
         strides(p.shape, p.dest_strides), tuple(sorted(p.locations)), p.scale)
        for loc, ps in m.pieces_by_rank.items() for p in ps if volume(p.shape) > 0
    )
    return (m.logical_shape, shards, tuple(pieces))


def check_tiled(m: ParamAffineMap, what: str) -> None:
    """``Inexpressible`` unless every shard is tiled exactly by its pieces, inside its bounds.

    Peers describe boxes of the logical tensor, never memory: a local tensor is whatever the user
    passes. A map whose pieces overlap or leave holes in a shard (or reach past it) describes
    memory no such tensor has, so it cannot be handed to a peer faithfully. Checked element by
    element through ``simulate.extract_shards`` while that is small; above its budget only the
    plain case (one piece filling its shard densely) is accepted.
    """
    try:
        extract_shards(m, logical_markers(m.logical_shape))
        return
    except AffineTransferError as exc:
        if type(exc) is not AffineTransferError or "max_elements" not in str(exc):  # not just the size budget
            raise Inexpressible(f"{what}: {exc}") from None
    except ValueError as exc:
        raise Inexpressible(f"{what}: {exc}") from None
    for loc, pieces in m.pieces_by_rank.items():
        full = [p for p in pieces if volume(p.shape)]
        shard = m.shard_shapes.get(loc)
        if not full:
            continue
        if len(full) != 1 or shard is None or full[0].shape != tuple(shard) or not _dense_at_zero(
                full[0].shape, full[0].dest_offset, full[0].dest_strides):
            raise Inexpressible(f"{what}: too large to check that location {loc}'s shard is tiled exactly")


def _dense_at_zero(shape: tuple[int, ...], offset: int, strides: Sequence[int]) -> bool:
    """Whether a piece sits at the start of its memory, contiguous and row-major (strides of
    extent-1 axes are never stepped and do not matter): a local tensor of exactly its shape."""
    return offset == 0 and _norm_strides(shape, strides) == _norm_strides(shape, row_major_strides(shape))


def maps_differ(case_map: ParamAffineMap, rebuilt: ParamAffineMap, *, elements: bool = False) -> str | None:
    """``None`` when ``rebuilt`` means exactly ``case_map``, else the first difference.

    Piece for piece (shard shapes of the locations that hold data, every non-empty piece with its
    holders); with ``elements`` also element for element through ``simulate.extract_shards`` on
    logical markers, which reads nothing but the maps' own offsets and strides.
    """
    if case_map.logical_shape != rebuilt.logical_shape:
        return f"logical shape {rebuilt.logical_shape} != {case_map.logical_shape}"
    a, b = _canonical(case_map), _canonical(rebuilt)
    if a[1] != b[1]:
        return f"shard shapes {dict(b[1])} != {dict(a[1])}"
    if a[2] != b[2]:
        only = sorted(set(a[2]) ^ set(b[2]))
        return f"pieces differ, first at {only[0] if only else '?'}"
    if elements:
        markers = logical_markers(case_map.logical_shape)
        x, y = extract_shards(case_map, markers), extract_shards(rebuilt, markers)
        keys = {k for k, v in x.items() if v.size} | {k for k, v in y.items() if v.size}
        for k in sorted(keys):
            if k not in x or k not in y or x[k].shape != y[k].shape or not (x[k] == y[k]).all():
                return f"location {k} holds other elements"
    return None


def _rebuild_map(logical: Sequence[int], boxes: Sequence[tuple[int, tuple[int, ...], tuple[int, ...],
                                                                 tuple[int, ...], int, tuple[int, ...]]]
                 ) -> ParamAffineMap:
    """A map from (location, origin, shape, shard shape, dest offset, dest strides) entries;
    holders are every location holding the same box, as peers infer replicas."""
    logical = tuple(logical)
    holders: dict[tuple[tuple[int, ...], tuple[int, ...]], set[int]] = {}
    for loc, origin, shape, _shard, _off, _strides in boxes:
        if volume(shape):
            holders.setdefault((origin, shape), set()).add(loc)
    rm = row_major_strides(logical)
    shards: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    for loc, origin, shape, shard, off, strides in boxes:
        shards[loc] = shard
        if not volume(shape):
            continue
        src = sum(o * s for o, s in zip(origin, rm))
        pieces.setdefault(loc, []).append(
            AffinePiece(shape, src, rm, off, strides, sorted(holders[(origin, shape)]))
        )
    return ParamAffineMap(logical, shards, pieces)


def _relabel(m: ParamAffineMap, names: Mapping[int, int]) -> ParamAffineMap:
    """``m`` with every location (keys and holders) renamed by ``names``."""
    return ParamAffineMap(
        m.logical_shape,
        {names[loc]: s for loc, s in m.shard_shapes.items()},
        {names[loc]: [AffinePiece(p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides,
                                  sorted(names[h] for h in p.locations), p.scale) for p in ps]
         for loc, ps in m.pieces_by_rank.items()},
    )


def _dense(m: ParamAffineMap, what: str) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Location -> (origin, shape) for maps where every location holds one box as a whole,
    contiguous, row-major local tensor (what Megatron and Awex describe); ``Inexpressible`` else."""
    out: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    by_loc: dict[int, list[Chunk]] = {}
    for c in _chunks(m, what):
        by_loc.setdefault(c.location, []).append(c)
    for loc, chunks in sorted(by_loc.items()):
        if len(chunks) != 1:
            raise Inexpressible(f"{what}: more than one box on location {loc}")
        c = chunks[0]
        shard = m.shard_shapes.get(loc)
        if shard is None or tuple(shard) != c.shape:
            raise Inexpressible(f"{what}: location {loc} holds a box of shape {c.shape} in a shard {shard}")
        if not _dense_at_zero(c.shape, c.dest_offset, c.dest_strides):
            raise Inexpressible(f"{what}: location {loc} stores its box permuted or strided")
        out[loc] = (c.origin, c.shape)
    return out


def _replicas(boxes: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]], what: str) -> list[list[int]]:
    """Split holders into replicas (replica ``c``: the ``c``-th holder of every distinct box)."""
    by_box: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for loc, box in sorted(boxes.items()):
        by_box.setdefault(box, []).append(loc)
    counts = {len(v) for v in by_box.values()}
    if len(counts) > 1:
        raise Inexpressible(f"{what}: boxes have different numbers of holders {sorted(counts)}")
    copies = counts.pop() if counts else 0
    return [[locs[c] for _, locs in sorted(by_box.items())] for c in range(copies)]


def _dtype_name(case: Case, name: str) -> str:
    sizes = case.raw.get("element_size")
    if not sizes:
        return _DEFAULT_DTYPE
    size = sizes.get(name)
    if not isinstance(size, int) or size not in _DTYPE_BY_SIZE:
        raise Inexpressible(f"parameter {name!r}: no torch dtype of {size!r} bytes")
    return _DTYPE_BY_SIZE[size]


def _segment(shape: Sequence[int], src: tuple[int, int, Sequence[int]],
             tgt: tuple[int, int, Sequence[int]]) -> dict[str, Any]:
    return {"shape": list(shape), "source": [src[0], src[1], list(src[2])],
            "target": [tgt[0], tgt[1], list(tgt[2])]}


def _slices(slices: Sequence[Any], local: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(start, length) per axis of a peer's Python slices into a local tensor of shape ``local``."""
    starts, lengths = [], []
    for s, n in zip(slices, local):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"a slice with step {step}")
        starts.append(start)
        lengths.append(max(0, stop - start))
    return tuple(starts), tuple(lengths)


def _dense_offset(starts: Sequence[int], local: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    rm = row_major_strides(local)
    return sum(a * s for a, s in zip(starts, rm)), rm


class _PeerAdapter(Adapter):
    """Shared behaviour: translation gate, deliberate refusals, crashes as failures."""

    strict_messages = False
    peer_refusals = True
    """Any deliberate refusal of a must-refuse case passes: peers have their own error classes."""
    features = frozenset({"multi_parameter", "element_size"})

    def plan(self, case: Case) -> Outcome:
        try:
            problem = self.translate(case)
        except Inexpressible as exc:
            return Outcome("unsupported", message=str(exc))
        try:
            with _quiet():
                plans = self.run_peer(problem)
        except _DELIBERATE as exc:
            return Outcome("refuse", error=type(exc).__name__, message=_first_line(exc))
        except Exception as exc:
            return Outcome("crash", error=type(exc).__name__, message=_first_line(exc))
        return Outcome("accept", plans=plans)

    def translate(self, case: Case) -> Any:
        raise NotImplementedError

    def run_peer(self, problem: Any) -> dict[str, Any]:
        """Plan dicts per parameter: the peer's planning call, then its output turned into segments."""
        return self.convert(problem, self.call_peer(problem))

    def call_peer(self, problem: Any) -> Any:
        """Only the peer's own planning routine (what ``refplan bench`` times); returns its output."""
        raise NotImplementedError

    def convert(self, problem: Any, output: Any) -> dict[str, Any]:
        """The peer's output as plan dicts (``{logical_shape, segments}``) per parameter."""
        raise NotImplementedError

    def rebuild(self, problem: Any) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        """(target, source) maps per parameter, read back from the peer's input objects alone."""
        raise NotImplementedError

    check_memory = True
    """Whether the gate also proves each shard tiled element by element (``check_tiled``). The bench
    turns it off for maps refplan's own builders made (valid by construction, and large)."""

    def _gate(self, maps: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]], problem: Any) -> None:
        """``Inexpressible`` unless the maps read back from ``problem`` are ``maps`` (the case's own,
        as ``_case_maps`` parsed them) and every shard of them is tiled exactly."""
        rebuilt = self.rebuild(problem)
        for name in sorted(maps):
            for side, index in (("target", 0), ("source", 1)):
                original = maps[name][index]
                if self.check_memory:
                    check_tiled(original, f"parameter {name!r}, {side}")
                why = maps_differ(original, rebuilt[name][index])
                if why is not None:
                    raise Inexpressible(f"parameter {name!r}, {side}: the peer's description means another map: {why}")


def _first_line(exc: BaseException) -> str:
    """The first line of a peer's exception message (which may itself fail to format)."""
    text = describe_exception(exc).partition(": ")[2].strip().splitlines()
    return (text[0] if text else "")[:400]


def _no_options(case: Case, allowed: Sequence[str] = ()) -> None:
    for key in ("endpoints", "process_node", "min_split_bytes", "budget", "answers"):
        if key not in allowed and case.raw.get(key) is not None:
            raise Inexpressible(f"needs {key}")


# ---------------------------------------------------------------------------------------------
# PyTorch DCP


@dataclass
class _DCPProblem:
    names: list[str]
    logical: dict[str, tuple[int, ...]]
    source_locs: list[int]
    save_plans: list[Any]
    """One ``SavePlan`` per source location, in ``source_locs`` order."""
    placements: dict[tuple[str, int, tuple[int, ...], tuple[int, ...]], tuple[int, tuple[int, ...]]]
    """(name, source location, chunk origin, chunk shape) -> (shard offset, shard strides): where a
    saved chunk sits in the saving rank's memory, which DCP does not describe (it saves a view)."""
    shard_shapes: dict[tuple[str, str], dict[int, tuple[int, ...]]]
    targets: dict[str, dict[int, list[Chunk]]]
    """Per parameter and target location: the local chunks to load (with their shard placement)."""


class DCPAdapter(_PeerAdapter):
    """torch.distributed.checkpoint: save-side dedup chooses the replica, load reads overlaps."""

    def __init__(self, lowest_rank: bool = False) -> None:
        self.lowest_rank = lowest_rank
        self._planner = _import("torch.distributed.checkpoint.default_planner")
        self._helpers = _import("torch.distributed.checkpoint.planner_helpers")
        self._md = _import("torch.distributed.checkpoint.metadata")
        self._pl = _import("torch.distributed.checkpoint.planner")
        self._torch = _import("torch")
        version = peer_version("torch")
        self.name = f"dcp{'-lowest' if lowest_rank else ''} (torch {version})"

    def translate(self, case: Case) -> _DCPProblem:
        _no_options(case)
        torch, md, pl = self._torch, self._md, self._pl
        names = sorted(case.parameters)
        logical: dict[str, tuple[int, ...]] = {}
        items: dict[int, list[Any]] = {}
        placements: dict[tuple[str, int, tuple[int, ...], tuple[int, ...]], tuple[int, tuple[int, ...]]] = {}
        shard_shapes: dict[tuple[str, str], dict[int, tuple[int, ...]]] = {}
        targets: dict[str, dict[int, list[Chunk]]] = {}
        src_locs: set[int] = set()
        pairs = _case_maps(case, "one tensor per fqn")
        for name in names:
            tmap, smap = pairs[name]
            logical[name] = smap.logical_shape
            dtype = getattr(torch, _dtype_name(case, name))
            for side, m in (("source", smap), ("target", tmap)):
                if any(m.shard_shapes.get(loc) is None for loc in m.pieces_by_rank):
                    raise Inexpressible(f"parameter {name!r}, {side}: a location without a shard shape")
                shard_shapes[(name, side)] = dict(m.shard_shapes)
            size = torch.Size(smap.logical_shape)
            seen: set[tuple[int, tuple[int, ...]]] = set()
            for c in _chunks(smap, f"parameter {name!r}, source", keep_empty=True):
                if (c.location, c.origin) in seen:
                    raise Inexpressible(f"parameter {name!r}, source location {c.location}: two chunks at offset "
                                        f"{c.origin} (one write item per offset and rank)")
                seen.add((c.location, c.origin))
                src_locs.add(c.location)
                chunk = md.ChunkStorageMetadata(offsets=torch.Size(c.origin), sizes=torch.Size(c.shape))
                items.setdefault(c.location, []).append(pl.WriteItem(
                    index=md.MetadataIndex(name, torch.Size(c.origin)),
                    type=pl.WriteItemType.SHARD,
                    tensor_data=pl.TensorWriteData(chunk=chunk, properties=md.TensorProperties(dtype=dtype),
                                                   size=size),
                ))
                placements[(name, c.location, c.origin, c.shape)] = (c.dest_offset, c.dest_strides)
            by_loc: dict[int, list[Chunk]] = {}
            for c in _chunks(tmap, f"parameter {name!r}, target"):
                by_loc.setdefault(c.location, []).append(c)
            targets[name] = by_loc
        locs = sorted(src_locs)
        problem = _DCPProblem(names, logical, locs, [pl.SavePlan(items.get(loc, [])) for loc in locs], placements,
                              shard_shapes, targets)
        self._gate(pairs, problem)
        return problem

    def rebuild(self, problem: _DCPProblem) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        out: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
        items_of: dict[str, list[tuple[int, Any]]] = {}  # one pass over the plans, not one per parameter
        for loc, plan in zip(problem.source_locs, problem.save_plans):
            for item in plan.items:
                items_of.setdefault(item.index.fqn, []).append((loc, item))
        for name in problem.names:
            src: list[Any] = []
            for loc, item in items_of.get(name, ()):
                origin = tuple(item.tensor_data.chunk.offsets)
                shape = tuple(item.tensor_data.chunk.sizes)
                off, strides = problem.placements[(name, loc, origin, shape)]
                src.append((loc, origin, shape, problem.shard_shapes[(name, "source")][loc], off, strides))
            for loc, shard in problem.shard_shapes[(name, "source")].items():
                if all(e[0] != loc for e in src):
                    src.append((loc, (0,) * len(problem.logical[name]), (0,) * len(problem.logical[name]), shard, 0,
                                row_major_strides(shard)))
            tgt = [(c.location, c.origin, c.shape, problem.shard_shapes[(name, "target")][c.location], c.dest_offset,
                    c.dest_strides) for chunks in problem.targets[name].values() for c in chunks]
            out[name] = (_rebuild_map(problem.logical[name], tgt), _rebuild_map(problem.logical[name], src))
        return out

    def save(self, problem: _DCPProblem) -> tuple[list[Any], Any]:
        """DCP's global save planning: (deduplicated plans, ``Metadata``)."""
        planner = self._planner.DefaultSavePlanner(flatten_state_dict=False,
                                                   dedup_save_to_lowest_rank=self.lowest_rank)
        global_plan, metadata = planner.create_global_plan(problem.save_plans)
        return list(global_plan), metadata

    def call_peer(self, problem: _DCPProblem) -> tuple[list[Any], dict[tuple[str, int], list[Any]]]:
        """DCP's save-side global planning, then each target location's read items."""
        global_plan, metadata = self.save(problem)
        reads: dict[tuple[str, int], list[Any]] = {}
        for name in problem.names:
            stored = metadata.state_dict_metadata.get(name)
            for t_loc, chunks in sorted(problem.targets[name].items()):
                local = [self._md.ChunkStorageMetadata(offsets=self._torch.Size(c.origin),
                                                       sizes=self._torch.Size(c.shape)) for c in chunks]
                if stored is None:
                    raise ValueError(f"{name!r} is not in the checkpoint metadata")
                reads[(name, t_loc)] = self._helpers.create_read_items_for_chunk_list(name, stored, local)
        return global_plan, reads

    def convert(self, problem: _DCPProblem, output: tuple[list[Any], dict[tuple[str, int], list[Any]]]
                ) -> dict[str, Any]:
        global_plan, reads = output
        owners: dict[str, list[tuple[int, tuple[int, ...], tuple[int, ...]]]] = {}
        for loc, plan in zip(problem.source_locs, global_plan):
            for item in plan.items:
                chunk = item.tensor_data.chunk
                owners.setdefault(item.index.fqn, []).append((loc, tuple(chunk.offsets), tuple(chunk.sizes)))
        plans: dict[str, Any] = {}
        for name in problem.names:
            segments: list[dict[str, Any]] = []
            for t_loc, chunks in sorted(problem.targets[name].items()):
                for ri in reads.get((name, t_loc), ()):
                    s_loc, s_origin, s_shape = owners[name][ri.storage_index.index]
                    s_off, s_strides = problem.placements[(name, s_loc, s_origin, s_shape)]
                    dest = chunks[ri.dest_index.index]
                    segments.append(_segment(
                        list(ri.lengths),
                        (s_loc, s_off + sum(a * s for a, s in zip(ri.storage_offsets, s_strides)), s_strides),
                        (t_loc, dest.dest_offset + sum(a * s for a, s in zip(ri.dest_offsets, dest.dest_strides)),
                         dest.dest_strides),
                    ))
            plans[name] = {"logical_shape": list(problem.logical[name]), "segments": segments}
        return plans


# ---------------------------------------------------------------------------------------------
# Megatron-Core


@dataclass(frozen=True)
class _MegatronSide:
    """One side of one parameter in Megatron's terms."""

    is_tp: bool
    dim: int
    stride: int
    tp_groups: tuple[tuple[int, ...], ...]
    """Locations per TP group, in TP-rank order (one group per replica)."""


class MegatronAdapter(_PeerAdapter):
    """Megatron-Core's refit planner: one source replica per destination rank and parameter.

    Endpoints are Megatron's own world: a refit runs the trainer and the engine on the same global
    ranks, so a case's processes are the ranks (one shard per rank and parameter and side)."""

    features = frozenset({"multi_parameter", "element_size", "endpoints"})

    def __init__(self) -> None:
        self._utils = _import("megatron.core.resharding.utils")
        self._planner = _import("megatron.core.resharding.planner")
        self._torch = _import("torch")
        version = peer_version("megatron-core")
        self.name = f"megatron-core {version}" if version else "megatron-core"

    @staticmethod
    def _side(m: ParamAffineMap, what: str, other_split: int | None) -> _MegatronSide:
        logical = m.logical_shape
        by_loc: dict[int, list[Chunk]] = {}
        for c in _chunks(m, what):
            by_loc.setdefault(c.location, []).append(c)
        if not by_loc:
            raise Inexpressible(f"{what}: no location holds data")
        locals_: dict[int, tuple[int, ...]] = {}
        for loc in by_loc:
            shard = m.shard_shapes.get(loc)
            if shard is None:
                raise Inexpressible(f"{what}: location {loc} declares no shard shape")
            locals_[loc] = tuple(shard)
        dims = {d for shard in locals_.values() for d, (a, b) in enumerate(zip(shard, logical)) if a != b}
        if len(dims) > 1:
            raise Inexpressible(f"{what}: shards differ from the tensor on several axes {sorted(dims)}")
        if not dims:
            if any(len(chunks) != 1 for chunks in by_loc.values()):
                raise Inexpressible(f"{what}: more than one box on a location holding the whole tensor")
            holders = tuple(sorted(by_loc))
            if other_split is None:
                return _MegatronSide(False, 0, 1, (holders,))
            # a linear layer's weight at TP=1: marked tensor-parallel with one-rank TP groups
            return _MegatronSide(True, other_split, 1, tuple((h,) for h in holders))
        dim = dims.pop()
        local = {shard[dim] for shard in locals_.values()}
        if len(local) != 1:
            raise Inexpressible(f"{what}: uneven TP split (local sizes {sorted(local)} on axis {dim})")
        size = local.pop()
        if size == 0 or logical[dim] % size:
            raise Inexpressible(f"{what}: uneven TP split ({logical[dim]} is not a multiple of {size})")
        world = logical[dim] // size
        strides = {len(chunks) for chunks in by_loc.values()}
        if len(strides) != 1:
            raise Inexpressible(f"{what}: locations hold different numbers of blocks")
        stride = strides.pop()
        if size % stride:
            raise Inexpressible(f"{what}: {stride} blocks do not divide a local size of {size}")
        unit = size // stride
        # TP rank of each location: the position of its first block in the interleave
        rank_of: dict[int, int] = {}
        for loc, chunks in by_loc.items():
            first = min(c.origin[dim] for c in chunks)
            if first % unit:
                raise Inexpressible(f"{what}: location {loc} starts a block off the {unit}-element grid")
            rank_of[loc] = (first // unit) % world
        by_rank: dict[int, list[int]] = {}
        for loc in sorted(rank_of):
            by_rank.setdefault(rank_of[loc], []).append(loc)
        if sorted(by_rank) != list(range(world)) or len({len(v) for v in by_rank.values()}) != 1:
            raise Inexpressible(f"{what}: TP ranks are not each held by the same number of replicas")
        copies = len(by_rank[0])
        groups = tuple(tuple(by_rank[j][c] for j in range(world)) for c in range(copies))
        return _MegatronSide(True, dim, stride, groups)

    def translate(self, case: Case) -> dict[str, Any]:
        _no_options(case, allowed=("endpoints",))
        names = sorted(case.parameters)
        maps = _case_maps(case, "the planner matches parameters by name and local shape only")
        # Global ranks: the processes of the endpoints (a refit runs both models on one world), or
        # without endpoints source locations as ranks 0.. and target locations after them.
        ends = case.raw.get("endpoints")
        src_locs = {loc for _, s in maps.values() for loc in s.shard_shapes}
        offset = max(src_locs, default=-1) + 1
        rank_of: dict[str, dict[int, int]] = {"source": {}, "target": {}}
        for side_name in ("source", "target"):
            locs = {loc for t, s in maps.values() for loc in (s if side_name == "source" else t).shard_shapes}
            for loc in locs:
                if ends is not None:
                    proc = ends.get(side_name, {}).get(str(loc))
                    if not isinstance(proc, int):
                        raise Inexpressible(f"{side_name} location {loc} has no process (a rank holds each shard)")
                    rank_of[side_name][loc] = proc
                else:
                    rank_of[side_name][loc] = loc + (offset if side_name == "target" else 0)
        utils, torch = self._utils, self._torch
        meta: dict[str, dict[str, dict[int, Any]]] = {"source": {}, "target": {}}
        loc_of: dict[str, dict[str, dict[int, int]]] = {"source": {}, "target": {}}
        for name in names:
            t, s = maps[name]
            t_dims = {d for loc in t.pieces_by_rank for d, (a, b) in
                      enumerate(zip(t.shard_shapes.get(loc) or t.logical_shape, t.logical_shape)) if a != b}
            s_dims = {d for loc in s.pieces_by_rank for d, (a, b) in
                      enumerate(zip(s.shard_shapes.get(loc) or s.logical_shape, s.logical_shape)) if a != b}
            sides = {
                "target": self._side(t, f"parameter {name!r}, target", min(s_dims) if s_dims else None),
                "source": self._side(s, f"parameter {name!r}, source", min(t_dims) if t_dims else None),
            }
            dtype = getattr(torch, _dtype_name(case, name))
            for side_name, side in sides.items():
                m = t if side_name == "target" else s
                rank = rank_of[side_name]
                held = [loc for group in side.tp_groups for loc in group]
                by_rank: dict[int, int] = {}
                for loc in held:
                    if rank[loc] in by_rank:
                        raise Inexpressible(f"parameter {name!r}, {side_name}: locations {by_rank[rank[loc]]} and "
                                            f"{loc} on one process (Megatron: one shard per rank and parameter)")
                    by_rank[rank[loc]] = loc
                loc_of[side_name][name] = by_rank
                dp_of: dict[int, tuple[int, ...]] = {}
                for j in range(len(side.tp_groups[0])):
                    dp = tuple(sorted(rank[g[j]] for g in side.tp_groups))
                    for g in side.tp_groups:
                        dp_of[g[j]] = dp
                per_rank: dict[int, Any] = {}
                for group in side.tp_groups:
                    ranks = [rank[loc] for loc in group]
                    for loc in group:
                        per_rank[rank[loc]] = utils.ParameterMetadata(
                            name=name, shape=tuple(m.shard_shapes[loc]), dtype=dtype,
                            element_size=torch.empty(0, dtype=dtype).element_size(), is_tp=side.is_tp,
                            partition_dim=side.dim, partition_stride=side.stride, owner_rank=rank[loc],
                            tensor_parallel_group_ranks=list(ranks) if side.is_tp else None,
                            data_parallel_group_ranks=list(dp_of[loc]),
                            pipeline_parallel_group_ranks=None, resolved_name=name,
                        )
                meta[side_name][name] = per_rank
        # What build_centralized_reshard_plan has gathered before its planning loop: per destination
        # rank the parameters it holds, per parameter the source metadata in rank order.
        dst_by_rank: dict[int, list[tuple[str, Any]]] = {}
        for name in names:
            for r, m in meta["target"][name].items():
                dst_by_rank.setdefault(r, []).append((name, m))
        problem = {"names": names, "meta": meta, "loc_of": loc_of,
                   "logical": {n: maps[n][1].logical_shape for n in names},
                   "dst_by_rank": sorted(dst_by_rank.items()),
                   "src_lists": {n: [meta["source"][n][r] for r in sorted(meta["source"][n])] for n in names}}
        self._gate(maps, problem)
        return problem

    def rebuild(self, problem: Mapping[str, Any]) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        """Both sides read back by ``interop.from_megatron`` from the ``ParameterMetadata`` alone
        (global ranks mapped back to the case's locations), so every translated case also tests it."""
        from ..interop import from_megatron

        sides: dict[str, dict[str, ParamAffineMap]] = {}
        for side_name in ("target", "source"):
            by_rank: dict[int, list[Any]] = {}
            for name in problem["names"]:
                for rank, meta in problem["meta"][side_name][name].items():
                    by_rank.setdefault(rank, []).append(meta)
            try:
                maps = from_megatron(by_rank)
            except (AffineTransferError, TypeError, ValueError) as exc:
                raise Inexpressible(f"{side_name}: interop.from_megatron refuses the metadata: {exc}") from None
            sides[side_name] = {n: _relabel(m, problem["loc_of"][side_name][n]) for n, m in maps.items()}
        return {name: (sides["target"][name], sides["source"][name]) for name in problem["names"]}

    def call_peer(self, problem: Mapping[str, Any]) -> list[tuple[str, int, Any, list[Any]]]:
        """Rank 0's loop of ``build_centralized_reshard_plan``: (parameter, destination rank,
        destination metadata, routed ops) for every destination rank and parameter."""
        select = self._utils.select_src_metadata_balanced
        determine = self._planner._determine_source_ranks_for_dst_param
        src_lists = problem["src_lists"]
        out: list[tuple[str, int, Any, list[Any]]] = []
        for dst_rank, params in problem["dst_by_rank"]:
            for name, dst in params:
                chosen = select(src_lists[name], dst, dst_rank)
                out.append((name, dst_rank, dst, determine(name, chosen, dst, dst_rank)))
        return out

    def convert(self, problem: Mapping[str, Any], output: list[tuple[str, int, Any, list[Any]]]) -> dict[str, Any]:
        loc_of = problem["loc_of"]
        src_meta = problem["meta"]["source"]
        segments: dict[str, list[dict[str, Any]]] = {n: [] for n in problem["names"]}
        for name, dst_rank, dst, ops in output:
            for src_rank, src_slice, dst_slice in ops:
                src_local = tuple(src_meta[name][src_rank].shape)
                s_start, s_len = _slices(src_slice, src_local)
                d_start, d_len = _slices(dst_slice, tuple(dst.shape))
                if s_len != d_len:
                    raise ValueError(f"{name}: source slice {s_len} and destination slice {d_len} differ")
                s_off, s_str = _dense_offset(s_start, src_local)
                d_off, d_str = _dense_offset(d_start, tuple(dst.shape))
                segments[name].append(_segment(d_len, (loc_of["source"][name][src_rank], s_off, s_str),
                                               (loc_of["target"][name][dst_rank], d_off, d_str)))
        return {n: {"logical_shape": list(problem["logical"][n]), "segments": segments[n]} for n in problem["names"]}


# ---------------------------------------------------------------------------------------------
# Awex


class AwexAdapter(_PeerAdapter):
    """Awex's weight-sync planner: inference replica ``i`` reads from training replica ``i mod T``."""

    def __init__(self) -> None:
        self._plan = _import("awex.transfer.transfer_plan")
        self._meta = _import("awex.meta.weight_meta")
        self._torch = _import("torch")
        version = peer_version("awex")
        self.name = f"awex {version}" if version else "awex"

    def _param_meta(self, name: str, m: ParamAffineMap, what: str, dtype: Any, world: int) -> Any:
        wm = self._meta
        boxes = _dense(m, what)
        replicas = _replicas(boxes, what)
        shards_of: dict[int, Any] = {}
        for loc, (origin, shape) in sorted(boxes.items()):
            shards_of[loc] = wm.ParameterShardMeta(
                tp_rank=0, attn_tp_rank=0, pp_rank=0, ep_rank=0, ep_tp_rank=0, global_rank=loc,
                world_size=world, engine_rank=0, name=name, shape=tuple(shape), numel=volume(shape), dtype=dtype,
                global_offset=tuple(origin),
            )
        reps = [wm.ParameterReplicaMeta(shards=[shards_of[loc] for loc in rep]) for rep in replicas]
        return wm.ParameterMeta(name=name, global_numel=volume(m.logical_shape), global_shape=tuple(m.logical_shape),
                                dtype=dtype, shards=[s for r in reps for s in r.shards], replicas=reps)

    def translate(self, case: Case) -> dict[str, Any]:
        _no_options(case)
        names = sorted(case.parameters)
        maps = _case_maps(case, None)  # Awex takes both shapes as they come: a mismatch is a finding
        train_world = max((loc for _, s in maps.values() for loc in s.shard_shapes), default=-1) + 1
        infer_world = max((loc for t, _ in maps.values() for loc in t.shard_shapes), default=-1) + 1
        infer, train = [], []
        for name in names:
            t, s = maps[name]
            dtype = getattr(self._torch, _dtype_name(case, name))
            infer.append(self._param_meta(name, t, f"parameter {name!r}, target", dtype, infer_world))
            train.append(self._param_meta(name, s, f"parameter {name!r}, source", dtype, train_world))
        problem = {"names": names, "infer": infer, "train": train, "infer_world": infer_world,
                   "train_world": train_world}
        self._gate(maps, problem)
        return problem

    @staticmethod
    def _side_map(meta: Any) -> ParamAffineMap:
        entries = []
        for shard in meta.shards:
            shape = tuple(shard.shape)
            entries.append((shard.global_rank, tuple(shard.global_offset), shape, shape, 0,
                            row_major_strides(shape)))
        return _rebuild_map(tuple(meta.global_shape), entries)

    def rebuild(self, problem: Mapping[str, Any]) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        return {i.name: (self._side_map(i), self._side_map(t)) for i, t in zip(problem["infer"], problem["train"])}

    def call_peer(self, problem: Mapping[str, Any]) -> list[Any]:
        builder = self._plan.TransferPlanBuilder(problem["infer_world"], problem["train_world"], num_infer_engines=1)
        ops: list[Any] = builder.build_weights_mapping_operations(problem["infer"], problem["train"])
        return ops

    def convert(self, problem: Mapping[str, Any], ops: list[Any]) -> dict[str, Any]:
        shapes = {m.name: tuple(m.global_shape) for m in problem["train"]}
        segments: dict[str, list[dict[str, Any]]] = {n: [] for n in problem["names"]}
        for op in ops:
            name = op.send_shard_meta.name
            s_start, s_len = _slices(op.train_slices, tuple(op.send_shard_meta.shape))
            d_start, d_len = _slices(op.inf_slices, tuple(op.recv_shard_meta.shape))
            s_off, s_str = _dense_offset(s_start, tuple(op.send_shard_meta.shape))
            d_off, d_str = _dense_offset(d_start, tuple(op.recv_shard_meta.shape))
            segments[name].append(_segment(tuple(op.overlap_shape),
                                           (op.send_rank - problem["infer_world"], s_off, s_str),
                                           (op.recv_rank, d_off, d_str)))
            if s_len != d_len or s_len != tuple(op.overlap_shape):
                raise ValueError(f"{name}: slices {s_len} / {d_len} disagree with the overlap {op.overlap_shape}")
        return {n: {"logical_shape": list(shapes[n]), "segments": segments[n]} for n in problem["names"]}


def make_peer_adapter(spec: str) -> Adapter:
    """The adapter for ``dcp``, ``dcp-lowest``, ``megatron`` or ``awex``; ``ValueError`` when the
    peer is not importable (``make peers`` installs it)."""
    try:
        if spec == "dcp":
            return DCPAdapter()
        if spec == "dcp-lowest":
            return DCPAdapter(lowest_rank=True)
        if spec == "megatron":
            return MegatronAdapter()
        if spec == "awex":
            return AwexAdapter()
    except Exception as exc:  # ImportError, or whatever the peer's own imports raise here
        pin = PEER_PINS["dcp" if spec.startswith("dcp") else spec]
        raise ValueError(f"planner {spec!r}: the peer is not importable ({type(exc).__name__}: {exc}); "
                         f"`make peers` installs {pin}") from None
    raise ValueError(f"planner {spec!r}: not a peer ({', '.join(PEER_SPECS)})")


def bench_contender(
    spec: str,
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]],
    *,
    endpoints: Mapping[str, Mapping[int, int]] | None = None,
    element_size: Mapping[str, int] | None = None,
) -> tuple[str, Any, Any] | str:
    """(peer name, planning call, conversion) for ``refplan bench``, or why the peer cannot run.

    Translation (and its exactness check, minus the element-level memory check) happens here, not
    timed; the zero-argument call runs only the peer's own planning routine, and the conversion
    turns its output into plan dicts afterwards (not timed either). Endpoints
    reach only the peer whose planner reads them (Megatron's global ranks); DCP and Awex plan
    without them, and the bench accounts loads per process from the plans as for every contender.
    """
    try:
        adapter: Any = make_peer_adapter(spec)
    except ValueError as exc:
        return str(exc)
    adapter.check_memory = False
    raw: dict[str, Any] = {
        "id": f"bench/{spec}", "why": "bench", "tags": [],
        "parameters": {n: {"target": t.to_dict(), "source": s.to_dict()} for n, (t, s) in sorted(pairs.items())},
        "expect": {"outcome": "accept"},
    }
    if endpoints is not None and "endpoints" in adapter.features:
        raw["endpoints"] = {side: {str(k): v for k, v in endpoints[side].items()} for side in ("source", "target")}
    if element_size is not None:
        raw["element_size"] = dict(element_size)
    from .corpus import Expect

    case = Case(raw["id"], "bench", "bench", (), raw, Expect("accept"))
    try:
        problem = adapter.translate(case)
    except Inexpressible as exc:
        return f"unsupported: {exc}"

    def run() -> Any:
        with _quiet():
            return adapter.call_peer(problem)

    def convert(output: Any) -> dict[str, Any]:
        plans: dict[str, Any] = adapter.convert(problem, output)
        return plans

    return adapter.name, run, convert
