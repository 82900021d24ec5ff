"""What the peer adapters share: reading a case's maps as boxes of the logical tensor, proving a
translation exact (``maps_differ``, ``check_tiled``), rebuilding maps from a peer's input objects,
and ``PeerAdapter``, the translate / call / convert / rebuild skeleton every peer adapter fills in."""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...box import Box, decode_row_major, overlapping_pairs, row_major_strides, volume
from ...errors import AffineTransferError, describe_exception
from ...maps import AffinePiece, ParamAffineMap
from ...simulate import extract_shards, logical_markers
from ..base import Adapter, Outcome
from ..corpus import Case

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


def timed_call(call: Any) -> tuple[Any, float, float]:
    """(value, CPU seconds, wall seconds) of ``call()``: how an adapter times one rank's share of a
    peer's planning where every rank plans for itself at once (``AwexAdapter.rank_seconds``,
    ``DCPAdapter.call_peer_timed``)."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = call()
    return value, time.process_time() - cpu, time.perf_counter() - wall


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
                    # Inside the tensor where its offset decodes to an element, else where DTensor puts
                    # an empty shard: at the tensor's end along its first empty axis.
                    origin = decode_row_major(p.source_offset, logical) if volume(logical) else None
                    if origin is None:
                        cut = next((d for d, e in enumerate(p.shape) if e == 0), 0)
                        origin = tuple(n if d == cut else 0 for d, n in enumerate(logical))
                    out.append(Chunk(loc, origin, p.shape, p.dest_offset, p.dest_strides,
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


def maps_differ(case_map: ParamAffineMap, rebuilt: ParamAffineMap, *, elements: bool = False,
                pieces: bool = True) -> str | None:
    """``None`` when ``rebuilt`` means exactly ``case_map``, else the first difference.

    Piece for piece (shard shapes of the locations that hold data, every non-empty piece with its
    holders); with ``elements`` also element for element through ``simulate.extract_shards`` on
    logical markers, which reads nothing but the maps' own offsets and strides. ``pieces=False``
    skips the piece comparison (a location's pieces merged into one box hold the same elements).
    """
    if case_map.logical_shape != rebuilt.logical_shape:
        return f"logical shape {rebuilt.logical_shape} != {case_map.logical_shape}"
    a, b = _canonical(case_map), _canonical(rebuilt)
    if a[1] != b[1]:
        return f"shard shapes {dict(b[1])} != {dict(a[1])}"
    if pieces and a[2] != b[2]:
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


def merge_dense(m: ParamAffineMap) -> ParamAffineMap:
    """``m`` with every location whose pieces form one dense row-major box given as that one box.

    A location holding several pieces that are, together, one box of the logical tensor filling
    its shard in row-major order (each piece where the box's row-major layout puts it, the pieces
    disjoint, every one declaring the same holders) holds exactly what one piece of that box
    holds: the same elements at the same addresses. Peers that describe one box per rank (Megatron,
    Awex) are given that box. Any other location, and any map with a piece that is not a plain box,
    is left as it is (the translation then says why it cannot be expressed).
    """
    logical = m.logical_shape
    rm = row_major_strides(logical)
    pieces: dict[int, list[AffinePiece]] = {}
    changed = False
    for loc, ps in m.pieces_by_rank.items():
        full = [p for p in ps if volume(p.shape)]
        shard = m.shard_shapes.get(loc)
        merged = _merge_location(full, shard, logical, rm) if len(full) > 1 and shard is not None else None
        if merged is None:
            pieces[loc] = list(ps)
        else:
            pieces[loc] = [merged]
            changed = True
    return ParamAffineMap(logical, dict(m.shard_shapes), pieces) if changed else m


def _merge_location(full: Sequence[AffinePiece], shard: Sequence[int], logical: tuple[int, ...],
                    rm: tuple[int, ...]) -> AffinePiece | None:
    """One piece for ``full`` when together they are one dense row-major box filling ``shard``."""
    holders = {tuple(sorted(p.locations)) for p in full}
    if len(holders) != 1 or any(p.scale != 1.0 or len(p.shape) != len(logical) for p in full):
        return None
    origins = []
    for p in full:
        origin = decode_row_major(p.source_offset, logical)
        if origin is None or any(e > 1 and s != r for e, s, r in zip(p.shape, p.source_strides, rm)):
            return None
        if any(o + e > n for o, e, n in zip(origin, p.shape, logical)):
            return None
        origins.append(origin)
    lo = tuple(min(o[d] for o in origins) for d in range(len(logical)))
    hi = tuple(max(o[d] + p.shape[d] for o, p in zip(origins, full)) for d in range(len(logical)))
    shape = tuple(b - a for a, b in zip(lo, hi))
    if tuple(shard) != shape or sum(volume(p.shape) for p in full) != volume(shape):
        return None
    local = row_major_strides(shape)
    for origin, p in zip(origins, full):
        offset = sum((o - a) * s for o, a, s in zip(origin, lo, local))
        if p.dest_offset != offset or len(p.dest_strides) != len(shape) or \
                _norm_strides(p.shape, p.dest_strides) != _norm_strides(p.shape, local):
            return None
    if overlapping_pairs([Box(o, tuple(p.shape)) for o, p in zip(origins, full)]):
        return None
    return AffinePiece(shape, sum(a * s for a, s in zip(lo, rm)), rm, 0, local, list(holders.pop()))


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


@dataclass(frozen=True)
class OneSourceFloor:
    """The largest need no one-source-per-receiver-and-parameter plan can spread (``one_source_floor``)."""

    bytes: int
    """Bytes (elements without ``element_size``) the busiest such sender moves at least."""
    parameter: str
    target_location: int
    holders: tuple[int, ...]
    """The source locations one of which moves them: replicas of the same part of the parameter."""
    regions: int
    """How many source regions (boxes) of the parameter those bytes come from."""


def one_source_floor(case: Case, placement: Mapping[str, Mapping[int, int]] | None = None,
                     receivers: Mapping[str, Mapping[int, int]] | None = None) -> OneSourceFloor | None:
    """A lower bound on the busiest sender of any plan that reads, for each target location and
    parameter, all it needs of one part of the parameter from one replica of that part (a peer
    whose replica choice is per receiver and parameter), counted as the judge counts loads
    (``runner.sender_loads``: processes from the case's endpoints, else ``placement``; a need a
    holder on the receiver's own process could serve as a local copy is left out).

    Why: Megatron-Core picks one source metadata per (destination rank, parameter) and reads every
    slice from that metadata's TP group (0.16.1 planner.py:306; 0.19.2 planner.py:349, and 279 for
    a whole tensor), and Awex one training replica per inference replica and parameter
    (transfer_plan.py:288, 320-323). A bound below this floor is one that no choice of replicas
    within such a peer's documented granularity can meet: a ``quality`` result there is its
    contract, not a replica choice refplan's policy would fix. ``receivers`` (parameter -> target
    location -> group) makes the choice per group of target locations instead (Awex: an inference
    replica, all of whose ranks read one training replica); the chosen holder then sends what
    every member of the group not on its own process needs, and the floor takes the holder for
    which that is least.

    The parts: the parameter's source regions grouped by their holder sets. Where every location
    holds regions of one holder set only (a TP x DP layout: each set is a TP position, its
    members the DP replicas of it), whichever replica serves a receiver sends it everything the
    receiver needs of that set's regions. Otherwise (replicas that hold different combinations
    of regions) only a single region's need is certain to come from one holder. Computed from the
    case's maps alone (regions and intersections as the planner builds them), never from the
    peer's answer; ``None`` when the maps do not validate.
    """
    from ...box import WorkCounter
    from ...frames import normalize
    from ...regions import intersections, source_regions

    bound = case.processes(placement)  # as the judge binds them (``runner.sender_loads``)
    src_proc, tgt_proc = bound if bound is not None else (None, None)
    best: OneSourceFloor | None = None
    try:
        pairs = _case_maps(case, None)
        for name, (target, source) in pairs.items():
            regions = source_regions(normalize(source, "source", name), WorkCounter())
            parts = intersections(normalize(target, "target", name), regions, WorkCounter())
            holders_of = {r.box: tuple(sorted({f.location for f in r.holders})) for r in regions}
            sets_of: dict[int, set[tuple[int, ...]]] = {}
            for holders in holders_of.values():
                for h in holders:
                    sets_of.setdefault(h, set()).add(holders)
            by_set = all(len(found) == 1 for found in sets_of.values())
            group_of = (receivers or {}).get(name, {})
            # (receiver group, part) -> target location -> elements, and the regions counted
            need: dict[tuple[Any, Any], dict[int, int]] = {}
            counted: dict[tuple[Any, Any], set[Any]] = {}
            for part in parts:
                box, location = part.region.box, part.target.location
                key = (group_of.get(location, ("location", location)), holders_of[box] if by_set else box)
                members = need.setdefault(key, {})
                members[location] = members.get(location, 0) + part.box.volume
                counted.setdefault(key, set()).add(box)
            unit = case.unit(name)
            for key, members in need.items():
                holders = holders_of[next(iter(counted[key]))]  # every region of a part has its holders

                def sent(h: int, members: dict[int, int] = members) -> int:
                    # A member on the holder's own process copies locally: the judge counts no send.
                    if src_proc is None or tgt_proc is None or src_proc.get(h) is None:
                        return sum(members.values())
                    return sum(n for t, n in members.items() if tgt_proc.get(t) != src_proc[h])

                nbytes = min(map(sent, holders)) * unit
                if best is None or nbytes > best.bytes:
                    best = OneSourceFloor(nbytes, name, min(members), holders, len(counted[key]))
    except (AffineTransferError, Inexpressible):
        return None
    return best


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


class PeerAdapter(Adapter):
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
        contract = tuple(self.contract(case, problem))
        try:
            with _quiet():
                output = self.call_peer(problem)
        except _DELIBERATE as exc:
            return Outcome("refuse", error=type(exc).__name__, message=_first_line(exc), contract=contract)
        except Exception as exc:
            return Outcome("crash", error=type(exc).__name__, message=_first_line(exc), contract=contract)
        try:
            # The adapter's own reading of the answer, apart from the peer's call: a ValueError of
            # its own (slices that disagree with an overlap) was taken for the peer's deliberate
            # refusal, and passed a case that must be refused (a maintainer's review, 2026-12-06).
            plans = self.convert(problem, output)
        except Exception as exc:
            return Outcome("error", message=f"the adapter could not read {self.name}'s answer: "
                                            f"{type(exc).__name__}: {_first_line(exc)}")
        try:
            design = self.design(problem, output)
            defect = "" if design else self.defect(problem, output)
        except Exception as exc:
            return Outcome("error", message=f"the adapter could not check {self.name}'s answer against its "
                                            f"documented choice: {type(exc).__name__}: {_first_line(exc)}")
        return Outcome("accept", plans=plans, contract=contract, placement=self.placement(case, problem),
                       design=design, defect=defect, unjudged_loads=self.unjudged_loads(problem))

    def translate(self, case: Case) -> Any:
        raise NotImplementedError

    def placement(self, case: Case, problem: Any) -> Mapping[str, Mapping[int, int]] | None:
        """``Outcome.placement``: the processes this adapter ran a case's locations on when the case
        names none and the peer needs them placed; ``None`` (each location its own process) by default."""
        return None

    def design(self, problem: Any, output: Any) -> str:
        """Whether the peer's answer reads every region where its own documented choice of source
        puts it (``Outcome.design``): that rule in words, with its file:line, or ``""`` (not checked,
        or some read elsewhere). Only for the release whose rule was read. None by default."""
        return ""

    def defect(self, problem: Any, output: Any) -> str:
        """Whether the peer's answer is the one a published defect makes (``Outcome.defect``): that
        finding's note, or ``""``. Asked only when ``design`` found a read away from the documented
        rule. None by default."""
        return ""

    def by_design(self, case_id: str) -> bool:
        """Whether a ``quality`` result on ``case_id`` is the peer's documented design (a finding
        whose verdict is ``enhancement``): the judge then reports it as ``enhancement``, apart
        from the defects. Only for the release whose design the finding read (its ``version`` in
        this adapter's name): another release that loads the same case so is judged afresh, as
        ``quality``, never excused by a citation of code it may no longer have."""
        from .findings import cause_of

        finding = cause_of(self.name, case_id, "enhancement")
        return finding is not None and finding.version in self.name

    def cause(self, case_id: str, verdict: str) -> str:
        """The root cause of a ``fail``, ``quality`` or ``enhancement`` result
        (``findings.FINDINGS``), in words."""
        from .findings import cause_of

        finding = cause_of(self.name, case_id, verdict)
        if finding is None:
            return "cause not yet explained (no entry in refplan/conformance/peers/findings.py)"
        return finding.note()

    def unjudged_loads(self, problem: Any) -> str:
        """Why the case's loads are no load the peer's users meet, though its copies are judged
        (``Outcome.unjudged_loads``), read from the case's structure; "" (judged) by default."""
        return ""

    def contract(self, case: Case, problem: Any) -> list[tuple[str, ...]]:
        """(verdict, why) pairs (``Outcome.contract``): what the peer's own documented contract
        allows in this case that refplan's rules forbid, read from the case's structure alone (never
        from the peer's answer), each naming the peer's file:line. None by default."""
        return []

    def call_peer(self, problem: Any) -> Any:
        """Only the peer's own planning routine (what ``refplan bench`` times); returns its output."""
        raise NotImplementedError

    def convert(self, problem: Any, output: Any) -> dict[str, Any]:
        """The peer's output as plan dicts (``{logical_shape, segments}``) per parameter."""
        raise NotImplementedError

    def rebuild(self, problem: Any) -> dict[str, tuple[ParamAffineMap, ParamAffineMap]]:
        """(target, source) maps per parameter, read back from the peer's input objects alone."""
        raise NotImplementedError

    merges_boxes = False
    """Whether a location's pieces forming one dense row-major box reach the peer as that box
    (``merge_dense``): peers that describe one box per rank."""

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
                # Piece for piece against the case's map as the peer is given it (dense boxes merged)
                given = merge_dense(original) if self.merges_boxes else original
                why = maps_differ(given, rebuilt[name][index])
                if why is None and given is not original and self.check_memory and original.numel <= 1 << 16:
                    why = maps_differ(original, rebuilt[name][index], elements=True, pieces=False)
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
