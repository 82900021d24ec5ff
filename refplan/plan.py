"""Plans: segments, statistics, budgets, emission, coalescing and the JSON forms.

A ``TransferSegment`` copies one strided box: ``shape`` elements read from a source location's
shard at ``source_offset`` with ``source_strides`` and written to a target location's shard at
``target_offset`` with ``target_strides`` (``torch.as_strided`` arguments, in elements). Its dict
form is DeepSpeed's (``{shape, source: [rank, offset, strides], target: [rank, offset, strides]}``)
so plans can be compared and verified across implementations.

Coalescing ("physical folding") joins two segments of the same (source, target) pair when they
are adjacent in memory on *both* sides along one axis and equal on every other axis. That keeps
the set of (read address, write address) pairs unchanged (``proofs/theorem3.md``, coalescing
lemma). Unlike DeepSpeed's folding, a merge must also keep the segment a box inside both shards
(no wrap-around into the next row): every segment of a refplan plan is then a box in both shards,
which is what the oracle and the executor's chunking rely on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from operator import attrgetter, index
from typing import Any

import numpy as np

from . import limits
from .box import row_major_strides, volume
from .errors import AffineTransferError, InvalidMapError, show_int
from .limits import PlanBudget
from .maps import describe, is_int

__all__ = [
    "PlanBudget",
    "PlanStatistics",
    "TransferPlan",
    "TransferSegment",
    "coalesce",
    "encode_plan",
]



def __getattr__(name: str) -> str:
    """``MAPS_FORMAT`` and ``PLANS_FORMAT`` moved to ``formats`` (which owns every file format);
    still importable from here. Looked up lazily because ``formats`` imports this module."""
    if name in ("MAPS_FORMAT", "PLANS_FORMAT"):
        from . import formats

        value: str = getattr(formats, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class PlanStatistics:
    """What planning one parameter cost and produced (for reports, budgets and benchmarks)."""

    source_pieces: int = 0
    target_pieces: int = 0
    pair_checks: int = 0
    segments_before_merge: int = 0
    segments: int = 0
    plan_bytes: int = 0
    requests: int = 0
    split_requests: int = 0
    merge_checks: int = 0


@dataclass(frozen=True, order=True)
class TransferSegment:
    """One strided box copy between a source location's shard and a target location's shard."""

    source_rank: int
    source_offset: int
    source_strides: tuple[int, ...]
    target_rank: int
    target_offset: int
    target_strides: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return volume(self.shape)

    def sort_key(self) -> tuple[Any, ...]:
        """The plan's canonical order: by target address, then source address."""
        return (
            self.target_rank,
            self.target_offset,
            self.source_rank,
            self.source_offset,
            self.shape,
            self.source_strides,
            self.target_strides,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "source": [self.source_rank, self.source_offset, list(self.source_strides)],
            "target": [self.target_rank, self.target_offset, list(self.target_strides)],
        }

    @classmethod
    def from_dict(cls, entry: Any, where: str = "$") -> TransferSegment:
        return _parse_segment(entry, lambda: where)


def make_segment(
    source_rank: int,
    source_offset: int,
    source_strides: tuple[int, ...],
    target_rank: int,
    target_offset: int,
    target_strides: tuple[int, ...],
    shape: tuple[int, ...],
) -> TransferSegment:
    """``TransferSegment(...)`` for values the planner already computed, in half the time.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; the planner
    builds one segment per part of 10⁵-piece plans, so it fills the instance dictionary in one
    step instead. The result is an ordinary, equal ``TransferSegment``.
    """
    segment = _new_object(TransferSegment)
    _set_attribute(segment, "__dict__", {
        "source_rank": source_rank, "source_offset": source_offset, "source_strides": source_strides,
        "target_rank": target_rank, "target_offset": target_offset, "target_strides": target_strides,
        "shape": shape,
    })
    return segment


_new_object = object.__new__
_set_attribute = object.__setattr__


def make_plan(
    segments: tuple[TransferSegment, ...],
    logical_shape: tuple[int, ...],
    moved_elements: int,
    statistics: PlanStatistics,
) -> TransferPlan:
    """``TransferPlan(...)`` for values the planner already computed, filled in one step as
    ``make_segment`` does (once per parameter); an ordinary, equal ``TransferPlan``."""
    plan = _new_object(TransferPlan)
    _set_attribute(plan, "__dict__", {
        "segments": segments, "logical_shape": logical_shape, "moved_elements": moved_elements,
        "statistics": statistics,
    })
    return plan


