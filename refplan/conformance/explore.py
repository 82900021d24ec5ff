"""Generated exploration of a peer planner's domain: ``refplan conformance --planner X --explore N``.

Hypothesis draws ``N`` configurations from the layouts the peer's own front door produces (mesh
sizes, TP x DP with the TP axis, EP experts for Megatron, uneven shards where the peer's frontend
makes them: DTensor's chunking for DCP, end-to-end shards for Awex, DeepSpeed's split; element
sizes; collocated or not where the peer reads endpoints; one to three parameters of drawn shapes).
Each configuration becomes a case built with refplan's own builders (``maps``, ``interop.from_dtensor``)
whose expectation is what refplan itself does with it (the oracle: its refusal, or acceptance with
its own busiest sender as ``max_sender_load``), and runs through the peer's adapter and the judge
exactly as a corpus case does.

The exploration runs once over the ``N`` examples, counting verdicts; then, for the first ``fail``
(or adapter ``error``) and for the first ``quality`` result, again with the same seed and the
property raising on that kind, so that hypothesis shrinks it to a minimal configuration. Each is
reported as a case (``refplan.conformance-input/1`` input, and the corpus form with its
expectation), ready to be added to the corpus. A fixed seed makes a run reproducible.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..maps import ParamAffineMap, contiguous_split_map, replicate, replicated_map, split
from .base import Adapter, Outcome
from .corpus import Case, parse_case
from .runner import VERDICTS, CaseResult, _run_case

__all__ = ["DOMAINS", "GENERAL", "Domain", "ExploreReport", "build_case", "domain_of", "explore"]

FAILING = ("fail", "error", "unverifiable")  # as ``Report.ok``: a plan nobody could check is no pass


@dataclass(frozen=True)
class Domain:
    """What a peer's front door produces: the sizes and options a configuration is drawn from."""

    tp: tuple[int, ...]
    dp: tuple[int, ...]
    uneven: bool
    """Whether shard sizes may differ (the shape need not be a multiple of the TP size)."""
    dtensor: bool = False
    """Layouts as DTensor places them (``from_dtensor`` on a (DP, TP) mesh, FSDP or HSDP on DP)."""
    endpoints: bool = False
    """Whether the peer reads endpoints: draw collocated (target k on process k) or not (after the source)."""
    experts: bool = False
    """Whether to draw EP expert parameters (four experts over EP ranks of the world)."""
    element_sizes: tuple[int, ...] = (2, 4, 8)
    """Element sizes (dtypes) to draw; empty: the peer plans in elements (no ``element_size``)."""
    one_world: bool = False
    """Both models on one world of ranks, each spanning all of it: the target's TP x DP is drawn to
    the source's world size, collocated (Megatron-Core 0.16.1's refit, ``build_centralized_reshard_plan``
    over the ranks of its one world: an engine on some ranks of it, or on others, is no input its
    front door builds, and drawing one would only count ``contract`` and ``unsupported`` results)."""


_DCP = Domain(tp=(1, 2, 3, 4), dp=(1, 2, 3), uneven=True, dtensor=True)
_MEGATRON = Domain(tp=(1, 2, 4), dp=(1, 2, 4), uneven=False, endpoints=True, experts=True)
DOMAINS: dict[str, Domain] = {
    "dcp": _DCP,
    "dcp-lowest": _DCP,
    "megatron": _MEGATRON,
    "megatron-0.16": Domain(tp=(1, 2, 4), dp=(1, 2, 4), uneven=False, endpoints=True, experts=True, one_world=True),
    "awex": Domain(tp=(1, 2, 3, 4), dp=(1, 2, 3), uneven=True),
    "deepspeed": Domain(tp=(1, 2, 3, 4), dp=(1, 2), uneven=True, element_sizes=()),
}
"""The built-in peers, each with the domain of its own front door."""

GENERAL = Domain(tp=(1, 2, 3, 4), dp=(1, 2, 3), uneven=True, endpoints=True, experts=True)
"""The domain of any other planner (refplan itself, a function, a ``cmd:`` planner): the union of
the peers' layouts as maps (uneven TP x DP on either axis, replicated 1-D parameters, EP experts,
element sizes, collocated or separate endpoints). Why: the corpus is public, so a planner can
recognise its cases and parrot their expectations; drawn cases are unseen (an outside probe,
2026-12-07: ``--explore`` refused every planner but the peers)."""


def domain_of(planner: str) -> Domain:
    """``planner``'s domain: a built-in peer's own, else ``GENERAL``."""
    return DOMAINS.get(planner, GENERAL)


