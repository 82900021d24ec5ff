"""The planner's holder check (``frames.check_holders``, R19-R21) sums each box's overlaps per
location in numpy (``box.overlap_volumes``), not one ``Box.intersect`` per overlapping pair.

Target replicas cut at different boundaries (n row pieces on one location, n column pieces on
another) are n² overlapping pairs of a map the rules accept; intersected in Python they made a
40 s plan at n = 2 000 (8.8 s after). The exact Python-int path kept for boxes of 2**62 elements
or more must agree with the numpy path on every map, valid or not.
"""

from __future__ import annotations

import pytest
from conftest import count_intersections, maybe_redeclared, rows_and_columns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refplan.box as box_module
from refplan import contiguous_split_map, replicated_map
from refplan.errors import AffineTransferError
from refplan.planner import plan_transfer
from refplan.strategies import replicated_maps


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_holder_sums_in_numpy_agree_with_the_exact_sums(data: st.DataObject) -> None:
    """Valid target maps with replicas cut differently, and the same maps with one piece's declared
    locations changed: the plan (or the refusal and its message) is the same on both paths."""
    target = data.draw(replicated_maps(max_parts=5, max_locations=4, replica_cuts=True))
    target = maybe_redeclared(data, target)
    source = replicated_map(target.logical_shape, 1)  # one location holds F: the target side is judged

    def outcome(exact: int) -> str:
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(box_module, "EXACT_VOLUMES", exact)
            try:
                return repr(plan_transfer(target, source).segments)
            except AffineTransferError as exc:
                return f"{type(exc).__name__}: {exc}"

    assert outcome(1 << 62) == outcome(0)


def test_target_replicas_cut_differently_are_planned_without_a_python_step_per_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 row pieces and 300 column pieces (90 000 overlapping pairs) plan, and the holder check
    intersects no pair in Python (the planner's other steps here intersect far fewer boxes)."""
    n = 300
    target = rows_and_columns(n)
    calls = count_intersections(monkeypatch)
    plan = plan_transfer(target, contiguous_split_map((n, n), (n,), 0))
    assert plan.moved_elements == 2 * n * n
    assert calls[0] < n * n // 10, calls[0]
