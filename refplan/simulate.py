"""Element-level ground truth: execute a plan with numpy on marker data and count every write.

Why this module exists: the planner and the oracle (``verify``) reason about boxes and never look
at an element. A reasoning error shared by both would go unnoticed unless something judges plans
the slow, obvious way. This module is that judge. It fills F with *markers* (a unique value per
logical element), cuts source shards out of F exactly as the source map says, runs every segment
as a strided copy, and compares each target shard with what the target map says it should hold.
Tests use it as the ground truth the fast checkers are held against (``verify ok <=> simulate
exact``).

What it buys and what it does not:

- Every target element carries a write count, so a gap (0) and a double write (2+) are seen even
  when the final value happens to be right.
- Shards live inside larger buffers with ``guard`` sentinel elements on both sides. A segment
  whose footprint leaves its shard is refused before it runs (``as_strided`` does not check
  bounds), and the guards are checked afterwards as a second line of defence against a stray write.
- It is the *only* module allowed to touch elements, and only under ``max_elements``: it refuses
  a larger job with ``AffineTransferError`` instead of truncating it, because a simulation that
  skipped part of a plan would report "exact" for what it never executed.
- It proves nothing about other data: markers make "equal value" mean "same logical element",
  but only for this one run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .box import volume
from .errors import AffineTransferError, InvalidMapError, UnsupportedLayoutError
from .maps import ParamAffineMap, as_int
from .plan import TransferPlan, TransferSegment

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "SimulationReport",
    "SimulationResult",
    "extract_shards",
    "logical_markers",
    "simulate",
    "simulate_transfer",
]

DEFAULT_MAX_ELEMENTS = 1 << 24

Array = np.ndarray[Any, Any]
PlanLike = TransferPlan | Mapping[str, Any] | Sequence[Any]


def _refuse_budget(what: str, needed: int, max_elements: int) -> None:
    if needed > max_elements:
        raise AffineTransferError(
            f"{what} would touch {needed} elements, more than max_elements={max_elements}; "
            "refused rather than truncated"
        )


def _extents(shape: Any, what: str) -> tuple[int, ...]:
    """``shape`` as non-negative exact ints (``maps.as_int``: no bool, no float, no truncation), or
    ``InvalidMapError`` naming ``what``.

    Why before anything else: the element budget is a sum of volumes, and the volume of a shape
    with one negative extent is negative, so an unchecked shape could cancel a huge shard elsewhere
    and let it be allocated under ``max_elements`` (two negative extents even make a positive
    volume: ``(-2, -3)`` passed as 6 elements). ``int()`` would also truncate a 3.7 into a
    3-element shard that no map describes."""
    try:
        items = tuple(shape)
    except TypeError:
        raise InvalidMapError(f"{what}: shape {shape!r} is not a sequence of extents") from None
    out: list[int] = []
    for extent in items:
        value = as_int(extent)
        if value is None:
            raise InvalidMapError(f"{what}: extent {extent!r} of shape {items!r} is not an integer "
                                  f"(a {type(extent).__name__})")
        if value < 0:
            raise InvalidMapError(f"{what}: shard shape {items!r} has a negative extent")
        out.append(value)
    return tuple(out)


def _location(key: Any, what: str) -> int:
    """A location key as an exact int (``maps.as_int``), or ``InvalidMapError``: ``int(0.5)`` would
    silently make it location 0."""
    value = as_int(key)
    if value is None:
        raise InvalidMapError(f"{what} location {key!r} is not an integer (a {type(key).__name__})")
    return value


def logical_markers(
    shape: Sequence[int], dtype: Any = np.int64, *, max_elements: int = DEFAULT_MAX_ELEMENTS
) -> Array:
    """F filled with its own flat index: element ``k`` (row-major) holds ``k``.

    Markers make a value identify its logical element, so "target equals expected" means "every
    element landed where it belongs" rather than "the data happened to agree". A narrow dtype
    (fp16 above 2048, int8 above 127) would repeat values and hide a misplaced element, so the
    round trip back to int64 must be exact or this raises ``ValueError``. Extents follow the
    integer rule (``maps.as_int``): a float or a bool is a ``TypeError``, never truncated (``int()``
    made ``(2.9,)`` a 2-element F), and a negative extent a ``ValueError``.
    """
    extents: list[int] = []
    for extent in shape:
        value = as_int(extent)
        if value is None:
            raise TypeError(f"logical shape {tuple(shape)!r}: extent {extent!r} is not an integer "
                            f"(a {type(extent).__name__})")
        extents.append(value)
    shape_t = tuple(extents)
    if any(s < 0 for s in shape_t):
        raise ValueError(f"logical shape {shape_t} has a negative extent")
    numel = volume(shape_t)
    _refuse_budget(f"markers for logical shape {shape_t}", numel, max_elements)
    exact = np.arange(numel, dtype=np.int64)
    with np.errstate(all="ignore"):
        cast = exact.astype(dtype)
        back = cast.astype(np.int64) if cast.dtype.kind in "fciub" else None
    if back is None or not np.array_equal(back, exact):
        raise ValueError(
            f"dtype {np.dtype(dtype)} cannot hold {numel} distinct integer markers exactly; "
            "use a wider dtype"
        )
    return cast.reshape(shape_t)


def _nonempty(shape: Sequence[int]) -> bool:
    """Whether a shape holds at least one element (a 0-d shape holds one)."""
    return all(s > 0 for s in shape)


def _footprint(offset: int, shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int]:
    """Lowest and highest element address a strided view touches (shape must be non-empty)."""
    lo = hi = offset
    for size, stride in zip(shape, strides):
        reach = (size - 1) * stride
        if reach < 0:
            lo += reach
        else:
            hi += reach
    return lo, hi


def _stepped(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """Strides with those of size-1 axes set to 0: such an axis is never stepped, so a map may give
    it any stride (even 2**62), which numpy's byte strides must not be asked to represent."""
    return tuple(0 if size <= 1 else stride for size, stride in zip(shape, strides))


