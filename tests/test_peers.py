"""The DCP, Megatron-Core and Awex adapters: translations exact, results pinned, findings reproduced.

`make test` installs every peer (`make peers`), so these run in CI; a machine without a peer skips
that peer's tests visibly, naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from refplan.conformance import load_cases
from refplan.conformance.adapters import Adapter, Outcome, make_adapter
from refplan.conformance.corpus import Case
from refplan.conformance.peers import Inexpressible, maps_differ
from refplan.conformance.runner import Report, judge, run_conformance
from refplan.maps import ParamAffineMap, contiguous_split_map, replicate

ROOT = Path(__file__).resolve().parents[1]

# pass / fail / unsupported / quality / error per peer over the whole corpus. A change in a peer's
# results (a new peer release, a corpus or adapter change) must be noticed and explained.
EXPECTED_COUNTS = {
    "dcp": {"pass": 182, "fail": 7, "unsupported": 169, "quality": 2, "error": 0},
    "dcp-lowest": {"pass": 178, "fail": 6, "unsupported": 169, "quality": 7, "error": 0},
    "megatron": {"pass": 98, "fail": 8, "unsupported": 246, "quality": 8, "error": 0},
    "awex": {"pass": 134, "fail": 9, "unsupported": 211, "quality": 6, "error": 0},
}


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases()


_ADAPTERS: dict[str, Adapter] = {}
_REPORTS: dict[str, Report] = {}


def _adapter(spec: str) -> Adapter:
    if spec not in _ADAPTERS:
        try:
            _ADAPTERS[spec] = make_adapter(spec)
        except ValueError as exc:
            pytest.skip(f"peer {spec} is not installed (make peers): {exc}")
    return _ADAPTERS[spec]


def _report(spec: str, cases: list[Case]) -> Report:
    if spec not in _REPORTS:
        _REPORTS[spec] = run_conformance(_adapter(spec), cases)
    return _REPORTS[spec]


@pytest.mark.parametrize("spec", sorted(EXPECTED_COUNTS))
def test_peer_counts_are_pinned(spec: str, cases: list[Case]) -> None:
    report = _report(spec, cases)
    assert report.counts() == EXPECTED_COUNTS[spec], report.summary_line()
    assert len(report.results) - report.counts()["unsupported"] >= 60  # each peer expresses at least 60 cases


@pytest.mark.parametrize("spec", sorted(EXPECTED_COUNTS))
def test_translations_rebuild_the_case_maps_element_for_element(spec: str, cases: list[Case]) -> None:
    """Every case a peer runs: the maps read back from the peer's own input objects equal the
    case's maps, element for element (markers through ``extract_shards``) and piece for piece."""
    adapter: Any = _adapter(spec)
    checked = 0
    for case in cases:
        try:
            problem = adapter.translate(case)
        except Inexpressible:
            continue
        rebuilt = adapter.rebuild(problem)
        for name, pair in case.parameters.items():
            for side, index in (("target", 0), ("source", 1)):
                original = ParamAffineMap.from_dict(pair[side])
                if original.numel > 1 << 16:
                    why = maps_differ(original, rebuilt[name][index])
                else:
                    why = maps_differ(original, rebuilt[name][index], elements=True)
                assert why is None, f"{case.id} {name} {side}: {why}"
        checked += 1
    assert checked >= 60


def test_maps_differ_sees_a_moved_element_and_a_missing_holder() -> None:
    base = replicate(contiguous_split_map((8, 4), [4, 4], 0), 2)
    assert maps_differ(base, base, elements=True) is None
    other = replicate(contiguous_split_map((8, 4), [5, 3], 0), 2)
    assert maps_differ(base, other, elements=True) is not None
    single = contiguous_split_map((8, 4), [4, 4], 0)
    assert maps_differ(base, single) is not None


def test_megatron_refuses_to_translate_uneven_splits(cases: list[Case]) -> None:
    adapter: Any = _adapter("megatron")
    case = next(c for c in cases if c.id == "peers/uneven-tp3-to-tp2-10x8")
    with pytest.raises(Inexpressible, match="uneven TP split"):
        adapter.translate(case)


def test_awex_refuses_several_boxes_per_rank(cases: list[Case]) -> None:
    adapter: Any = _adapter("awex")
    case = next(c for c in cases if c.id == "peers/fused-stride2-tp2-to-tp4")
    with pytest.raises(Inexpressible, match="more than one box"):
        adapter.translate(case)


FINDINGS = [
    ("dcp", "peers/finding-dcp-dedup-counts-items", "quality", "moves 44 > 32"),
    ("dcp", "peers/finding-dcp-one-plan-skips-coverage", "fail", "accepted something that must be refused"),
    ("dcp", "replicas/empty-pieces-zero-width", "fail", "invalid fill"),
    ("megatron", "peers/finding-megatron-pure-dp-reads-one-rank", "quality", "moves 512 > 128"),
    ("megatron", "peers/finding-megatron-tp2dp2-uses-one-replica", "quality", "moves 512 > 256"),
    ("awex", "peers/finding-awex-one-inference-replica", "quality", "moves 1024 > 512"),
    ("awex", "peers/finding-awex-overlapping-shards", "fail", "accepted something that must be refused"),
    ("awex", "rules/R0-a7-reshape", "fail", "crashed: IndexError"),
]


