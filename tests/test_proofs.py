"""The z3 proofs run clean, and ``proofs/theorem3.md`` names only things that exist.

- ``run_all.py`` proves every claim and shows each one non-vacuous (a counterexample once a
  premise is dropped);
- every ``refplan.…`` name in the theorem's table imports, every test file and test function it
  cites exists, and every z3 claim it cites is defined by a script ``run_all.py`` runs;
- the z3 encodings of ``Box.intersect`` and ``Box.subtract`` in ``proofs/boxes.py`` compute what
  ``refplan.box`` computes, on random concrete boxes: the proofs are about the code, not about a
  paraphrase of it.
"""

from __future__ import annotations

import importlib
import itertools
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from refplan.box import Box, overlapping_pair_array

z3 = pytest.importorskip("z3")

ROOT = Path(__file__).resolve().parent.parent
PROOFS = ROOT / "proofs"
DOC = PROOFS / "theorem3.md"
CLAIMS = PROOFS / "claims.json"


def test_every_claim_is_proved_and_non_vacuous() -> None:
    """The one slow test here (about a minute on 2 cores): ``make proofs`` inside the suite. Every
    claim pinned in ``proofs/claims.json`` is proved with its bounds, each one's non-vacuity
    results are there, and every differential check agrees with the code."""
    done = subprocess.run(
        [sys.executable, str(PROOFS / "run_all.py"), "-q"], cwd=ROOT, capture_output=True, text=True,
        timeout=480, check=False,
    )
    code, out = done.returncode, done.stdout + done.stderr
    lines = out.splitlines()
    assert code == 0, out[-4000:]
    assert not [line for line in lines if line.startswith(("NOT PROVED", "VACUOUS", "MISMATCH", "TABLE"))], out[-4000:]
    pinned = json.loads(CLAIMS.read_text(encoding="utf-8"))
    proved = [m for m in map(_run_all().PROVED.match, lines) if m]
    assert sorted(m.group(1) for m in proved) == sorted(c["name"] for c in pinned["claims"])
    for claim in pinned["claims"]:
        name = claim["name"]
        assert any(line.startswith(f"non-vacuous {name}: unbounded: ") for line in lines), name
        for label in claim["goal"]:
            assert any(line.startswith(f'non-vacuous {name}: goal "{label}" ') for line in lines), (name, label)
        for premise in claim["dropped"]:
            assert f"non-vacuous {name}: dropping {premise} gives counterexample" in out, (name, premise)
    for check in pinned["differential"]:
        assert any(line.startswith(f"agrees {check['name']} ") for line in lines), check["name"]
    assert re.search(r"^claims table: \d+ claims and \d+ differential checks match proofs/claims.json$", out, re.M)
    assert re.search(r"^proofs: \d+ claims proved, \d+ non-vacuity results, \d+ differential checks agree, "
                     r"all proved", out, re.M)


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_function_the_theorem_names_exists() -> None:
    names = sorted(set(re.findall(r"`(refplan(?:\.\w+)+)`", _doc())))
    assert len(names) >= 15
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, missing


def test_every_test_and_script_the_theorem_cites_exists() -> None:
    doc = _doc()
    cited = set(re.findall(r"`(tests/test_\w+\.py)(?:::(\w+))?`", doc))
    assert cited
    for path, function in sorted(cited):
        assert (ROOT / path).is_file(), path
        if function:
            assert re.search(rf"^\s*def {function}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), (
                f"{path}::{function}"
            )
    for script in set(re.findall(r"`proofs/(\w+\.py)`", doc)):
        assert (PROOFS / script).is_file(), script


SCRIPTS = ("tiling", "slabs", "boxes", "addresses", "coalesce", "answers", "theorem3")


