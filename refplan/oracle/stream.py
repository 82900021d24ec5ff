"""Judging a batch whose plans arrive one parameter at a time (``refplan verify`` on huge files).

``verify_plans`` takes every plan at once, so its caller holds the whole batch: about 1.3 KB of
Python objects per segment, 12.6 GB for 10⁷ segments. ``verify_stream`` takes the plans as an
iterable of ``(name, plan)`` and judges each as it arrives, holding only the verdicts (and the
validated layouts, as ``verify_plans`` does) between parameters; the caller's iterable decides
how little else stays alive (``formats.PlansStream`` keeps nothing of a plan once yielded).

The answer is ``verify_plans``'s, verdict for verdict: each parameter is judged by the same
``_verify_plan`` call with the same layout memo and verdict reuse, and a parameter only one side
names is answered by ``verify_plans`` itself, so the two paths cannot drift apart in what they say
about it. (``verify_plans`` also hands a verdict on when the very same plan object comes again with
the same map contents, ``judge.Same``; a stream reads each plan afresh and never sees that.)
The one difference is memory: the reused verdicts (keyed on every segment of plans of up to
``limits.REMEMBER_SEGMENTS``) are forgotten after ``limits.STREAM_REMEMBER_PLANS`` distinct
plans, so that they do not grow with the file; forgetting one costs a re-judgement, never a
different verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import limits
from .._gc import cycle_collection_paused
from .judge import FALLBACK_MAX_ELEMENTS, Judged, _verify_plan, fallback_budget, verify_plans
from .layout import Layout, MapLike
from .segments import PlanLike
from .verdict import BatchVerdict, Verdict, worst

__all__ = ["verify_stream"]


def verify_stream(
    pairs: Mapping[str, tuple[MapLike, MapLike]],
    plans: Iterable[tuple[str, PlanLike]],
    *,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
    on_verdict: Callable[[str, PlanLike, Verdict], None] | None = None,
) -> BatchVerdict:
    """``verify_plans(pairs, dict(plans))`` without holding more than one plan at a time.

    A name the iterable gives twice is judged twice and keeps the later verdict, as ``dict``
    would keep the later plan. Whatever the iterable raises propagates (``PlansStream`` raises a
    malformed file's error after its last plan), and no verdict is returned then.

    ``on_verdict(name, plan, verdict)`` is called with each plan while it is still held, so a
    caller that reports more about a failing plan (``refplan verify -v``/``--all``) need not read
    the file twice, which a pipe cannot do.
    """
    fallback_elements = fallback_budget(fallback_elements)
    verdicts: dict[str, Verdict] = {}
    layouts: dict[Any, Layout] = {}
    judged: Judged = {}
    with cycle_collection_paused():
        for name, plan in plans:
            if name in pairs:
                target, source = pairs[name]
                verdicts[name] = _verify_plan(
                    target, source, plan, parameter=name, fallback_elements=fallback_elements, layouts=layouts,
                    judged=judged,
                )
                if len(judged) > limits.STREAM_REMEMBER_PLANS:
                    judged.clear()  # a remembered verdict only saves time; do not grow with the file
            else:
                verdicts[name] = verify_plans({}, {name: plan}).verdicts[name]
            if on_verdict is not None:
                on_verdict(name, plan, verdicts[name])
            del plan  # before the iterable reads the next one
        missing = {name: pairs[name] for name in pairs if name not in verdicts}
        verdicts.update(verify_plans(missing, {}).verdicts)
    ordered = {name: verdicts[name] for name in sorted(verdicts)}
    return BatchVerdict(worst(v.status for v in ordered.values()), ordered)
