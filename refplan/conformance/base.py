"""The planner protocol's two types: ``Outcome`` (what a planner did with a case) and ``Adapter``
(a named planner with a feature set). Every adapter module imports them from here: ``adapters``
(refplan, DeepSpeed, entry points, commands) and ``peers`` (DCP, Megatron-Core, Awex), so neither
imports the other at module level."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .corpus import Case

__all__ = ["Adapter", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """What a planner did with a case.

    ``kind`` is ``accept`` (``plans``: name -> plan dict), ``refuse`` (``error``: class name,
    ``message``), ``unsupported`` (``message``: why), ``crash`` (a peer planner raised something
    that is not a deliberate refusal: ``error`` its class, ``message`` its text; judged a failure)
    or ``error`` (the adapter itself broke; ``message`` says how).
    """

    kind: str
    plans: Mapping[str, Any] | None = None
    error: str | None = None
    message: str = ""
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    contract: tuple[tuple[str, ...], ...] = ()
    """(kind, why) or (kind, why, refusal) entries, set only by peer adapters from the case's
    structure: when the judge's verdict is of that kind (``accept``: a ``fail`` for accepting a
    case refplan must refuse; ``refuse``: a ``fail`` for refusing a valid case; ``class``: a
    ``fail`` for refusing, as it must, with another error class than refplan's; ``quality``), it
    becomes ``contract`` with that reason, because the peer did what its own documented contract
    allows (a partial load, a deliberate refusal, an item-granular choice) and only refplan's rules
    forbid it. A wrong plan is never excused. ``refusal``, a regular expression, names the peer's
    own deliberate refusal: the excuse holds only for a refusal whose message it matches. Without
    it any refusal of such a case was excused, a peer's bug included (a maintainer's review of the
    findings, 2026-12-06)."""
    design: str = ""
    """Set only by a peer adapter that checked the peer's *answer* against the peer's documented
    choice of source (``PeerAdapter.design``) and found every read where that rule puts it: the rule
    in words, with its file:line. A ``quality`` result of such an answer is ``enhancement`` (the load
    is the documented design's), on any input, drawn ones (``--explore``) included."""
    defect: str = ""
    """Set only by a peer adapter that recognised a published defect in the peer's *answer*
    (``PeerAdapter.defect``): the finding's note. A ``quality`` result stays ``quality``, but a
    drawn case (``--explore``), which no finding lists as a witness, names its cause instead of
    "not yet explained"."""
    unjudged_loads: str = ""
    """Set only by a peer adapter whose front door never builds the case's engine as a whole,
    although it builds each destination rank's own plan (Megatron-Core 0.16.1 takes the destination
    model on every rank of its one world, so an engine on some ranks is no input of its front door,
    but a rank's plan reads only that rank's metadata): why. The copies are judged; the loads are
    not, since they are no load the peer's users meet, so a ``quality`` result is a ``pass`` with
    this note. Until 2026-12-07 such a result was labelled ``contract``, whose definition (what the
    peer's contract allows) its own reason contradicted (a maintainer-style review)."""
    placement: Mapping[str, Mapping[int, int]] | None = None
    """``{"source": {location: process}, "target": {...}}``: where the adapter ran each location
    when the case names no endpoints and the peer cannot run without (Megatron-Core 0.16.1 refits
    inside one world: the k-th target location on the k-th source rank). Loads and their bound are
    then counted with it, so a copy that stays on its rank is local, as it is to the peer: counted
    as a send, it made a local read look like a remote one (a review of the published findings,
    2026-12-06). ``None``: locations are processes of their own, as the case says."""

    def describe(self) -> str:
        if self.kind == "accept":
            # Counted only where a plan's segments are a list: a malformed answer (``"segments":
            # null``) is the judge's to report, never a crash of the report's "got" column.
            segments = sum(
                len(p["segments"]) for p in (self.plans or {}).values()
                if isinstance(p, Mapping) and isinstance(p.get("segments"), (list, tuple))
            )
            return f"accept ({segments} seg)"
        if self.kind == "refuse":
            return f"refuse {self.error}"
        if self.kind == "crash":
            return f"crash {self.error}"
        return self.kind


class Adapter:
    """Base class: a named planner with a feature set."""

    name = "planner"
    features: frozenset[str] = frozenset()
    strict_messages = False
    """Whether a refusal message must match the case's fragment (refplan's own wording)."""
    twice = False
    """Whether the runner plans each case twice and fails a planner whose two answers differ
    (``runner._run_case``): on for external planners (functions, ``cmd:``), whose determinism is
    what the suite checks; refplan's own is tested apart, and the peers' are not this suite's claim."""

    def missing(self, case: Case) -> list[str]:
        return sorted(case.features() - self.features)

    def run(self, case: Case) -> Outcome:
        """Plan ``case`` unless it needs a missing feature; never raises."""
        missing = self.missing(case)
        if missing:
            return Outcome("unsupported", message="needs " + ", ".join(missing))
        start = time.perf_counter()
        try:
            outcome = self.plan(case)
        except KeyboardInterrupt:  # the user's Ctrl-C stops the run (``Interrupted`` keeps the report)
            raise
        except BaseException as exc:  # the adapter broke: report it, keep going
            # ``SystemExit`` from an in-process planner too: it ended the run with the planner's exit
            # status (0 after a failed case), with no report written.
            outcome = Outcome("error", message=f"adapter raised {type(exc).__name__}: {_text(exc)}")
        return dataclasses.replace(outcome, seconds=time.perf_counter() - start)

    def plan(self, case: Case) -> Outcome:
        raise NotImplementedError


def _text(exc: BaseException) -> str:
    """An exception's text, or how it failed to give one (its ``__str__`` may raise too)."""
    try:
        return str(exc)
    except Exception as inner:
        return f"(its message cannot be read: {type(inner).__name__})"