def _import_proofs(*names: str) -> list[Any]:
    sys.path.insert(0, str(PROOFS))
    try:
        return [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(str(PROOFS))


def _run_all() -> Any:
    return _import_proofs("run_all")[0]


def test_every_claim_the_theorem_cites_exists() -> None:
    """Claim and encoding names only (building the formulas is cheap; proving them is the test
    above)."""
    prefixes = "|".join(SCRIPTS)
    cited = set(re.findall(rf"`((?:{prefixes})\.\w+)(?:\[[^`]*\])?`", _doc()))
    assert cited
    modules = _import_proofs(*SCRIPTS)
    defined = {claim.name.split("[")[0] for module in modules for claim in module.claims()}
    # an encoding the text names (``coalesce.merge_guard``) is a function of its script
    defined |= {f"{name}.{attr}" for name, module in zip(SCRIPTS, modules) for attr in vars(module)
                if callable(getattr(module, attr)) and not attr.startswith("_")}
    assert cited <= defined, sorted(cited - defined)
    run_all = (PROOFS / "run_all.py").read_text(encoding="utf-8")
    assert all(f'"{name}.py"' in run_all for name in SCRIPTS)


# ---------------------------------------------------------------------------------------------
# The encodings in proofs/boxes.py against refplan.box on concrete boxes.


@pytest.fixture(scope="module")
def encodings() -> Any:
    return _import_proofs("kit", "boxes")


def _concrete(kit: Any, name: str, box: Box) -> Any:
    return kit.SymBox(name, box.ndim, [z3.IntVal(v) for v in box.origin], [z3.IntVal(v) for v in box.extent])


def _value(term: Any) -> Any:
    simple = z3.simplify(term)
    if z3.is_true(simple) or z3.is_false(simple):
        return z3.is_true(simple)
    return simple.as_long()


def _to_box(sym: Any) -> Box:
    return Box(tuple(_value(o) for o in sym.origin), tuple(_value(e) for e in sym.extent))


def _random_box(rng: random.Random, ndim: int) -> Box:
    return Box(tuple(rng.randrange(-3, 4) for _ in range(ndim)), tuple(rng.randrange(-1, 5) for _ in range(ndim)))


def test_encodings_compute_what_refplan_box_computes(encodings: Any) -> None:
    kit, boxes = encodings
    rng = random.Random(7)
    for trial in range(300):
        ndim = 1 + trial % 3
        a, b = _random_box(rng, ndim), _random_box(rng, ndim)
        sa, sb = _concrete(kit, "A", a), _concrete(kit, "B", b)
        present, common = boxes.intersect_model(sa, sb)
        expected = a.intersect(b)
        assert (_to_box(common) if _value(present) else None) == expected, (a, b)
        assert _value(boxes.overlaps_model(sa, sb)) == a.overlaps(b), (a, b)
        pieces = [_to_box(s) for guard, s in boxes.subtract_model(sa, sb) if _value(guard)]
        assert pieces == a.subtract(b), (a, b)


# ---------------------------------------------------------------------------------------------
# The code the proofs do not reach directly, checked exhaustively on small domains (theorem3.md
# §3.2): the pair test of ``box.overlapping_pair_array`` (its live filter, the leaf's strict
# comparison, the k-d partition and the sorted interval join around them) and the int64 array
# arithmetic of ``regions.intersections``. The reference each is held to is the separation
# predicate that ``tiling.separated_has_no_common_point`` / ``unseparated_has_common_point`` prove
# equivalent to "no common point", and plain point sets.


def _grid_boxes(ndim: int, origins: range, extents: range) -> list[Box]:
    axis = [(o, e) for o in origins for e in extents]
    return [Box(tuple(o for o, _ in pick), tuple(e for _, e in pick)) for pick in itertools.product(axis, repeat=ndim)]


def _separated(a: Box, b: Box) -> bool:
    """``SymBox.disjoint``: some axis has one box end at or before the other starts."""
    return any(ao + ae <= bo or bo + be <= ao for ao, ae, bo, be in zip(a.origin, a.extent, b.origin, b.extent))


def _reported(a: Box, b: Box) -> bool:
    """What ``boxes.pair_model`` says the code reports: both boxes positive, and not separated."""
    return all(e > 0 for e in a.extent + b.extent) and not _separated(a, b)


def test_separation_predicate_here_is_the_proved_one(encodings: Any) -> None:
    kit, boxes = encodings
    rng = random.Random(17)
    for trial in range(300):
        ndim = 1 + trial % 3
        a, b = _random_box(rng, ndim), _random_box(rng, ndim)
        sa, sb = _concrete(kit, "A", a), _concrete(kit, "B", b)
        assert _value(sa.disjoint(sb)) == _separated(a, b), (a, b)
        assert _value(boxes.pair_model(sa, sb)) == _reported(a, b), (a, b)
        if _reported(a, b):
            assert _to_box(boxes.array_part_model(sa, sb)) == a.intersect(b), (a, b)


def test_overlapping_pair_array_on_every_pair_of_a_small_domain() -> None:
    """Exhaustive: every pair (and every box with itself) of 2-D boxes with origins -1..1 and
    extents -1..2 per axis, 144 boxes, zero and negative extents included. Two boxes go through
    the ``separated`` shortcut and the leaf; the pair must be reported exactly as predicted."""
    domain = _grid_boxes(2, range(-1, 2), range(-1, 3))
    for i, a in enumerate(domain):
        for b in domain[i:]:
            got = overlapping_pair_array([a, b]).tolist()
            assert got == ([[0, 1]] if _reported(a, b) else []), (a, b)


@pytest.mark.parametrize(("ndim", "origins", "extents"), [
    (1, range(-2, 6), range(-1, 5)),
    (2, range(-1, 2), range(-1, 3)),
    (3, range(0, 2), range(0, 3)),
])
def test_overlapping_pair_array_on_a_whole_small_domain_at_once(ndim: int, origins: range, extents: range) -> None:
    """Exhaustive: every box of a small domain in one call (48, 144 and 216 boxes, so the k-d
    partition cuts cells), without and with two groups; the reported pairs must be exactly the
    predicted ones, each once, sorted."""
    domain = _grid_boxes(ndim, origins, extents)
    expected = [[i, j] for i, j in itertools.combinations(range(len(domain)), 2) if _reported(domain[i], domain[j])]
    assert overlapping_pair_array(domain).tolist() == expected
    groups = [(i * 7) % 3 % 2 for i in range(len(domain))]
    assert overlapping_pair_array(domain, groups=groups).tolist() == [
        [i, j] for i, j in expected if groups[i] != groups[j]
    ]


def _tilings(shape: tuple[int, ...]) -> list[list[Box]]:
    """Every tiling of the box ``[0, shape)`` by boxes, each listed once: the enumeration the
    differential checks of ``make proofs`` use (``proofs/differential.py``), not a second copy."""
    (differential,) = _import_proofs("differential")
    tiles: list[list[Box]] = differential.tilings(shape)
    return tiles


def _tiled_map(shape: tuple[int, ...], tiles: list[Box], first_location: int = 0) -> Any:
    """Each tile on its own location, as that location's whole shard."""
    from refplan.box import row_major_strides
    from refplan.maps import AffinePiece, ParamAffineMap

    strides = row_major_strides(shape)
    shards: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, list[AffinePiece]] = {}
    for k, tile in enumerate(tiles):
        loc = first_location + k
        shards[loc] = tile.extent
        offset = sum(o * s for o, s in zip(tile.origin, strides))
        pieces[loc] = [AffinePiece(tile.extent, offset, strides, 0, row_major_strides(tile.extent), [loc])]
    return ParamAffineMap(shape, shards, pieces)


