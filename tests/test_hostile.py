"""Hostile input: whatever a maps file holds, planning raises an ``AffineTransferError`` subclass
(never a bare ``TypeError``/``KeyError``/``IndexError`` from deep inside) or returns a plan the
simulator confirms exact."""

from __future__ import annotations

import json
from typing import Any

from conftest import Reached, examples
from hypothesis import given
from hypothesis import strategies as st

from refplan import AffineTransferError, ParamAffineMap, contiguous_split_map, replicate
from refplan.files import parse_maps
from refplan.planner import plan_transfers
from refplan.simulate import simulate_transfer

_BASE_SOURCE = replicate(contiguous_split_map((6, 4), [3, 3], 0), 2).to_dict()
_BASE_TARGET = contiguous_split_map((6, 4), [2, 2], 1).to_dict()

_junk = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-3, 12),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.lists(st.integers(-2, 10), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    doc[path[0]] = _replace(doc[path[0]], path[1:], value)
    return doc


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def test_mutated_maps_raise_only_refplan_errors() -> None:
    """Up to three values of a valid maps document replaced, by junk or by a copy of themselves.

    Every outcome is either a refplan error or a plan the simulator confirms exact. Both kinds of
    outcome are counted and must occur: with junk alone nearly every document is refused, and the
    exactness assertion would never run.
    """
    reached = Reached()

    @given(st.data())
    def mutated(data: st.DataObject) -> None:
        doc = {
            "format": "refplan.maps/1",
            "parameters": {"w": {"target": json.loads(json.dumps(_BASE_TARGET)),
                                 "source": json.loads(json.dumps(_BASE_SOURCE))}},
        }
        for _ in range(data.draw(st.integers(1, 3), label="mutations")):
            paths = _paths(doc)
            path = data.draw(st.sampled_from(paths[1:]), label="path")
            same = json.loads(json.dumps(_at(doc, path)))
            doc = _replace(doc, path, data.draw(st.just(same) | _junk, label="value"))
        try:
            batch = parse_maps(doc)
            plans = plan_transfers(batch.pairs, min_split_bytes=1)
        except AffineTransferError:
            reached.hit("refused")
            return
        for name, plan in plans.items():
            target, source = batch.pairs[name]
            assert isinstance(target, ParamAffineMap)
            report = simulate_transfer(target, source, plan)
            assert report.exact, report.first_mismatch
        reached.hit("planned and exact")

    mutated()
    reached.at_least("planned and exact", max(1, examples() // 20))
    reached.at_least("refused", max(1, examples() // 20))
