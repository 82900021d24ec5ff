"""Shared test configuration: hypothesis profiles, map helpers and a tiny numpy plan executor.

Hypothesis profiles (select with ``HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci``: 30 derandomized examples, no deadline, no example database (reproducible in CI);
- ``dev``: 100 examples;
- ``mutation``: ``ci`` with 10 examples (``make mutation`` runs the tests once per mutant);
- ``nightly``: 2000 examples.

The executor (``run_plan``) is deliberately independent of the planner: it fills source shards
from unique marker values of the logical tensor F through the *source map*, executes every
segment with plain integer index arithmetic into sentinel-filled target buffers that carry guard
regions before and after the shard, and counts writes per target address. ``assert_exact``
then checks what Theorem 1 and 2 promise: every target address written exactly once, with the
value the *target map* says it must hold, and no guard element touched.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from refplan.box import row_major_strides, volume
from refplan.cli.generate_corpus import piece, pmap, split  # noqa: F401  (re-exported: hand-built maps in the tests)
from refplan.maps import AffinePiece, ParamAffineMap
from refplan.plan import TransferSegment

# ---------------------------------------------------------------------------------------------
# Hypothesis profiles.

settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
# `make mutation` runs the selected tests once per mutant: fewer examples keep it within minutes.
settings.register_profile("mutation", parent=settings.get_profile("ci"), max_examples=10)
settings.register_profile("nightly", max_examples=2000, deadline=None)
if importlib.util.find_spec("hypothesis_crosshair_provider") is not None:
    # Solver-backed examples (hypothesis-crosshair): 10-100x slower, so `make nightly` runs only
    # the core properties (tests/test_properties.py -k core) under it.
    settings.register_profile("crosshair", backend="crosshair", max_examples=200, deadline=None,
                              database=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------------------------------------
# Segments a caller's own subclass makes: a field may answer each read differently.


def segment_as(cls: type[TransferSegment], segment: TransferSegment) -> TransferSegment:
    """An instance of ``cls`` (a subclass that shadows fields with properties) holding
    ``segment``'s fields, made past the frozen dataclass's constructor as a caller could."""
    made = object.__new__(cls)
    object.__setattr__(made, "__dict__", {f.name: getattr(segment, f.name) for f in dataclasses.fields(segment)})
    return made


class AnsweringSegment(TransferSegment):
    """A segment whose ``target_offset`` is a property: ``answers``, one per read (the last one
    repeated), counted in ``reads``."""

    reads = 0
    answers: tuple[object, ...] = ()

    @property
    def target_offset(self) -> object:  # type: ignore[override]  # a field shadowed by a property, as a caller could
        answer = type(self).answers[min(type(self).reads, len(type(self).answers) - 1)]
        type(self).reads += 1
        return answer


def answering(segment: TransferSegment, *answers: object) -> TransferSegment:
    """``segment`` as an ``AnsweringSegment`` that gives ``answers``, its read count reset."""
    AnsweringSegment.reads, AnsweringSegment.answers = 0, answers
    return segment_as(AnsweringSegment, segment)


# ---------------------------------------------------------------------------------------------
# Property tests that count what they checked.


class Reached:
    """Counts the examples of a property test that reached each of its assertions.

    A property whose assertion sits behind an ``if`` (or after an early ``return``) can pass
    without ever checking anything. Such tests call ``hit(label)`` where the assertion runs, and
    the enclosing plain test asserts afterwards, with ``at_least``, that the label was reached.
    Each hit is also a hypothesis ``event``, so ``--hypothesis-show-statistics`` shows the counts.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def hit(self, label: str) -> None:
        from hypothesis import event

        self.counts[label] = self.counts.get(label, 0) + 1
        event(label)

    def at_least(self, label: str, count: int) -> None:
        got = self.counts.get(label, 0)
        print(f"reached {label!r}: {got}")  # shown with -s, and with the failure otherwise
        assert got >= count, f"only {got} example(s) reached {label!r} (want >= {count}); all: {self.counts}"


def examples() -> int:
    """``max_examples`` of the active hypothesis profile (what a ``Reached`` bound scales with)."""
    return int(settings().max_examples)


# ---------------------------------------------------------------------------------------------
# Map helpers.


def relabel(param_map: ParamAffineMap, names: Mapping[int, int]) -> ParamAffineMap:
    """The same layout with every location ``r`` renamed ``names[r]`` (keys and ``locations``)."""
    return ParamAffineMap(
        param_map.logical_shape,
        {names[r]: s for r, s in param_map.shard_shapes.items()},
        {
            names[r]: [
                AffinePiece(
                    p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides,
                    [names[x] for x in p.locations], p.scale,
                )
                for p in ps
            ]
            for r, ps in param_map.pieces_by_rank.items()
        },
    )