@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 2, 2)], ids=lambda s: "x".join(map(str, s)))
def test_intersections_on_every_pair_of_small_tilings(shape: tuple[int, ...]) -> None:
    """Exhaustive: for every source tiling S and every target tiling T of a small F (each tile
    on its own location), ``regions.intersections`` returns, in (location, origin) order, one
    part per (frame, region) pair that shares a point, and that part's points are exactly the
    common points. That is Premise C for the arithmetic the code runs, on this domain
    (``answers.premise_c_arrays`` is its z3 form for n <= 3 and 4 regions).

    ``intersections`` has two paths, and a few boxes never reach the array one by default (every
    pair here is below ``limits.ARRAY_MIN_PIECES``, and on F = (5) the slab join always applies).
    So each pair runs both: the int64 array arithmetic with every fast path taken
    (``limits.fast_paths(True)``), and the slab join (``_small_intersections``) wherever it
    applies; each F must reach both."""
    from refplan import limits
    from refplan.box import WorkCounter
    from refplan.frames import normalize
    from refplan.regions import _small_intersections, intersections, source_regions

    tilings = _tilings(shape)
    assert len(tilings) == {(5,): 16, (2, 3): 34, (2, 2, 2): 154}[shape]  # counted by hand for 5 and 2x3
    targets = [normalize(_tiled_map(shape, tiles), "target", "w") for tiles in tilings]
    sources = [source_regions(normalize(_tiled_map(shape, tiles), "source", "w"), WorkCounter()) for tiles in tilings]
    cells = {tile: points(tile) for tiles in tilings for tile in tiles}
    paths = {"array": 0, "slab": 0}
    for regions in sources:
        for target in targets:
            want = []
            for frame in target.frames:  # one frame per location, so location order is frame order
                for region in regions:
                    common = cells[frame.box] & cells[region.box]
                    if common:
                        want.append((frame.location, region.box, common))
            want.sort(key=lambda w: (w[0], min(w[2])))
            with limits.fast_paths(True):
                got = intersections(target, regions, WorkCounter())
            paths["array"] += 1
            assert [(x.target.location, x.region.box, points(x.box)) for x in got] == want, (regions, target)
            small = _small_intersections(target, regions, WorkCounter())
            if small is not None:
                paths["slab"] += 1
                assert [(x.target.location, x.region.box, points(x.box)) for x in small] == want, (regions, target)
    assert paths["array"] == len(tilings) ** 2
    assert paths["slab"] > 0, paths


