"""The conformance judge after a maintainer-style review of the published findings (2026-12-06).

Two ways a peer could pass for the wrong reason: the adapter's own error while reading the peer's
answer was taken for the peer's deliberate refusal, and a contract that excuses a refusal excused
any refusal, a peer's bug included. Each test failed before its fix.
"""

from __future__ import annotations

from typing import Any

from refplan.conformance.base import Outcome
from refplan.conformance.corpus import load_cases
from refplan.conformance.peers.common import PeerAdapter
from refplan.conformance.runner import judge


class _Reads(PeerAdapter):
    name = "fake-peer"

    def __init__(self, fails_in: str) -> None:
        self.fails_in = fails_in

    def translate(self, case: Any) -> Any:
        return {}

    def call_peer(self, problem: Any) -> Any:
        if self.fails_in == "peer":
            raise ValueError("the peer refuses on purpose")
        return []

    def convert(self, problem: Any, output: Any) -> dict[str, Any]:
        raise ValueError("slices (2,) / (3,) disagree with the overlap")  # the adapter's own reading


def _case(kind: str) -> Any:
    return next(c for c in load_cases() if c.expect.outcome == kind)


def test_the_adapters_own_error_is_an_adapter_error_not_the_peers_refusal() -> None:
    must_refuse = _case("refuse")
    outcome = _Reads("adapter").plan(must_refuse)
    assert outcome.kind == "error" and "could not read fake-peer's answer" in outcome.message, outcome
    assert judge(must_refuse, outcome, _Reads("adapter"))[0] == "error"
    refused = _Reads("peer").plan(must_refuse)  # the peer's own refusal still passes
    assert refused.kind == "refuse" and judge(must_refuse, refused, _Reads("peer"))[0] == "pass"


def test_a_refusal_is_excused_only_when_it_is_the_contracts_refusal() -> None:
    valid = _case("accept")
    why = "the peer refuses TP sizes that do not divide each other, on purpose (file.py:1)"
    contract = (("refuse", why, r"has wrong tp_size: infer \d+ train \d+"),)
    adapter = _Reads("peer")
    own = Outcome("refuse", error="ValueError", message="Inference for parameter w has wrong tp_size: infer 3 train 2",
                  contract=contract)
    assert judge(valid, own, adapter)[0] == "contract"
    other = Outcome("refuse", error="IndexError", message="list index out of range", contract=contract)
    verdict, reason, _notes = judge(valid, other, adapter)
    assert verdict == "fail" and "refused something valid" in reason, reason