def make_statistics(
    source_pieces: int,
    target_pieces: int,
    pair_checks: int,
    segments_before_merge: int,
    segments: int,
    plan_bytes: int,
    requests: int,
    split_requests: int,
    merge_checks: int,
) -> PlanStatistics:
    """``PlanStatistics(...)`` of the planner's own counts, filled in one step (once per parameter)."""
    stats = _new_object(PlanStatistics)
    _set_attribute(stats, "__dict__", {
        "source_pieces": source_pieces, "target_pieces": target_pieces, "pair_checks": pair_checks,
        "segments_before_merge": segments_before_merge, "segments": segments, "plan_bytes": plan_bytes,
        "requests": requests, "split_requests": split_requests, "merge_checks": merge_checks,
    })
    return stats


def _triple(value: Any, where: Callable[[], str], side: str) -> tuple[int, int, tuple[int, ...]]:
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 3
        and all(is_int(v) for v in value[:2])
        and isinstance(value[2], (list, tuple))
        and all(is_int(v) for v in value[2])
    )
    if not ok:
        raise InvalidMapError(f"{where()}.{side}: expected [rank, offset, [strides...]], got {describe(value)}")
    # ``operator.index``, the integer rule's value (``maps.as_int``), never ``int()``: an int
    # subclass whose ``__int__`` says another number was judged at that number, and is its
    # ``__index__`` value to every other reader (json, numpy, torch): "ok" for a wrong plan.
    rank, offset, strides = index(value[0]), index(value[1]), tuple(index(v) for v in value[2])
    _capped(rank, where, f"{side}[0]", "location")  # R3a's cap: no map has a location beyond it
    _capped(offset, where, f"{side}[1]", "offset")
    for axis, stride in enumerate(strides):
        _capped(stride, where, f"{side}[2][{axis}]", "stride")
    return rank, offset, strides


def _capped(value: int, where: Callable[[], str], field: str, what: str) -> None:
    """Refuse a number past ``limits.MAX_COORDINATE`` (2**62) in magnitude, the cap the maps use.

    Every later step (the oracle's int64 addresses, the executor's ``torch.as_strided``) does
    int64 arithmetic on these; a stride of 2**63 on an extent-1 axis passes every range check
    (they multiply by extent − 1) and overflows only once bytes are moving, so it is refused here,
    by arithmetic, where the plan enters.
    """
    if abs(value) > limits.MAX_COORDINATE:
        raise InvalidMapError(f"{where()}.{field}: {what} {show_int(value)} is above 2**62 in magnitude")


def _parse_segment(entry: Any, where: Callable[[], str]) -> TransferSegment:
    """One segment from its dict form; ``where`` is only called to build an error message."""
    if not isinstance(entry, Mapping) or "shape" not in entry or "source" not in entry or "target" not in entry:
        raise InvalidMapError(f"{where()}: expected {{shape, source, target}}")
    shape = entry["shape"]
    if not isinstance(shape, (list, tuple)) or not all(is_int(v) for v in shape):
        raise InvalidMapError(f"{where()}.shape: expected a list of integers, got {describe(shape)}")
    for axis, extent in enumerate(shape):
        _capped(index(extent), where, f"shape[{axis}]", "extent")
    s_rank, s_off, s_str = _triple(entry["source"], where, "source")
    t_rank, t_off, t_str = _triple(entry["target"], where, "target")
    return TransferSegment(s_rank, s_off, s_str, t_rank, t_off, t_str, tuple(index(v) for v in shape))


SEGMENT_FIELDS = attrgetter(*(f.name for f in fields(TransferSegment)))
"""A segment's seven fields, in the dataclass's order, read by one C-level call: how the oracle reads
a segment (``oracle.segments.FIELDS``) and the executor checks one, each reading it once."""