def _view(flat: Array, base: int, offset: int, shape: Sequence[int], strides: Sequence[int]) -> Array:
    """``as_strided`` view of ``flat`` at element ``base + offset``; the caller checked the bounds.

    ``as_strided`` trusts its arguments completely, so every call site proves first that the
    footprint lies inside ``flat``; this helper repeats that check so memory outside ``flat`` is
    never touched even if a caller's check were wrong.
    """
    strides = _stepped(shape, strides)
    lo, hi = _footprint(base + offset, shape, strides)
    if lo < 0 or hi >= flat.size:  # not an ``assert``: it must survive ``python -O``
        raise AssertionError(f"strided view {lo}..{hi} would leave its buffer of {flat.size} elements")
    item = flat.itemsize
    start = flat[base + offset:]
    return np.lib.stride_tricks.as_strided(
        start, shape=tuple(shape), strides=tuple(s * item for s in strides), writeable=True
    )


def _addresses(offset: int, shape: Sequence[int], strides: Sequence[int]) -> Array:
    """Flat address of every element of a strided view, in row-major order of its index."""
    strides = _stepped(shape, strides)
    addr = np.full((1,) * len(shape), offset, dtype=np.int64)
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        step_shape = [1] * len(shape)
        step_shape[axis] = size
        addr = addr + (np.arange(size, dtype=np.int64) * stride).reshape(step_shape)
    return np.broadcast_to(addr, tuple(shape)).reshape(-1)


