"""The executor's pre-verdict checks against an independent model, on hostile plans and buffers.

One process (no group: every endpoint is process 0), so every segment is a local copy; the
checks it runs are the ones every process runs before the verdict (issue 26, items 3 and 6).
Hypothesis draws plans of arbitrary segments (offsets, strides and extents small, at the edges
of the buffers, or huge up to 2**62, extent-1 axes with any stride, zero strides), buffers of
every element width the executor carries (1 to 16 bytes) and buffers that are views of one
allocation, some overlapping. For each call exactly one of these holds:

- ``TransferRejectedError``, and then no byte of any buffer changed (nothing moved);
- a normal return, and then every segment was inside its buffers (checked here by arithmetic,
  independently of the executor's own), no target overlaps a source or another target in
  memory, the sources are unchanged, and every target element holds what the plan says: the
  source element its one writer names, or, where segments write one element twice (the executor
  checks numbers, not coverage, without ``maps``), the value of one of its writers; elements no
  segment writes are unchanged.

Any other outcome (``TransferExecutionError``: a failure after the verdict, which is what a
number that slipped past the checks used to cause; any other exception) fails the test.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from refplan import TransferEndpoints, TransferSegment
from refplan.errors import InvalidMapError
from refplan.execute import StagingBudget, TransferRejectedError, execute_transfer
from refplan.plan import TransferPlan

pytestmark = pytest.mark.timeout(300)

DTYPES = [torch.int8, torch.int16, torch.float16, torch.bfloat16, torch.int32, torch.float32, torch.int64,
          torch.float64, torch.complex64, torch.complex128]
"""One per width the executor carries (1, 2, 4, 8 and 16 bytes), floats and ints alike."""

BIG = [2**31, 2**32 - 1, 2**40, 2**59, 2**60, 2**61, 2**62]


def _hostile(small: int) -> st.SearchStrategy[int]:
    """Small, huge (up to the 2**62 cap) or, less often, negative."""
    return st.one_of(st.integers(0, small), st.integers(0, small), st.sampled_from(BIG), st.sampled_from(BIG),
                     st.integers(-3, -1))


@st.composite
def _segment(draw: st.DrawFn, source_lengths: list[int], target_lengths: list[int], mood: int) -> TransferSegment:
    """A plausible box (row-major strides with gaps, placed inside its buffer when it fits), then
    by ``mood``: 0 kept as it is, 1 one number replaced by a hostile one, 2 hostile throughout."""
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(ndim)]
    ranks = [draw(st.integers(0, len(source_lengths) - 1)), draw(st.integers(0, len(target_lengths) - 1))]
    sides = []
    for length in (source_lengths[ranks[0]], target_lengths[ranks[1]]):
        strides = [draw(st.integers(1, 2))]
        for extent in reversed(shape[1:]):
            strides.append(strides[-1] * extent + draw(st.integers(0, 2)))
        strides.reverse()
        reach = sum((e - 1) * st_ for e, st_ in zip(shape, strides))
        # Anywhere it fits, at the last place it fits, or one element past it (an off-by-one).
        offset = draw(st.one_of(st.integers(0, max(0, length - reach - 1)),
                                st.sampled_from([max(0, length - reach - 1), max(0, length - reach)])))
        sides.append([offset, strides])
    length = max(source_lengths + target_lengths)
    if mood == 2:
        shape = [draw(st.one_of(st.integers(1, 4), st.sampled_from([0, *BIG]))) for _ in range(ndim)]
        sides = [[draw(_hostile(length + 2)), [draw(_hostile(12)) for _ in range(ndim)]] for _ in range(2)]
    elif mood == 1:
        which = draw(st.integers(0, 3 * ndim + 1))
        if which < ndim:
            shape[which] = draw(st.sampled_from([0, 5, 8, *BIG]))
        elif which < 3 * ndim:
            side, axis = divmod(which - ndim, ndim)
            sides[side][1][axis] = draw(_hostile(12))
        else:
            sides[which - 3 * ndim][0] = draw(_hostile(length + 2))
    try:
        return TransferSegment(ranks[0], sides[0][0], tuple(sides[0][1]), ranks[1], sides[1][0],
                               tuple(sides[1][1]), tuple(shape))
    except InvalidMapError:  # the constructor refuses numbers past 2**62: not an executor input
        assume(False)
        raise


@st.composite
def _case(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(DTYPES))
    sources, targets = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    lengths = [draw(st.one_of(st.integers(0, 24), st.integers(24, 64))) for _ in range(sources + targets)]
    # Buffers are views of one allocation, at offsets drawn apart (guard regions) or together
    # (overlapping): what a packed flat buffer gives a caller.
    starts, at = [], 0
    for n in lengths:  # mostly apart (with a guard gap), sometimes back over an earlier buffer
        at = max(0, at + draw(st.sampled_from([0, 1, 3, 3, 3, 3, -1, -4, -40])))
        starts.append(at)
        at += n
    # Half the calls all plausible (most of them accepted), half with hostile numbers mixed in.
    moods = st.just(0) if draw(st.booleans()) else st.sampled_from([0, 0, 1, 1, 2])
    count = draw(st.integers(1, 4))
    segments = [draw(_segment(lengths[:sources], lengths[sources:], draw(moods))) for _ in range(count)]
    budget = draw(st.sampled_from([StagingBudget(), StagingBudget(bytes_per_peer=64), StagingBudget(max_work=50)]))
    return {"dtype": dtype, "sources": sources, "lengths": lengths, "starts": starts, "segments": segments,
            "budget": budget}


def _elements(offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    return [offset + sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, shape))]


def _inside(offset: int, shape: tuple[int, ...], strides: tuple[int, ...], length: int) -> bool:
    """Every address of the box in ``[0, length)``: arithmetic, as a caller would check it."""
    low = offset + sum((e - 1) * s for e, s in zip(shape, strides) if s < 0)
    high = offset + sum((e - 1) * s for e, s in zip(shape, strides) if s > 0)
    return low >= 0 and high < length


@settings(max_examples=max(300, settings.default.max_examples), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_case())
def test_a_call_either_refuses_and_moves_nothing_or_copies_exactly_what_the_plan_says(case: dict[str, Any]) -> None:
    dtype, lengths, starts = case["dtype"], case["lengths"], case["starts"]
    n_sources = case["sources"]
    memory = (torch.arange(1, 1 + max(s + n for s, n in zip(starts, lengths)) + 1) % 100).to(dtype)
    views = [memory[s:s + n] for s, n in zip(starts, lengths)]
    sources = dict(enumerate(views[:n_sources]))
    targets = dict(enumerate(views[n_sources:]))
    segments: list[TransferSegment] = case["segments"]
    plan = TransferPlan(tuple(segments), (sum(s.numel for s in segments),), sum(s.numel for s in segments))
    ends = TransferEndpoints(dict.fromkeys(sources, 0), dict.fromkeys(targets, 0))
    before = memory.clone()
    try:
        execute_transfer(plan, sources, targets, ends, dtype=dtype, budget=case["budget"])
    except TransferRejectedError as exc:
        event(f"refused: {str(exc).split(': ')[-1][:40]}")
        assert torch.equal(memory, before), "refused, but bytes moved"
        return
    event(f"accepted, {len(segments)} segment(s)")
    # Accepted: everything the checks promise, checked here independently.
    for seg in segments:
        assert _inside(seg.source_offset, seg.shape, seg.source_strides, sources[seg.source_rank].numel()), seg
        assert _inside(seg.target_offset, seg.shape, seg.target_strides, targets[seg.target_rank].numel()), seg
    spans = {("t", loc): (starts[n_sources + loc], starts[n_sources + loc] + lengths[n_sources + loc])
             for loc in targets if lengths[n_sources + loc]}
    for (a, (a_lo, a_hi)), (b, (b_lo, b_hi)) in itertools.combinations(spans.items(), 2):
        assert a_hi <= b_lo or b_hi <= a_lo, f"accepted overlapping targets {a} and {b}"
    for loc in sources:
        lo, hi = starts[loc], starts[loc] + lengths[loc]
        for key, (t_lo, t_hi) in spans.items():
            assert hi <= t_lo or t_hi <= lo or lo == hi, f"accepted source {loc} overlapping target {key}"
    expected = before.clone()
    writers: dict[int, list[Any]] = {}
    for seg in segments:
        s_base, t_base = starts[seg.source_rank], starts[n_sources + seg.target_rank]
        reads = _elements(seg.source_offset, seg.shape, seg.source_strides)
        writes = _elements(seg.target_offset, seg.shape, seg.target_strides)
        for r, w in zip(reads, writes):
            writers.setdefault(t_base + w, []).append(before[s_base + r])
    for address, values in writers.items():
        got = memory[address]
        assert any(torch.equal(got, v) for v in values), (address, got, values)
        expected[address] = got
    assert torch.equal(memory, expected), "an element no segment writes changed, or a source changed"