@dataclass(frozen=True)
class TransferPlan:
    """The segments for one parameter, in canonical order, with statistics."""

    segments: tuple[TransferSegment, ...]
    logical_shape: tuple[int, ...]
    moved_elements: int
    statistics: PlanStatistics = field(default_factory=PlanStatistics, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"logical_shape": list(self.logical_shape), "segments": [s.to_dict() for s in self.segments]}

    def encode(self) -> bytes:
        """``encode_plan(self.to_dict())``, written directly: no dict per segment.

        ``max_plan_bytes`` is measured on every plan, so this runs once per segment of 10⁵-segment
        plans; the output is byte-identical to the generic encoder (tested).
        """

        return encode_segments(self.segments, self.logical_shape)

    @classmethod
    def from_dict(cls, entry: Any, where: str = "$") -> TransferPlan:
        if not isinstance(entry, Mapping) or "segments" not in entry or "logical_shape" not in entry:
            raise InvalidMapError(f"{where}: expected {{logical_shape, segments}}")
        shape = entry["logical_shape"]
        if not isinstance(shape, (list, tuple)) or not all(is_int(v) for v in shape):
            raise InvalidMapError(f"{where}.logical_shape: expected a list of integers, got {describe(shape)}")
        raw = entry["segments"]
        if not isinstance(raw, (list, tuple)):
            raise InvalidMapError(f"{where}.segments: expected a list, got {type(raw).__name__}")
        segments = tuple(
            _parse_segment(s, partial(_segment_name, where, i)) for i, s in enumerate(raw)
        )
        stats = PlanStatistics(segments=len(segments), segments_before_merge=len(segments))
        return cls(segments, tuple(index(v) for v in shape), sum(s.numel for s in segments), stats)


def encode_segments(segments: Sequence[TransferSegment], logical_shape: tuple[int, ...]) -> bytes:
    """``TransferPlan.encode`` of a plan with these segments and logical shape (the planner
    measures ``max_plan_bytes`` before the plan object exists)."""
    written: dict[tuple[int, ...], str] = {}

    def ints(values: tuple[int, ...]) -> str:
        # Plans repeat a few shapes and stride vectors thousands of times: write each once.
        text = written.get(values)
        if text is None:
            text = written[values] = ",".join(map(str, values))
        return text

    # A plan's segments share a few (shape, strides) combinations: the text around the ranks and
    # offsets is written once per combination, from the same ``ints`` texts.
    around: dict[tuple[tuple[int, ...], ...], tuple[str, str, str]] = {}
    parts: list[str] = []
    append = parts.append
    for s in segments:
        key = (s.shape, s.source_strides, s.target_strides)
        frame = around.get(key)
        if frame is None:
            frame = around[key] = (
                f'{{"shape":[{ints(s.shape)}],"source":[',
                f',[{ints(s.source_strides)}]],"target":[',
                f",[{ints(s.target_strides)}]]}}",
            )
        append(f"{frame[0]}{s.source_rank},{s.source_offset}{frame[1]}{s.target_rank},{s.target_offset}{frame[2]}")
    return f'{{"logical_shape":[{ints(logical_shape)}],"segments":[{",".join(parts)}]}}'.encode()


def _segment_name(where: str, index: int) -> str:
    return f"{where}.segments[{index}]"