def extract_shards(
    param_map: ParamAffineMap, full: Array, *, max_elements: int = DEFAULT_MAX_ELEMENTS
) -> dict[int, Array]:
    """Each location's flat shard as ``param_map`` says it holds ``full`` (scale 1 only).

    This is what a correct source must contain and what a correct transfer must produce. Every
    piece is applied through ``as_strided`` on the flat arrays, which is exactly the meaning of
    its offsets and strides, so no interpretation can drift from the map. Because ``as_strided``
    does not check bounds, each piece's footprint is checked first (``InvalidMapError``). Every
    shard address must be written exactly once: a hole or a double write leaves the expected
    content undefined, so the map is refused rather than guessed at (Premise A, element by
    element). A scaled piece is refused (``UnsupportedLayoutError``): markers divided by a scale
    would no longer identify elements.
    """
    logical = tuple(param_map.logical_shape)
    if tuple(full.shape) != logical:
        raise InvalidMapError(f"full tensor has shape {tuple(full.shape)}, the map describes {logical}")
    flat_full = np.ascontiguousarray(full).reshape(-1)
    ranks = param_map.ranks
    # Every shard shape is checked before its volume enters the budget (see ``_extents``).
    shards = {rank: _extents(shape, f"location {rank}") for rank, shape in param_map.shard_shapes.items()}
    needed = 0
    for rank in ranks:
        shard = shards.get(rank)
        if shard is not None:
            needed += volume(shard)
        needed += sum(p.numel for p in param_map.pieces_by_rank.get(rank, ()) if _nonempty(p.shape))
    _refuse_budget("extracting shards", needed, max_elements)
    out: dict[int, Array] = {}
    for rank in ranks:
        pieces = param_map.pieces_by_rank.get(rank, ())
        shard_shape = shards.get(rank)
        if shard_shape is None:
            if any(_nonempty(p.shape) for p in pieces):
                raise InvalidMapError(f"location {rank} lists pieces but declares no shard shape")
            continue
        flat = np.zeros(volume(shard_shape), dtype=flat_full.dtype)
        written = np.zeros(flat.size, dtype=np.int64)
        for index, piece in enumerate(pieces):
            where = f"location {rank}, piece {index}"
            if any(s < 0 for s in piece.shape):
                raise InvalidMapError(f"{where}: negative extent in shape {piece.shape}")
            if not _nonempty(piece.shape):
                continue
            if piece.scale != 1.0:
                raise UnsupportedLayoutError(
                    f"{where}: scale {piece.scale} != 1; markers would no longer identify elements"
                )
            ndim = len(piece.shape)
            if len(piece.source_strides) != ndim or len(piece.dest_strides) != ndim:
                raise InvalidMapError(f"{where}: stride vector length does not match shape {piece.shape}")
            s_lo, s_hi = _footprint(piece.source_offset, piece.shape, piece.source_strides)
            if s_lo < 0 or s_hi >= flat_full.size:
                raise InvalidMapError(
                    f"{where}: reads F addresses {s_lo}..{s_hi}, outside the {flat_full.size} elements of F"
                )
            d_lo, d_hi = _footprint(piece.dest_offset, piece.shape, piece.dest_strides)
            if d_lo < 0 or d_hi >= flat.size:
                raise InvalidMapError(
                    f"{where}: writes shard addresses {d_lo}..{d_hi}, outside the {flat.size} elements "
                    f"of shard {shard_shape}"
                )
            src = _view(flat_full, 0, piece.source_offset, piece.shape, piece.source_strides)
            dst = _view(flat, 0, piece.dest_offset, piece.shape, piece.dest_strides)
            dst[...] = src
            written += np.bincount(
                _addresses(piece.dest_offset, piece.shape, piece.dest_strides), minlength=flat.size
            )
        bad = np.flatnonzero(written != 1)
        if bad.size:
            at = int(bad[0])
            raise InvalidMapError(
                f"location {rank}: shard address {at} is written {int(written[at])} times by the pieces; "
                "a shard must be tiled exactly by its pieces"
            )
        out[rank] = flat
    return out


@dataclass
class SimulationResult:
    """What executing a plan did.

    ``targets``: each target shard's flat contents, guards stripped. ``write_counts``: how often
    each target element was written (exactly 1 everywhere is the goal). ``guards_intact``: no
    sentinel around any shard changed. ``out_of_bounds``: one description per segment that was
    refused instead of run (a footprint outside its shard, an unknown location, a non-positive
    extent, a negative stride or a malformed stride vector).
    """

    targets: dict[int, Array]
    write_counts: dict[int, Array]
    guards_intact: bool
    out_of_bounds: list[str]


def _default_sentinel(dtype: np.dtype[Any]) -> Any:
    """A value no marker takes: NaN for floats, the far end of the range for integers."""
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind == "i":
        return np.iinfo(dtype).min
    if dtype.kind == "u":
        return np.iinfo(dtype).max
    return 0


def _is_sentinel(values: Array, sentinel: Any) -> bool:
    if values.dtype.kind in "fc" and isinstance(sentinel, float) and np.isnan(sentinel):
        return bool(np.all(np.isnan(values)))
    return bool(np.all(values == sentinel))