def _label(planner: str) -> str:
    """The planner's name in a drawn case's id and tags: a peer's spec, else "planner" (a command
    line or an entry point is no id)."""
    return planner if planner in DOMAINS else "planner"


def _side_map(shape: tuple[int, ...], axis: int | None, tp: int, dp: int, uneven: bool) -> ParamAffineMap:
    """TP split along ``axis`` (``None``: replicated) replicated over DP, Megatron's rank order."""
    if axis is None:
        return replicated_map(shape, tp * dp)
    n = shape[axis]
    sizes = split(n, tp) if uneven else [n // tp] * tp
    return replicate(contiguous_split_map(shape, sizes, axis), dp)


def _dtensor_map(shape: tuple[int, ...], axis: int | None, tp: int, dp: int, fsdp: bool) -> ParamAffineMap:
    from torch.distributed.tensor import Replicate, Shard

    from ..interop import from_dtensor

    placements: list[Any] = [Shard(0) if fsdp else Replicate(), Replicate() if axis is None else Shard(axis)]
    return from_dtensor(shape, (dp, tp), placements)


def _expert_map(shape: tuple[int, ...], expert: int, experts: int, ep: int, world: int) -> ParamAffineMap:
    """Expert ``expert`` on EP rank ``expert // (experts / ep)`` of every EP group of ``world`` ranks."""
    owners = [c * ep + expert // (experts // ep) for c in range(world // ep)]
    return _relabel(replicated_map(shape, len(owners)), owners)


def _relabel(m: ParamAffineMap, owners: Sequence[int]) -> ParamAffineMap:
    from ..maps import AffinePiece

    names = dict(enumerate(owners))
    pieces = {names[loc]: [AffinePiece(p.shape, p.source_offset, p.source_strides, p.dest_offset, p.dest_strides,
                                       [names[x] for x in p.locations], p.scale) for p in ps]
              for loc, ps in m.pieces_by_rank.items()}
    return ParamAffineMap(m.logical_shape, {names[k]: v for k, v in m.shard_shapes.items()}, pieces)


def build_case(config: Mapping[str, Any], planner: str, slug: str = "0") -> dict[str, Any]:
    """The corpus form of one configuration (without ``expect``): id, why, tags, parameters and options."""
    domain = domain_of(planner)
    s, t = config["source"], config["target"]
    world_s, world_t = s["tp"] * s["dp"], t["tp"] * t["dp"]
    params: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    for i, p in enumerate(config["params"]):
        shape = tuple(p["shape"])
        name = f"layers.{i}.{'weight' if p['axis'] is not None else 'norm'}"
        if domain.dtensor:
            src = _dtensor_map(shape, p["axis"], s["tp"], s["dp"], s["fsdp"])
            tgt = _dtensor_map(shape, p["axis"], t["tp"], t["dp"], t["fsdp"])
        else:
            src = _side_map(shape, p["axis"], s["tp"], s["dp"], domain.uneven)
            tgt = _side_map(shape, p["axis"], t["tp"], t["dp"], domain.uneven)
        params[name] = {"target": tgt.to_dict(), "source": src.to_dict()}
        if p["element_size"] is not None:
            sizes[name] = p["element_size"]
    for e in range(config["experts"]):
        name = f"experts.{e}.w1"
        shape = tuple(config["expert_shape"])
        params[name] = {"target": _expert_map(shape, e, config["experts"], t["ep"], world_t).to_dict(),
                        "source": _expert_map(shape, e, config["experts"], s["ep"], world_s).to_dict()}
        if config["params"][0]["element_size"] is not None:  # one dtype for the model
            sizes[name] = config["params"][0]["element_size"]
    raw: dict[str, Any] = {
        "id": f"explore/{_label(planner)}-{slug}",
        "why": "Explored: " + describe(config),
        "tags": ["explore", _label(planner)],
        "parameters": dict(sorted(params.items())),
    }
    if sizes:
        raw["element_size"] = dict(sorted(sizes.items()))
    if config["collocated"] is not None:
        raw["endpoints"] = {"source": {str(r): r for r in range(world_s)},
                            "target": {str(k): k if config["collocated"] else world_s + k for k in range(world_t)}}
    return raw


def describe(config: Mapping[str, Any]) -> str:
    """A configuration in one line (the case's ``why``)."""
    def side(d: Mapping[str, Any]) -> str:
        out = f"TP={d['tp']} x DP={d['dp']}"
        if d.get("fsdp"):
            out += " (FSDP on DP)"
        if d.get("ep") is not None and config["experts"]:
            out += f", EP={d['ep']}"
        return out

    params = ", ".join(f"{'x'.join(map(str, p['shape']))}"
                       + (" replicated" if p["axis"] is None else f" split on axis {p['axis']}")
                       + (f" ({p['element_size']}-byte elements)" if p["element_size"] is not None else "")
                       for p in config["params"])
    text = f"{side(config['source'])} -> {side(config['target'])}; {params}"
    if config["experts"]:
        text += f"; {config['experts']} experts of {'x'.join(map(str, config['expert_shape']))}"
    if config["collocated"] is not None:
        text += "; collocated" if config["collocated"] else "; target on other ranks"
    return text


def oracle_case(raw: Mapping[str, Any]) -> Case:
    """The case with refplan's own outcome as its expectation: refuse with its class, or accept with
    ``max_sender_load`` the busiest sender of refplan's own plan (a bound the reference meets, so a
    peer that loads one sender more is judged ``quality``, never ``fail``)."""
    from .adapters import RefplanAdapter
    from .runner import sender_loads

    probe = parse_case({**raw, "expect": {"outcome": "accept"}}, "explore", "explore")
    outcome: Outcome = RefplanAdapter().run(probe)
    expect: dict[str, Any] = {"outcome": "accept"}
    if outcome.kind == "refuse":
        expect = {"outcome": "refuse", "error": outcome.error}
    elif outcome.kind == "accept":
        expect["max_sender_load"] = max(sender_loads(probe, outcome.plans or {}).values(), default=0)
    return parse_case({**raw, "expect": expect}, "explore", "explore")


def strategy(planner: str) -> Any:
    """The hypothesis strategy of configurations in ``planner``'s domain."""
    from hypothesis import strategies as st

    domain = domain_of(planner)

    @st.composite
    def configs(draw: Any) -> dict[str, Any]:
        def side() -> dict[str, Any]:
            d: dict[str, Any] = {"tp": draw(st.sampled_from(domain.tp)), "dp": draw(st.sampled_from(domain.dp))}
            if domain.dtensor:
                d["fsdp"] = draw(st.booleans()) if d["dp"] > 1 else False
            return d

        s = side()
        if domain.one_world:
            world = s["tp"] * s["dp"]
            tp = draw(st.sampled_from([n for n in domain.tp if world % n == 0 and world // n in domain.dp]))
            t = {"tp": tp, "dp": world // tp}
        else:
            t = side()
        lcm = 1
        for n in (s["tp"], t["tp"]):
            lcm = lcm * n // _gcd(lcm, n)
        params = []
        size = draw(st.sampled_from((None, *domain.element_sizes))) if domain.element_sizes else None  # the dtype
        for _ in range(draw(st.integers(1, 3))):
            axis = draw(st.sampled_from((0, 1, None)))
            if axis is None:
                shape: tuple[int, ...] = (draw(st.integers(1, 16)),)
            elif domain.uneven:
                low = 1 if domain.dtensor else max(s["tp"], t["tp"])
                shape = (draw(st.integers(low, 24)), draw(st.integers(low, 24)))
            else:
                shape = (lcm * draw(st.integers(1, 4)), lcm * draw(st.integers(1, 4)))
            params.append({"shape": list(shape), "axis": axis, "element_size": size})
        experts = 0
        config: dict[str, Any] = {"source": s, "target": t, "params": params, "experts": 0, "collocated": None}
        if domain.experts and draw(st.booleans()):
            experts = 4
            for d in (s, t):
                world = d["tp"] * d["dp"]
                d["ep"] = draw(st.sampled_from([e for e in (1, 2, 4) if world % e == 0]))
            config["experts"] = experts
            config["expert_shape"] = [draw(st.integers(1, 8)), draw(st.integers(1, 8))]
        if domain.endpoints:
            config["collocated"] = draw(st.sampled_from((None, True) if domain.one_world else (None, True, False)))
        return config

    return configs()


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


@dataclass
class ExploreReport:
    """What an exploration found: verdict counts over the drawn examples and the shrunk findings."""

    planner: str
    seed: int
    explored: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {v: 0 for v in VERDICTS if v != "enhancement"})
    """Per verdict; ``enhancement`` is listed only when a drawn case has it (only where the adapter
    checks the peer's answer against its documented choice, ``PeerAdapter.design``: Awex and both
    Megatron-Core releases today; a finding's witnesses are corpus cases, never drawn ones, so a
    drawn ``quality`` result is named only where the adapter recognises a published defect in the
    answer itself, ``PeerAdapter.defect``)."""
    first: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per kind (``fail``: a fail or adapter error; ``quality``), the first such configuration drawn."""
    shrunk: dict[str, tuple[dict[str, Any], Case, CaseResult]] = field(default_factory=dict)
    """Per kind, the minimal configuration hypothesis shrank the first one to: its case and result."""

    @property
    def ok(self) -> bool:
        return not any(self.counts[v] for v in FAILING)

    def findings(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, (config, case, result) in sorted(self.shrunk.items()):
            out.append({"kind": kind, "config": config, "verdict": result.verdict, "got": result.got,
                        "reason": result.reason, "input": case.input_doc(), "case": dict(case.raw),
                        "first_config": self.first.get(kind)})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"planner": self.planner, "seed": self.seed, "explored": self.explored, "counts": dict(self.counts),
                "findings": self.findings()}

    def text(self) -> str:
        summary = ", ".join(f"{n} {v}" for v, n in self.counts.items() if n)
        lines = [f"{self.planner}: explored {self.explored} configurations (seed {self.seed}): {summary or 'nothing'}"]
        for kind, (config, case, result) in sorted(self.shrunk.items()):
            lines.append(f"{kind.upper()} (shrunk) {describe(config)}")
            lines.append(f"  got {result.got}: {result.reason}")
            lines.append("  as a case (refplan.conformance-input/1):")
            lines.append(json.dumps(case.input_doc(), sort_keys=True))
        return "\n".join(lines)


class _Found(Exception):
    def __init__(self, config: dict[str, Any], case: Case, result: CaseResult) -> None:
        super().__init__(result.reason)
        self.config, self.case, self.result = config, case, result


KINDS = {"fail": FAILING, "quality": ("quality",)}
"""What is shrunk: the first ``fail`` (or adapter ``error``, or plan the oracle cannot check), and
the first ``quality`` result."""


def explore(planner: str, adapter: Adapter, examples: int, seed: int = 0, *, shrink: bool = True) -> ExploreReport:
    """Draw ``examples`` configurations of ``planner``'s domain (``domain_of``: a peer's own, else
    ``GENERAL``) with ``seed``, run each through ``adapter`` and the judge (planned twice where the
    adapter asks, as in a corpus run); with ``shrink``, shrink the first ``fail`` (or ``error``) and
    the first ``quality`` result, each to a minimal configuration."""
    import copy

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    report = ExploreReport(adapter.name, seed)
    # From hypothesis's defaults, not the loaded profile (a test profile may derandomize or change the backend).
    base = settings.get_profile("default")
    common = dict(database=None, deadline=None, derandomize=False, print_blob=False,
                  suppress_health_check=list(HealthCheck))

    def run(config: dict[str, Any], slug: str) -> tuple[Case, CaseResult]:
        case = oracle_case(build_case(config, planner, slug))
        return case, _run_case(case, adapter, twice=adapter.twice)

    @hseed(seed)
    @settings(base, max_examples=examples, phases=[Phase.generate], **common)  # type: ignore[arg-type]
    @given(strategy(planner))
    def count(config: dict[str, Any]) -> None:
        _, result = run(config, f"s{seed}-{report.explored}")
        report.explored += 1
        report.counts[result.verdict] = report.counts.get(result.verdict, 0) + 1
        for kind, verdicts in KINDS.items():
            if result.verdict in verdicts and kind not in report.first:
                report.first[kind] = copy.deepcopy(config)

    count()
    if not shrink:
        return report
    for kind in sorted(report.first):
        _shrink(report, kind, lambda: strategy(planner), run, [base, examples, common], seed)
    return report


def _shrink(report: ExploreReport, kind: str, make: Any, run: Any, how: list[Any], seed: int) -> None:
    """Run the exploration again with the same seed, raising on the first result of ``kind``, so that
    hypothesis shrinks it; record the minimal configuration in ``report.shrunk[kind]``."""
    import copy

    from hypothesis import Phase, given, settings
    from hypothesis import seed as hseed

    base, examples, common = how
    verdicts = KINDS[kind]
    last: list[_Found] = []

    @hseed(seed)
    @settings(base, max_examples=examples, phases=[Phase.generate, Phase.shrink], **common)
    @given(make())
    def finds(config: dict[str, Any]) -> None:
        case, result = run(config, f"s{seed}-{kind}")
        if result.verdict in verdicts:
            found = _Found(copy.deepcopy(config), case, result)
            last.append(found)
            raise found

    try:
        finds()
    except _Found as exc:
        report.shrunk[kind] = (exc.config, exc.case, exc.result)
    except Exception:  # hypothesis may wrap or flake; the last one seen is the smallest it reached
        if last:
            report.shrunk[kind] = (last[-1].config, last[-1].case, last[-1].result)