def encode_plan(plan_dict: Mapping[str, Any]) -> bytes:
    """The canonical bytes of a plan envelope; ``max_plan_bytes`` and ``plan_bytes`` measure these."""
    return json.dumps(plan_dict, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _decode(offset: int, strides: Sequence[int], shape: Sequence[int]) -> tuple[int, ...] | None:
    coord = []
    rest = offset
    for stride, size in zip(strides, shape):
        q, rest = divmod(rest, stride) if stride > 0 else (0, rest)
        if q >= size:
            return None
        coord.append(q)
    return tuple(coord) if rest == 0 else None


def _decodes(
    offset: int,
    strides: tuple[int, ...],
    shape: tuple[int, ...],
    ends: dict[tuple[tuple[int, ...], tuple[int, ...]], int | None],
) -> bool:
    """``_decode(offset, strides, shape) is not None``, cheaply in the usual case.

    When ``strides`` are the row-major strides of ``shape`` and every extent is positive, the
    greedy decode leaves each later coordinate inside its extent and nothing over (the last
    stride is 1), so it fails exactly when the first coordinate reaches ``shape[0]``: when
    ``offset >= shape[0] * strides[0]``, the shard's volume. ``ends`` remembers that volume per
    (strides, shape), or ``None`` where the shortcut does not apply (then ``_decode`` decides).
    """
    key = (strides, shape)
    end = ends.get(key, _NO_END)
    if end is _NO_END:
        plain = len(shape) > 0 and min(shape) > 0 and strides == row_major_strides(shape)
        end = ends[key] = shape[0] * strides[0] if plain else None
    if end is None:
        return _decode(offset, strides, shape) is not None
    return bool(offset < end)


_NO_END: Any = object()


def _fold_key(s_off: int, t_off: int, extent: Sequence[int], axis: int) -> tuple[int, ...]:
    """Where a segment starts, plus its extents on every axis but ``axis`` (a merge partner's key)."""
    return tuple([s_off, t_off, *extent[:axis], *extent[axis + 1 :]])


def coalesce(
    segments: Sequence[TransferSegment],
    source_shards: Mapping[int, tuple[int, ...]],
    target_shards: Mapping[int, tuple[int, ...]],
    budget: PlanBudget,
    parameter: str = "",
) -> tuple[list[TransferSegment], int]:
    """Fold physically contiguous segments; returns (segments in canonical order, merge checks).

    Per (source location, target location, strides) group, for each axis, a hash of "where does
    a segment starting here end" finds each segment's successor in O(1), so the cost is linear in
    segments per pass (no all-pairs scan). Chains are walked from their heads in address order,
    which makes the result independent of input order. Every lookup counts against
    ``max_merge_checks``; running out refuses the plan.
    """
    groups: dict[tuple[Any, ...], list[TransferSegment]] = {}
    for seg in segments:
        key = (seg.source_rank, seg.target_rank, seg.source_strides, seg.target_strides, len(seg.shape))
        groups.setdefault(key, []).append(seg)
    checks = 0
    out: list[TransferSegment] = []
    quiet = _quiet_groups(groups, source_shards, target_shards) if len(segments) >= limits.QUIET_SEGMENTS else {}
    ends: dict[tuple[tuple[int, ...], tuple[int, ...]], int | None] = {}  # for ``_decodes``
    for key, members in sorted(groups.items()):  # keys are distinct: ordered by key alone
        s_rank, t_rank, s_str, t_str, ndim = key
        s_shard = source_shards[s_rank]
        t_shard = target_shards[t_rank]
        if len(members) == 1:
            # A lone segment has no partner: each pass looks it up once per axis if both its
            # offsets decode, finds at most itself, and the first pass changes nothing. So it is
            # kept as it is, after the checks the loop below would count.
            seg = members[0]
            if budget.max_merge_passes > 0 and _decodes(seg.source_offset, s_str, s_shard, ends) and (
                _decodes(seg.target_offset, t_str, t_shard, ends)
            ):
                checks += ndim
                if checks > budget.max_merge_checks:
                    raise _merge_budget_error(parameter, budget)
            out.append(seg)
            continue
        lookups = quiet.get(key)
        if lookups is not None:  # no lookup below would find a partner: one check each, no merge
            checks += lookups * ndim
            if checks > budget.max_merge_checks:
                raise _merge_budget_error(parameter, budget)
            out.extend(members)  # unchanged; the final sort puts them in place
            continue
        ordered = sorted(members, key=_SORT_KEY)
        # Mutable working form: [s_off, t_off, extent list, s_coord, t_coord].
        work: list[list[Any]] = []
        for seg in ordered:
            work.append([
                seg.source_offset,
                seg.target_offset,
                list(seg.shape),
                _decode(seg.source_offset, s_str, s_shard),
                _decode(seg.target_offset, t_str, t_shard),
            ])
        alive = [True] * len(work)
        grown_any = [False] * len(work)
        for _ in range(budget.max_merge_passes):
            changed = False
            for axis in range(ndim):
                index: dict[tuple[Any, ...], int] = {}
                for i, (s_off, t_off, ext, _sc, _tc) in enumerate(work):
                    if alive[i]:
                        index[_fold_key(s_off, t_off, ext, axis)] = i
                s_step = s_str[axis]
                t_step = t_str[axis]
                for i in range(len(work)):
                    if not alive[i]:
                        continue
                    s_off, t_off, ext, s_coord, t_coord = work[i]
                    if s_coord is None or t_coord is None:
                        continue
                    while True:
                        checks += 1
                        if checks > budget.max_merge_checks:
                            raise _merge_budget_error(parameter, budget)
                        nxt = _fold_key(s_off + ext[axis] * s_step, t_off + ext[axis] * t_step, ext, axis)
                        j = index.get(nxt)
                        if j is None or j == i or not alive[j]:
                            break
                        grown = ext[axis] + work[j][2][axis]
                        if s_coord[axis] + grown > s_shard[axis] or t_coord[axis] + grown > t_shard[axis]:
                            break
                        ext[axis] = grown
                        alive[j] = False
                        grown_any[i] = True
                        changed = True
            if not changed:
                break
        for i, (s_off, t_off, ext, _sc, _tc) in enumerate(work):
            if alive[i]:
                # A segment that never grew is the input segment itself: keep the object.
                out.append(ordered[i] if not grown_any[i] else
                           make_segment(s_rank, s_off, s_str, t_rank, t_off, t_str, tuple(ext)))
    out.sort(key=_SORT_KEY)
    return out, checks


_SORT_KEY = attrgetter(
    "target_rank", "target_offset", "source_rank", "source_offset", "shape", "source_strides", "target_strides"
)
"""``TransferSegment.sort_key`` as a C-level getter (same tuple, same order)."""

def _merge_budget_error(parameter: str, budget: PlanBudget) -> AffineTransferError:
    return AffineTransferError(
        f"parameter {parameter!r}: coalescing needs more than max_merge_checks="
        f"{budget.max_merge_checks} comparisons; the plan is refused, not truncated"
    )


def _decodable(
    offsets: np.ndarray[Any, Any], strides: np.ndarray[Any, Any], shape: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """``_decode(offset, strides, shape) is not None`` for every row, vectorised (same arithmetic:
    floor division on positive strides, coordinate 0 on the others, nothing left over)."""
    rest = offsets.copy()
    ok = np.ones(offsets.shape[0], dtype=bool)
    for axis in range(strides.shape[1]):
        stride = strides[:, axis]
        positive = stride > 0
        q = np.where(positive, rest // np.where(positive, stride, 1), 0)
        rest = rest - q * np.where(positive, stride, 0)
        ok &= q < shape[:, axis]
    result: np.ndarray[Any, Any] = ok & (rest == 0)
    return result


def _rows(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a = np.ascontiguousarray(a)
    rows: np.ndarray[Any, Any] = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()
    return rows


def _quiet_groups(
    groups: Mapping[tuple[Any, ...], Sequence[TransferSegment]],
    source_shards: Mapping[int, tuple[int, ...]],
    target_shards: Mapping[int, tuple[int, ...]],
) -> dict[tuple[Any, ...], int]:
    """Groups of ``coalesce`` in which no segment can find a merge partner on any axis, each with
    the number of its segments whose offsets decode on both sides (those ``coalesce`` looks up,
    once per axis and pass, and with no merge there is one pass).

    "Partner" is exactly ``coalesce``'s lookup: a segment of the same group whose fold key (start
    offsets, extents off the axis) equals this one's end key. All groups are screened at once as
    int64 rows tagged with their group. A value too large for int64 leaves every group out; an
    end key that wrapped around can only add a spurious match, which leaves that group out too:
    left-out groups take the exact loop.
    """
    keys = [k for k, members in groups.items() if members]
    if not keys or len({k[4] for k in keys}) != 1 or keys[0][4] == 0:
        return {}
    ndim = keys[0][4]
    sizes = [len(groups[k]) for k in keys]
    n = sum(sizes)
    try:
        gid = np.repeat(np.arange(len(keys), dtype=np.int64), sizes)
        segs = [seg for k in keys for seg in groups[k]]
        s_off = np.fromiter((x.source_offset for x in segs), dtype=np.int64, count=n)
        t_off = np.fromiter((x.target_offset for x in segs), dtype=np.int64, count=n)
        ext = np.array([x.shape for x in segs], dtype=np.int64).reshape(n, ndim)
        s_str = np.repeat(np.array([k[2] for k in keys], dtype=np.int64).reshape(len(keys), ndim), sizes, axis=0)
        t_str = np.repeat(np.array([k[3] for k in keys], dtype=np.int64).reshape(len(keys), ndim), sizes, axis=0)
        s_shape = np.repeat(
            np.array([source_shards[k[0]] for k in keys], dtype=np.int64).reshape(len(keys), ndim), sizes, axis=0
        )
        t_shape = np.repeat(
            np.array([target_shards[k[1]] for k in keys], dtype=np.int64).reshape(len(keys), ndim), sizes, axis=0
        )
    except (OverflowError, ValueError, TypeError):
        return {}
    valid = _decodable(s_off, s_str, s_shape) & _decodable(t_off, t_str, t_shape)
    loud = np.zeros(len(keys), dtype=bool)
    with np.errstate(over="ignore"):
        for axis in range(ndim):
            rest = np.delete(ext, axis, axis=1)
            start = np.column_stack((gid, s_off, t_off, rest))
            end = np.column_stack(
                (gid, s_off + ext[:, axis] * s_str[:, axis], t_off + ext[:, axis] * t_str[:, axis], rest)
            )[valid]
            hit = np.isin(_rows(end), _rows(start))
            loud[gid[valid][hit]] = True
    counts = np.bincount(gid[valid], minlength=len(keys))
    return {k: int(counts[g]) for g, k in enumerate(keys) if not loud[g]}