def _segments_of(plan: PlanLike) -> tuple[tuple[TransferSegment, ...], tuple[int, ...] | None]:
    """Accept a ``TransferPlan``, a plan dict, or a list of segments (objects or dicts)."""
    if isinstance(plan, TransferPlan):
        return plan.segments, plan.logical_shape
    if isinstance(plan, Mapping):
        parsed = TransferPlan.from_dict(plan)
        return parsed.segments, parsed.logical_shape
    segs = tuple(
        s if isinstance(s, TransferSegment) else TransferSegment.from_dict(s, f"segments[{i}]")
        for i, s in enumerate(plan)
    )
    return segs, None


def _refusal(index: int, seg: TransferSegment, side: str, shard: tuple[int, ...] | None) -> str | None:
    """Why this side of a segment must not run, or ``None`` when its footprint is inside the shard."""
    rank = seg.source_rank if side == "source" else seg.target_rank
    offset = seg.source_offset if side == "source" else seg.target_offset
    strides = seg.source_strides if side == "source" else seg.target_strides
    head = f"segment {index} ({side} location {rank}, offset {offset}, shape {seg.shape}, strides {strides})"
    if shard is None:
        return f"{head}: the {side} has no shard at location {rank}"
    if len(strides) != len(seg.shape):
        return f"{head}: stride vector length does not match the shape"
    if any(s <= 0 for s in seg.shape):
        return f"{head}: every extent must be positive"
    if any(s < 0 for s in strides):
        return f"{head}: negative strides are not executable"
    lo, hi = _footprint(offset, seg.shape, strides)
    numel = volume(shard)
    if lo < 0 or hi >= numel:
        return f"{head}: touches addresses {lo}..{hi}, outside the {numel} elements of shard {shard}"
    return None