@pytest.mark.parametrize(("spec", "case_id", "verdict", "reason"), FINDINGS)
def test_each_finding_is_reproduced(spec: str, case_id: str, verdict: str, reason: str, cases: list[Case]) -> None:
    result = _report(spec, cases).by_id()[case_id]
    assert (result.verdict, reason in result.reason) == (verdict, True), result.reason
    # refplan itself meets every finding case
    assert run_conformance("refplan", [c for c in cases if c.id == case_id]).counts()["pass"] == 1


def test_quality_never_hides_correctness(cases: list[Case]) -> None:
    """A plan over the load bound that is also wrong is a failure, not quality."""
    case = next(c for c in cases if c.id == "peers/finding-megatron-pure-dp-reads-one-rank")
    adapter = _adapter("megatron")
    outcome = adapter.plan(case)
    assert judge(case, outcome, adapter)[0] == "quality"
    broken = json.loads(json.dumps(outcome.plans))
    broken["param"]["segments"][0]["shape"][0] -= 1  # one row of one target never written
    assert judge(case, Outcome("accept", plans=broken), adapter)[0] == "fail"


def test_peer_crash_is_a_failure_with_the_peers_message(cases: list[Case]) -> None:
    case = next(c for c in cases if c.id == "layouts/row_even-2to4")
    verdict, reason, _ = judge(case, Outcome("crash", error="IndexError", message="list index out of range"),
                               _adapter("awex"))
    assert verdict == "fail" and "IndexError: list index out of range" in reason


@pytest.mark.parametrize("spec", ["dcp", "megatron", "awex"])
def test_cli_json_from_the_venv(spec: str) -> None:
    _adapter(spec)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "refplan"), "conformance", "--planner", spec, "--json", "--case", "peers/*"],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=300,
    )
    doc = json.loads(done.stdout)
    assert doc["counts"]["pass"] > 0 and doc["counts"]["quality"] > 0 and "quality" in doc
    # quality findings alone exit 0; a failure exits 1
    assert done.returncode == (1 if doc["counts"]["fail"] or doc["counts"]["error"] else 0), done.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "docs" / "peers").glob("*.py")))
def test_reproduction_scripts_print_the_wrong_result(script: str) -> None:
    peer = "dcp" if script.startswith("dcp") else script.split("_")[0]
    _adapter(peer)
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "peers" / script)], capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    wrong = {
        "dcp_dedup_counts_items.py": "[11, 3]",
        "dcp_one_plan_skips_coverage.py": "accepted",
        "megatron_pure_dp_reads_one_rank.py": "destination rank 7 reads from source ranks [0]",
        "megatron_tp2dp2_uses_one_replica.py": "parameter b: destination rank 4 reads from source ranks [0]",
        "awex_one_inference_replica.py": "[('a', 0), ('b', 0)]",
        "awex_overlapping_shards.py": "[(0, 6), (4, 8)]",
        "megatron_expert_misrouted.py": "destination rank 0, experts.weight2: copied from rank 0",
        "dcp_empty_chunk_collides.py": "refused a valid save: Failed to validate global plan",
        "megatron_partition_dim_change.py": "refused a valid reshard: Cannot build TP descriptor",
        "awex_reshape_crash.py": "crashed: IndexError",
        "awex_no_coverage_check.py": "target rows written: [(0, 4)] of 8",
    }
    assert wrong[script] in done.stdout


def test_docs_list_every_peer_with_its_summary(cases: list[Case]) -> None:
    text = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    for spec in EXPECTED_COUNTS:
        report = _report(spec, cases)
        assert f"| {report.planner} | `{report.summary_line()}` |" in text, (
            "regenerate with `python -m refplan.conformance.runner --markdown docs/conformance.md`"
        )
        for r in report.results:
            if r.verdict in ("fail", "quality"):
                assert f"`{r.case_id}`" in text


def test_dcp_metadata_reads_back_through_interop(cases: list[Case]) -> None:
    """``interop.from_dcp_metadata`` on the ``Metadata`` DCP itself wrote for every valid case it
    saves: one location per stored chunk, and the chunks are exactly the source's distinct boxes."""
    from refplan.conformance.peers import _chunks
    from refplan.interop import from_dcp_metadata

    adapter: Any = _adapter("dcp")
    checked = 0
    for case in cases:
        if case.expect.outcome != "accept":
            continue
        try:
            problem = adapter.translate(case)
            _, metadata = adapter.save(problem)
        except (Inexpressible, ValueError):
            continue
        maps = from_dcp_metadata(metadata)
        for name, pair in case.parameters.items():
            source = ParamAffineMap.from_dict(pair["source"])
            want = {(c.origin, c.shape) for c in _chunks(source, name)}
            if name not in maps:  # nothing was saved: DCP writes no metadata entry for it
                assert want == set(), case.id
                continue
            m = maps[name]
            got = set()
            for loc, pieces in m.pieces_by_rank.items():
                for p in pieces:
                    origin = tuple(divmod_all(p.source_offset, m.logical_shape))
                    got.add((origin, p.shape))
                    assert m.shard_shapes[loc] == p.shape  # a stored chunk is its own dense tensor
            assert got == want, case.id
        checked += 1
    assert checked >= 60


def divmod_all(offset: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for n in reversed(shape):
        offset, i = divmod(offset, n) if n else (offset, 0)
        out.append(i)
    return list(reversed(out))
