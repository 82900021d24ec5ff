"""What the load reports say and what they take (an outside audit of ``refplan.analysis`` and the
conformance runner's own load count).

- ``LoadReport.imbalance()`` without a count divided by the senders that *did* send, so a plan
  sending everything from one of four replicas reported perfect balance (1.0).
- The conformance runner read ``element_size`` as a mapping only: the single ``int`` the maps
  format and ``plan_transfers`` take ended in ``AttributeError``.
- ``sender_load`` / ``estimate_sync_time`` / ``max_load_for`` given the wrong kind of argument
  (a maps file's endpoints dict, a cost that is not a ``CostModel``, a float capacity) ended in a
  bare ``AttributeError`` where ``plan_transfers`` raises a ``TypeError`` saying what it expects.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from refplan.analysis import (
    CostModel,
    LoadReport,
    estimate_sync_time,
    load_lower_bound,
    max_load_for,
    sender_load,
    sync_time_lower_bound,
)
from refplan.conformance.corpus import parse_case
from refplan.conformance.runner import load_ratio, sender_loads
from refplan.maps import AffinePiece, ParamAffineMap
from refplan.planner import collect_requests, plan_transfers
from refplan.policies import first_holder
from refplan.requests import TransferEndpoints

ONE = ParamAffineMap((4,), {0: (4,)}, {0: [AffinePiece((4,), 0, (1,), 0, (1,), [0])]})
FOUR_REPLICAS = ParamAffineMap(
    (8,), {loc: (8,) for loc in range(4)},
    {loc: [AffinePiece((8,), 0, (1,), 0, (1,), [0, 1, 2, 3])] for loc in range(4)},
)
WHOLE = ParamAffineMap((8,), {0: (8,)}, {0: [AffinePiece((8,), 0, (1,), 0, (1,), [0])]})


# ---------------------------------------------------------------------------------------------
# imbalance(): the default count is the processes that could send, or it refuses.


def test_imbalance_without_a_count_refuses_when_the_candidates_are_unknown() -> None:
    """Without endpoints or ``senders`` the plans name only the locations that did send: dividing
    by those reported 1.0 for a plan with one busy sender out of four replicas (the LP ratio is
    4.0). Refused rather than printed wrong; an explicit count still works."""
    pairs = {"w": (WHOLE, FOUR_REPLICAS)}
    plans = plan_transfers(pairs, replica_policy=first_holder)
    report = sender_load(plans)
    assert report.sent == {0: 8}
    with pytest.raises(ValueError, match="senders"):
        report.imbalance()
    assert report.imbalance(4) == 4.0
    assert load_lower_bound(collect_requests(pairs)).ratio(max(report.sent.values())) == 4.0


def test_imbalance_default_counts_every_process_the_endpoints_name_as_a_source() -> None:
    pairs = {"w": (WHOLE, FOUR_REPLICAS)}
    ends = TransferEndpoints({loc: loc for loc in range(4)}, {0: 9})
    plans = plan_transfers(pairs, endpoints=ends, replica_policy=first_holder)
    report = sender_load(plans, endpoints=ends)
    assert report.sent == {0: 8}
    assert report.senders == (0, 1, 2, 3)
    assert report.imbalance() == 4.0


def test_imbalance_default_counts_the_senders_given_even_without_endpoints() -> None:
    plans = plan_transfers({"w": (WHOLE, FOUR_REPLICAS)}, replica_policy=first_holder)
    report = sender_load(plans, senders=[0, 1, 2, 3])
    assert report.imbalance() == 4.0
    assert report.imbalance(2) == 2.0  # an explicit count still wins


def test_imbalance_of_a_report_with_nothing_sent_is_one() -> None:
    assert LoadReport({}, {}, False).imbalance() == 1.0
    assert sender_load({}).imbalance() == 1.0


# ---------------------------------------------------------------------------------------------
# The conformance runner's load count takes one int element_size.


def _int_size_case() -> Any:
    raw = {"id": "probe/x", "why": "probe", "parameters": {"w": {"target": ONE.to_dict(), "source": ONE.to_dict()}},
           "element_size": 2, "expect": {"outcome": "accept", "max_sender_load": 8}}
    return parse_case(raw, "probe", "probe.json")


def test_runner_sender_loads_takes_one_int_element_size() -> None:
    """``sizes.get(name)`` on the int 2: ``AttributeError: 'int' object has no attribute 'get'``."""
    case = _int_size_case()
    plans = {"w": plan_transfers({"w": (ONE, ONE)}, element_size=2)["w"].to_dict()}
    assert sender_loads(case, plans) == {0: 8}


def test_runner_load_ratio_takes_one_int_element_size() -> None:
    case = _int_size_case()
    plans = {"w": plan_transfers({"w": (ONE, ONE)}, element_size=2)["w"].to_dict()}
    assert load_ratio(case, plans) == 1.0


def test_runner_sender_loads_still_reads_a_size_per_parameter() -> None:
    raw = {"id": "probe/y", "why": "probe", "parameters": {"w": {"target": ONE.to_dict(), "source": ONE.to_dict()}},
           "element_size": {"w": 4}, "expect": {"outcome": "accept"}}
    case = parse_case(raw, "probe", "probe.json")
    plans = {"w": plan_transfers({"w": (ONE, ONE)}, element_size=4)["w"].to_dict()}
    assert sender_loads(case, plans) == {0: 16}


# ---------------------------------------------------------------------------------------------
# The reports' arguments are checked as plan_transfers checks them.

_FILE_ENDPOINTS = {"source": {0: 0}, "target": {0: 1}}  # the maps file's shape of endpoints


@pytest.mark.parametrize("report", [sender_load, estimate_sync_time])
def test_reports_refuse_a_dict_of_endpoints_as_plan_transfers_does(report: Any) -> None:
    plans = plan_transfers({"w": (ONE, ONE)})
    with pytest.raises(TypeError, match="endpoints must be a TransferEndpoints") as planner:
        plan_transfers({"w": (ONE, ONE)}, endpoints=_FILE_ENDPOINTS)  # type: ignore[arg-type]
    with pytest.raises(TypeError) as info:
        report(plans, endpoints=_FILE_ENDPOINTS)
    assert str(info.value) == str(planner.value)


@pytest.mark.parametrize("cost", ["x", 1.0, {"network": 1}])
def test_sync_estimates_refuse_a_cost_that_is_not_a_cost_model(cost: Any) -> None:
    plans = plan_transfers({"w": (ONE, ONE)})
    with pytest.raises(TypeError, match="cost must be a CostModel"):
        estimate_sync_time(plans, cost=cost)
    bound = load_lower_bound(collect_requests({"w": (ONE, ONE)}))
    with pytest.raises(TypeError, match="cost must be a CostModel"):
        sync_time_lower_bound(bound, cost)


def test_sync_estimates_still_take_a_cost_model_or_none() -> None:
    plans = plan_transfers({"w": (ONE, ONE)})
    assert estimate_sync_time(plans, cost=CostModel()) == estimate_sync_time(plans)


@pytest.mark.parametrize("capacity", [2.0, "2", True])
def test_max_load_for_refuses_a_capacity_that_is_not_exact(capacity: Any) -> None:
    """A float capacity ended in ``AttributeError: 'float' object has no attribute 'denominator'``."""
    with pytest.raises(TypeError, match="capacity must be"):
        max_load_for({(0, 1): 4}, capacity)


def test_max_load_for_takes_an_int_or_a_fraction() -> None:
    assert max_load_for({(0, 1): 4}, 2) == (True, ())
    assert max_load_for({(0, 1): 4}, Fraction(3, 2)) == (False, (0, 1))


def test_an_estimate_holds_process_node_to_the_planner_s_rules() -> None:
    """``estimate_sync_time`` ignored a ``process_node`` given without endpoints and counted a
    process missing from it as a network hop; the planner refuses both, in these words."""
    from refplan import TransferEndpoints, contiguous_split_map
    from refplan.analysis import estimate_sync_time
    from refplan.errors import InvalidMapError
    from refplan.planner import plan_transfers

    rows, cols = contiguous_split_map((8, 8), [4, 4], 0), contiguous_split_map((8, 8), [4, 4], 1)
    ends = TransferEndpoints({0: 0, 1: 1}, {0: 2, 1: 3})
    plans = plan_transfers({"w": (cols, rows)}, endpoints=ends)
    nodes = {0: 0, 1: 0, 2: 1, 3: 1}
    assert estimate_sync_time(plans, endpoints=ends, process_node=nodes).seconds > 0
    for kwargs, words in (({"process_node": nodes}, "process_node needs endpoints"),
                          ({"endpoints": ends, "process_node": {0: 0, 1: 0, 2: 1}},
                           "parameter 'w': process_node names no node for process 3")):
        with pytest.raises(InvalidMapError, match=words):
            estimate_sync_time(plans, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(InvalidMapError, match=words):
            plan_transfers({"w": (cols, rows)}, **kwargs)  # type: ignore[arg-type]