def shuffled_map(param_map: ParamAffineMap, rng: Any) -> ParamAffineMap:
    """The same map with the key order of both dicts and every piece list permuted by ``rng``."""
    shard_keys = list(param_map.shard_shapes)
    rng.shuffle(shard_keys)
    piece_keys = list(param_map.pieces_by_rank)
    rng.shuffle(piece_keys)
    pieces: dict[int, list[AffinePiece]] = {}
    for r in piece_keys:
        ps = list(param_map.pieces_by_rank[r])
        rng.shuffle(ps)
        pieces[r] = ps
    return ParamAffineMap(
        param_map.logical_shape, {r: param_map.shard_shapes[r] for r in shard_keys}, pieces
    )


# ---------------------------------------------------------------------------------------------
# The numpy executor.

SENTINEL = -7.0
"""Value of every unwritten target element and every guard element (markers are all >= 1)."""


def maybe_redeclared(data: Any, param_map: ParamAffineMap) -> ParamAffineMap:
    """``param_map``, or (drawn) the same map with one piece's declared ``locations`` changed (one
    dropped, or a location that holds nothing added): valid maps and maps the holder rules refuse."""
    from hypothesis import strategies as st

    loc = data.draw(st.sampled_from(sorted(param_map.pieces_by_rank)))
    pieces = list(param_map.pieces_by_rank[loc])
    if not pieces or not data.draw(st.booleans()):
        return param_map
    index = data.draw(st.integers(0, len(pieces) - 1))
    declared = sorted(pieces[index].locations)
    changed = declared[:-1] if len(declared) > 1 else [*declared, max(param_map.ranks) + 1]
    pieces[index] = pieces[index]._replace(locations=changed)
    return ParamAffineMap(param_map.logical_shape, param_map.shard_shapes, {**param_map.pieces_by_rank, loc: pieces})


def rows_and_columns(n: int) -> ParamAffineMap:
    """A target map of an (n, n) F held twice, cut differently: n row pieces on location 0 and n
    column pieces on location 1 (n² overlapping pairs of a map the rules accept)."""
    rows = [AffinePiece((1, n), n * r, (n, 1), n * r, (n, 1), [0, 1]) for r in range(n)]
    cols = [AffinePiece((n, 1), c, (n, 1), c, (n, 1), [0, 1]) for c in range(n)]
    return ParamAffineMap((n, n), {0: (n, n), 1: (n, n)}, {0: rows, 1: cols})


