"""DeepSpeed 0.19.8's planner as a peer: its plans pass our oracle on the §4.6 layouts.

``make test`` installs the ``peer`` extra, so this runs in CI; without DeepSpeed it skips
visibly (``pytest -rs`` names the reason). Maps cross the boundary only as dicts, in DeepSpeed's
own ``to_dict`` layout, which is also how a user would feed a DeepSpeed plan to ``refplan verify``.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from refplan import ParamAffineMap
from refplan.maps import (
    LAYOUTS,
)
from refplan.planner import plan_transfer
from refplan.policies import first_holder
from refplan.simulate import simulate_transfer
from refplan.verify import verify_plan

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ds_transfer = pytest.importorskip(
        "deepspeed.checkpoint.affine_transfer", reason="deepspeed==0.19.8 (extra 'peer') is not installed"
    )
    ds_affine = pytest.importorskip("deepspeed.checkpoint.affine")


def _ds_plan(target: ParamAffineMap, source: ParamAffineMap) -> dict[str, Any]:
    ds_target = ds_affine.ParamAffineMap.from_dict(target.to_dict())
    ds_source = ds_affine.ParamAffineMap.from_dict(source.to_dict())
    plan = ds_transfer.plan_transfer(ds_target, ds_source)
    result: dict[str, Any] = plan.to_dict()
    return result


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(("s", "t"), [(1, 2), (2, 1), (2, 4), (4, 2), (4, 4), (1, 1)])
def test_deepspeed_plans_pass_the_oracle(layout: str, s: int, t: int) -> None:
    source = LAYOUTS[layout](s)
    target = LAYOUTS[layout](t)
    ds_dict = _ds_plan(target, source)
    verdict = verify_plan(target, source, ds_dict)
    assert verdict.status == "ok", str(verdict)
    ours = plan_transfer(target, source, replica_policy=first_holder)
    assert verify_plan(target, source, ours).status == "ok"
    # Same policy (lowest holder): the two planners move the same elements from the same sources.
    ds_moved: dict[int, int] = {}
    for seg in ds_dict["segments"]:
        volume = 1
        for e in seg["shape"]:
            volume *= e
        ds_moved[seg["source"][0]] = ds_moved.get(seg["source"][0], 0) + volume
    our_moved: dict[int, int] = {}
    for seg in ours.segments:
        our_moved[seg.source_rank] = our_moved.get(seg.source_rank, 0) + seg.numel
    assert ds_moved == our_moved
    assert simulate_transfer(target, source, ours).exact


def test_a_corrupted_deepspeed_plan_is_caught() -> None:
    source = LAYOUTS["bigcode"](2)
    target = LAYOUTS["bigcode"](4)
    ds_dict = _ds_plan(target, source)
    assert len(ds_dict["segments"]) == 7  # facts §4.6: v2 physical folding gives 7 segments
    ds_dict["segments"][0]["source"][1] += 8  # read the next row
    verdict = verify_plan(target, source, ds_dict)
    assert verdict.status == "invalid"