def simulate(
    plan: PlanLike,
    source_shards: Mapping[int, Array],
    target_shapes: Mapping[int, Sequence[int]],
    *,
    guard: int = 7,
    sentinel: Any = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> SimulationResult:
    """Run every segment in plan order as a strided copy into sentinel-filled, guarded targets.

    Targets start as the sentinel, so an unwritten element is visible even without the counts.
    Sources sit in guarded buffers too, so the memory around a shard is never real data. A
    segment is refused (listed in ``out_of_bounds``, not run) when either footprint leaves its
    shard: running it would read or write memory that is not the shard, and ``as_strided`` would
    not stop it. The refusal check runs before any copy, and the elements that will be touched
    (segment elements plus all buffers) must fit ``max_elements`` or the whole run is refused.
    Target shapes and location keys are checked first (non-negative exact ints, ``maps.as_int``;
    else ``InvalidMapError`` naming the location): a negative extent would make that budget sum
    lie (see ``_extents``), and ``int()`` would truncate a float extent into another shape.
    """
    if guard < 0:
        raise ValueError(f"guard must be non-negative, got {guard}")
    segments, _shape = _segments_of(plan)
    sources = {_location(r, "source"): np.ascontiguousarray(a).reshape(-1) for r, a in source_shards.items()}
    dtype = np.result_type(*sources.values()) if sources else np.dtype(np.int64)
    fill = _default_sentinel(dtype) if sentinel is None else sentinel
    # Checked before the budget sums their volumes and before any buffer exists (see ``_extents``).
    shapes: dict[int, tuple[int, ...]] = {}
    for r, shape in target_shapes.items():
        rank = _location(r, "target")
        shapes[rank] = _extents(shape, f"target location {rank}")
    source_shapes = {r: (a.size,) for r, a in sources.items()}

    refused: list[str] = []
    runnable: list[TransferSegment] = []
    for index, seg in enumerate(segments):
        why = _refusal(index, seg, "source", source_shapes.get(seg.source_rank))
        why = why or _refusal(index, seg, "target", shapes.get(seg.target_rank))
        if why is None:
            runnable.append(seg)
        else:
            refused.append(why)

    buffers = sum(a.size + 2 * guard for a in sources.values())
    buffers += sum(volume(s) + 2 * guard for s in shapes.values())
    _refuse_budget("simulating the plan", buffers + sum(s.numel for s in runnable), max_elements)

    src_buf: dict[int, Array] = {}
    for rank, flat in sources.items():
        buf = np.full(flat.size + 2 * guard, fill, dtype=dtype)
        buf[guard:guard + flat.size] = flat
        src_buf[rank] = buf
    dst_buf = {r: np.full(volume(s) + 2 * guard, fill, dtype=dtype) for r, s in shapes.items()}
    writes: dict[int, list[Array]] = {r: [] for r in shapes}
    for seg in runnable:
        src = _view(src_buf[seg.source_rank], guard, seg.source_offset, seg.shape, seg.source_strides)
        dst = _view(dst_buf[seg.target_rank], guard, seg.target_offset, seg.shape, seg.target_strides)
        dst[...] = src
        writes[seg.target_rank].append(_addresses(seg.target_offset, seg.shape, seg.target_strides))

    intact = True
    targets: dict[int, Array] = {}
    counts: dict[int, Array] = {}
    for rank, buf in dst_buf.items():
        n = buf.size - 2 * guard
        intact &= _is_sentinel(buf[:guard], fill) and _is_sentinel(buf[guard + n:], fill)
        targets[rank] = buf[guard:guard + n].copy()
        addrs = np.concatenate(writes[rank]) if writes[rank] else np.zeros(0, dtype=np.int64)
        counts[rank] = np.bincount(addrs, minlength=n).astype(np.int64)
    for buf in src_buf.values():
        n = buf.size - 2 * guard
        intact &= _is_sentinel(buf[:guard], fill) and _is_sentinel(buf[guard + n:], fill)
    return SimulationResult(targets, counts, bool(intact), refused)


@dataclass
class SimulationReport:
    """``simulate`` on markers, judged: ``exact`` only if every target element was written once,
    holds the marker the target map expects there, no guard changed and no segment was refused.
    ``first_mismatch`` says where it went wrong first (``None`` when exact)."""

    result: SimulationResult
    expected: dict[int, Array]
    exact: bool
    first_mismatch: str | None


def _describe_marker(value: Any, logical: tuple[int, ...]) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    try:
        as_int = int(value)
    except (TypeError, ValueError, OverflowError):
        return repr(value)
    if 0 <= as_int < volume(logical) and as_int == value:
        coord = tuple(int(c) for c in np.unravel_index(as_int, logical)) if logical else ()
        return f"logical {coord} (marker {as_int})"
    return f"{value!r} (not a marker)"


def simulate_transfer(
    target_map: ParamAffineMap,
    source_map: ParamAffineMap,
    plan: PlanLike,
    *,
    dtype: Any = np.int64,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> SimulationReport:
    """Execute ``plan`` from ``source_map``'s shards of marker data and compare with ``target_map``.

    This is the end-to-end ground truth: it needs no reasoning about boxes, holders or replicas,
    only the maps' literal meaning. Each stage (markers, extraction, simulation) is bounded by
    ``max_elements`` on its own. Maps that disagree on the logical shape raise
    ``InvalidMapError`` (there is no common F to fill); a plan that names another logical shape is
    simply not exact.
    """
    logical = tuple(target_map.logical_shape)
    if tuple(source_map.logical_shape) != logical:
        raise InvalidMapError(
            f"target map describes {logical}, source map {tuple(source_map.logical_shape)}: no common F"
        )
    segments, plan_shape = _segments_of(plan)
    markers = logical_markers(logical, dtype, max_elements=max_elements)
    sources = extract_shards(source_map, markers, max_elements=max_elements)
    expected = extract_shards(target_map, markers, max_elements=max_elements)
    result = simulate(
        segments,
        sources,
        {r: s for r, s in target_map.shard_shapes.items()},
        max_elements=max_elements,
    )
    first: str | None = None
    if plan_shape is not None and plan_shape != logical:
        first = f"the plan describes logical shape {plan_shape}, the maps {logical}"
    elif result.out_of_bounds:
        first = f"refused {result.out_of_bounds[0]}"
    elif not result.guards_intact:
        first = "a guard element around a shard changed"
    else:
        for rank in sorted(expected):
            got = result.targets[rank]
            want = expected[rank]
            count = result.write_counts[rank]
            bad = np.flatnonzero((count != 1) | (got != want))
            if bad.size:
                at = int(bad[0])
                first = (
                    f"target location {rank}, offset {at}: expected {_describe_marker(want[at], logical)}, "
                    f"got {_describe_marker(got[at], logical)}, written {int(count[at])} time(s)"
                )
                break
    return SimulationReport(result, expected, first is None, first)