def count_intersections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, ``Box.intersect`` calls are counted in the returned one-item list."""
    from refplan.box import Box

    calls = [0]
    real = Box.intersect

    def counting(self: Box, other: Box) -> Box | None:
        calls[0] += 1
        return real(self, other)

    monkeypatch.setattr(Box, "intersect", counting)
    return calls


def markers(logical_shape: Sequence[int]) -> np.ndarray[Any, Any]:
    """F filled with 1, 2, 3, ...: unique, so a correct value proves the correct element moved."""
    n = volume(logical_shape)
    return np.arange(1, n + 1, dtype=np.float64).reshape(tuple(logical_shape))


def element_offsets(offset: int, strides: Sequence[int], shape: Sequence[int]) -> np.ndarray[Any, Any]:
    """Flat element offsets of an ``as_strided(shape, strides, offset)`` view, row-major order."""
    idx = np.full(tuple(shape), offset, dtype=np.int64)
    ndim = len(shape)
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        view = [1] * ndim
        view[axis] = size
        idx = idx + (np.arange(size, dtype=np.int64) * stride).reshape(view)
    return idx.reshape(-1)


def fill_shards(
    param_map: ParamAffineMap, full: np.ndarray[Any, Any], before: int = 0, after: int = 0
) -> dict[int, np.ndarray[Any, Any]]:
    """``param_map.extract(full)`` for every location with a shard shape, inside guard padding.

    Buffer ``r`` has ``before`` sentinels, then the shard, then ``after`` sentinels. Empty pieces
    are skipped (as the planner skips them); replicas get identical data because all read ``full``.
    """
    flat = full.reshape(-1)
    out: dict[int, np.ndarray[Any, Any]] = {}
    for rank, shard in param_map.shard_shapes.items():
        n = volume(shard)
        buf = np.full(before + n + after, SENTINEL, dtype=np.float64)
        for p in param_map.pieces_by_rank.get(rank, ()):
            if volume(p.shape) == 0:
                continue
            src = element_offsets(p.source_offset, p.source_strides, p.shape)
            dst = element_offsets(p.dest_offset, p.dest_strides, p.shape)
            buf[before + dst] = flat[src]
        out[rank] = buf
    return out


@dataclass
class Execution:
    """What ``run_plan`` observed; ``assert_exact`` turns it into the exactness verdict."""

    target_buffers: dict[int, np.ndarray[Any, Any]]
    expected: dict[int, np.ndarray[Any, Any]]
    writes: dict[int, np.ndarray[Any, Any]]
    reads: dict[int, int]
    guard: tuple[int, int]
    notes: list[str] = field(default_factory=list)

    def assert_exact(self) -> None:
        before, after = self.guard
        for rank, buf in self.target_buffers.items():
            n = buf.size - before - after
            counts = self.writes[rank]
            bad = np.flatnonzero(counts != 1)
            assert bad.size == 0, (
                f"target location {rank}: address {int(bad[0])} written {int(counts[bad[0]])} times "
                f"({bad.size} addresses not written exactly once)"
            )
            body = buf[before:before + n]
            want = self.expected[rank]
            wrong = np.flatnonzero(body != want)
            assert wrong.size == 0, (
                f"target location {rank}: address {int(wrong[0])} holds {body[wrong[0]]}, "
                f"expected {want[wrong[0]]} ({wrong.size} wrong)"
            )
            assert np.all(buf[:before] == SENTINEL), f"target location {rank}: leading guard overwritten"
            assert np.all(buf[before + n:] == SENTINEL), f"target location {rank}: trailing guard overwritten"


def run_plan(
    plan: Any,
    target_map: ParamAffineMap,
    source_map: ParamAffineMap,
    *,
    data: np.ndarray[Any, Any] | None = None,
    source_guard: tuple[int, int] = (7, 5),
    target_guard: tuple[int, int] = (11, 13),
) -> Execution:
    """Execute ``plan`` on numpy buffers; returns write counts, read volumes and the buffers.

    Every segment must address its shards inside bounds (checked before copying, so a bad
    segment fails with a message rather than a numpy ``IndexError``), use the row-major strides
    of both shards, and have a positive extent on every axis.
    """
    full = markers(target_map.logical_shape) if data is None else data
    s_before, s_after = source_guard
    t_before, t_after = target_guard
    sources = fill_shards(source_map, full, s_before, s_after)
    expected = {r: b for r, b in fill_shards(target_map, full).items()}
    targets = {
        r: np.full(t_before + volume(s) + t_after, SENTINEL, dtype=np.float64)
        for r, s in target_map.shard_shapes.items()
    }
    writes = {r: np.zeros(volume(s), dtype=np.int64) for r, s in target_map.shard_shapes.items()}
    reads: dict[int, int] = {}
    for i, seg in enumerate(plan.segments):
        assert seg.source_rank in sources, f"segment {i}: unknown source location {seg.source_rank}"
        assert seg.target_rank in targets, f"segment {i}: unknown target location {seg.target_rank}"
        assert all(e > 0 for e in seg.shape), f"segment {i}: empty extent {seg.shape}"
        s_shard = source_map.shard_shapes[seg.source_rank]
        t_shard = target_map.shard_shapes[seg.target_rank]
        assert tuple(seg.source_strides) == row_major_strides(s_shard), (
            f"segment {i}: source strides {seg.source_strides} are not those of shard {s_shard}"
        )
        assert tuple(seg.target_strides) == row_major_strides(t_shard), (
            f"segment {i}: target strides {seg.target_strides} are not those of shard {t_shard}"
        )
        s_idx = element_offsets(seg.source_offset, seg.source_strides, seg.shape)
        t_idx = element_offsets(seg.target_offset, seg.target_strides, seg.shape)
        s_n, t_n = volume(s_shard), volume(t_shard)
        assert s_idx.min() >= 0 and s_idx.max() < s_n, f"segment {i} reads outside source shard {s_shard}"
        assert t_idx.min() >= 0 and t_idx.max() < t_n, f"segment {i} writes outside target shard {t_shard}"
        targets[seg.target_rank][t_before + t_idx] = sources[seg.source_rank][s_before + s_idx]
        np.add.at(writes[seg.target_rank], t_idx, 1)
        reads[seg.source_rank] = reads.get(seg.source_rank, 0) + seg.numel
    return Execution(targets, expected, writes, reads, (t_before, t_after))


def shard_box_origin(offset: int, shape: Sequence[int], shard: Sequence[int]) -> tuple[int, ...] | None:
    """Where a row-major segment starting at ``offset`` begins in ``shard``, if it is a box there.

    A segment with the shard's row-major strides is a box of the shard exactly when its first
    element decodes to a coordinate ``c`` of the shard and ``c + shape`` stays inside the shard on
    every axis. Otherwise the same addresses may still be distinct and in bounds (a run that wraps
    into the next row), which an execution cannot tell apart from a box, but the oracle needs its
    element-level fallback for it. Written here by plain division, independently of the library.
    """
    rest = offset
    coord: list[int] = []
    if volume(shard) == 0:
        return None  # an empty shard holds no element, so no segment is a box of it
    for stride in row_major_strides(shard):
        c, rest = divmod(rest, stride)
        coord.append(c)
    if rest != 0 or any(not 0 <= c < n for c, n in zip(coord, shard)):
        return None
    if any(c + e > n for c, e, n in zip(coord, shape, shard)):
        return None
    return tuple(coord)


def assert_segments_are_boxes(plan: Any, target_map: ParamAffineMap, source_map: ParamAffineMap) -> int:
    """Every segment of a refplan plan is a box in its source shard *and* in its target shard.

    Lemma M's guard (``plan.coalesce``) keeps merged segments boxes on both sides; a merge that
    checked only one side would still execute exactly but leave the oracle an element-level
    fallback (``unverifiable`` past its budget). Returns the number of segments checked, so a
    caller can assert the check saw something.
    """
    for i, seg in enumerate(plan.segments):
        for side, offset, strides, shard in (
            ("source", seg.source_offset, seg.source_strides, source_map.shard_shapes[seg.source_rank]),
            ("target", seg.target_offset, seg.target_strides, target_map.shard_shapes[seg.target_rank]),
        ):
            assert tuple(strides) == row_major_strides(shard), (
                f"segment {i}: {side} strides {strides} are not those of shard {shard}"
            )
            assert shard_box_origin(offset, seg.shape, shard) is not None, (
                f"segment {i} ({seg}) is not a box of its {side} shard {shard}"
            )
    return len(plan.segments)


def _simulator() -> Callable[..., Any] | None:
    try:
        from refplan.simulate import simulate_transfer
    except ImportError:
        return None
    return simulate_transfer  # type: ignore[no-any-return]


def assert_executes_exactly(
    plan: Any, target_map: ParamAffineMap, source_map: ParamAffineMap, **kwargs: Any
) -> Execution:
    """Run the plan, assert exactness, volume and that every segment is a box in both shards, and
    cross-check with ``refplan.simulate`` if any."""
    run = run_plan(plan, target_map, source_map, **kwargs)
    run.assert_exact()
    assert_segments_are_boxes(plan, target_map, source_map)
    target_volume = sum(volume(s) for s in target_map.shard_shapes.values())
    assert plan.moved_elements == sum(s.numel for s in plan.segments) == target_volume
    simulate = _simulator()
    if simulate is not None:
        report = simulate(target_map, source_map, plan)
        assert report.exact, f"refplan.simulate disagrees: first mismatch {report.first_mismatch}"
    return run


@pytest.fixture
def execute() -> Callable[..., Execution]:
    """Fixture form of ``assert_executes_exactly``."""
    return assert_executes_exactly


@pytest.fixture
def oracle_work(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the oracle's map validations (``validate_map``'s work, ``_validate_parts``) and plan judgements
    (``check_plan``) made while the test runs: how the per-batch reuse is observed."""
    import refplan.oracle.judge as judge
    import refplan.oracle.layout as layout

    calls = {"validate_map": 0, "check_plan": 0}
    validate, check = layout._validate_parts, judge.check_plan  # every validation, in parts or whole

    def counted(fn: Any, what: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls[what] += 1
            return fn(*args, **kwargs)
        return run

    def counted_validate(*args: Any, **kwargs: Any) -> Any:
        calls["validate_map"] += 1
        return validate(*args, **kwargs)

    def counted_check(*args: Any, **kwargs: Any) -> Any:
        calls["check_plan"] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(layout, "_validate_parts", counted_validate)
    monkeypatch.setattr(judge, "check_plan", counted_check)
    # ``verify_plans``' quick judgement of small plain plans reads maps and judges plans by these.
    monkeypatch.setattr(judge, "_read", counted(judge._read, "validate_map"))
    monkeypatch.setattr(judge, "_judge_rows", counted(judge._judge_rows, "check_plan"))
    return calls



def megatron_meta(**fields: Any) -> Any:
    """A Megatron-Core ``ParameterMetadata`` (its own class) of a (4, 2) float32 weight ``w``,
    ``fields`` replacing any of it (the interop tests' way to hand-build a rank's metadata);
    skips the test when megatron-core is not installed."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pytest.importorskip("megatron.core.resharding", reason="megatron-core is not installed")
    base: dict[str, Any] = dict(name="w", shape=(4, 2), dtype=torch.float32, element_size=4, owner_rank=-1)
    base.update(fields)
    meta = res.ParameterMetadata(**base)
    if meta.resolved_name is None:
        meta.resolved_name = meta.name
    return meta