def points(box: Box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(o, o + e) for o, e in zip(box.origin, box.extent))))


# ---------------------------------------------------------------------------------------------
# The pinned claims table (proofs/claims.json) and what it catches.

TABLE_START = "<!-- claims table: generated from proofs/claims.json by `python proofs/run_all.py --table` -->"
TABLE_END = "<!-- end of claims table -->"


def test_theorem3_md_carries_the_claims_json_table() -> None:
    """The table of claims, bounds and modelled code in ``theorem3.md`` is ``claims.json``'s."""
    doc = _doc()
    assert doc.count(TABLE_START) == 1 and doc.count(TABLE_END) == 1
    shown = doc.split(TABLE_START)[1].split(TABLE_END)[0].strip("\n") + "\n"
    done = subprocess.run([sys.executable, str(PROOFS / "run_all.py"), "--table"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert shown == done.stdout


def test_claims_json_names_real_code_and_every_modelled_function_is_checked() -> None:
    pinned = json.loads(CLAIMS.read_text(encoding="utf-8"))
    checked = {m for c in pinned["differential"] for m in c["models"]}
    modelled = {m for c in pinned["claims"] for m in c["models"]}
    for name in sorted(checked | modelled):
        assert callable(_resolve(name)), name
    assert modelled <= checked, sorted(modelled - checked)
    for family in ("refplan.planner._emit", "refplan.plan.coalesce", "refplan.check.check_answers",
                   "refplan.box.Box.intersect", "refplan.box.Box.subtract", "refplan.regions.intersections"):
        assert family in modelled, family
    assert not _run_all().compare(pinned, _perfect_run(pinned))


def _perfect_run(pinned: dict[str, Any]) -> dict[str, Any]:
    """What ``run_all.observed`` makes of a run that does exactly what ``claims.json`` pins."""
    claims = {c["name"]: {**c, "fixed": list(c["fixed"]), "probe": pinned["probe"]} for c in pinned["claims"]}
    checks = {c["name"]: dict(c) for c in pinned["differential"]}
    return json.loads(json.dumps({"claims": claims, "checks": checks}))


def test_the_pins_catch_smaller_bounds_a_lost_goal_conjunct_and_a_weaker_check() -> None:
    """The reviewer's cases: boxes.py cut to n = 1 (the n >= 2 claims vanish), a goal that lost a
    conjunct (its names and fingerprint change), a bound lowered in place, a premise no longer
    shown to matter, and a differential check that ran fewer cases."""
    run_all = _run_all()
    pinned = json.loads(CLAIMS.read_text(encoding="utf-8"))

    def errors(change: Any) -> list[str]:
        seen = _perfect_run(pinned)
        change(seen)
        return list(run_all.compare(pinned, seen))

    def cut_boxes(seen: dict[str, Any]) -> None:
        for name in [n for n in seen["claims"] if n.startswith("boxes.") and not n.endswith("[n=1]")]:
            del seen["claims"][name]

    assert any("boxes.subtract[n=8]: pinned in claims.json but not proved" in e for e in errors(cut_boxes))

    def lose_conjunct(seen: dict[str, Any]) -> None:
        claim = seen["claims"]["theorem3.identical_data[n=3,k=2,candidates=3]"]
        claim["goal"].remove("A writes at the target frame's address of x")
        claim["fingerprint"] = "0" * 16

    found = errors(lose_conjunct)
    assert any(": goal [" in e for e in found) and any(": fingerprint " in e for e in found), found

    def lower_bound(seen: dict[str, Any]) -> None:
        seen["claims"]["answers.premise_c[n=3,regions=4]"]["bounds"]["regions"] = 2

    assert any("bounds" in e for e in errors(lower_bound))

    def lose_premise(seen: dict[str, Any]) -> None:
        seen["claims"]["coalesce.merge_stays_box[n=2,axis=1]"]["dropped"].remove("merge guard")

    assert any(": dropped [" in e for e in errors(lose_premise))

    def fewer_cases(seen: dict[str, Any]) -> None:
        seen["checks"]["differential.coalesce"]["cases"] = 10

    assert any("differential.coalesce: 10 cases" in e for e in errors(fewer_cases))

    def extra_claim(seen: dict[str, Any]) -> None:
        seen["claims"]["boxes.subtract[n=9]"] = dict(seen["claims"]["boxes.subtract[n=8]"])

    assert any("proved but not pinned" in e for e in errors(extra_claim))


def test_a_hidden_bound_and_a_goal_weakened_in_place_are_reported() -> None:
    """``exact_tiling`` with a premise capping the extents at 2 (the reviewer's example) fails the
    hidden-bound probe, and a goal conjunct replaced by a tautology fails the goal check; the
    shipped claim passes both."""
    kit, answers = _import_proofs("kit", "answers")

    def verdict(claim: Any) -> tuple[bool, bool]:
        bounded, goal = kit.Report(), kit.Report()
        kit.no_hidden_bound(claim, bounded)
        kit.goal_parts_matter(claim, goal)
        return bounded.ok, goal.ok

    assert verdict(answers.exact_tiling(1, 2)) == (True, True)
    capped = answers.exact_tiling(1, 2)
    capped.premises["small extents"] = z3.And(*[e <= 2 for e in z3.Ints("P0.e0 P1.e0")])
    assert verdict(capped) == (False, True)
    weakened = answers.exact_tiling(1, 2)
    weakened.goal = {"goal": z3.BoolVal(True)}
    assert verdict(weakened) == (True, False)
