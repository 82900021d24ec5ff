"""Assertions for other projects' test suites: a failing plan raises with the oracle's full verdict
and, when asked, leaves a repro that ``refplan verify`` replays.

A test that does ``assert verify_plan(t, s, plan).ok, str(verdict)`` says what is wrong, but in CI
the maps and the plan that broke are gone when the job ends, and what hypothesis prints of them
is a Python ``repr`` that no tool reads back. So ``assert_plan_valid`` and ``assert_plans_valid``
raise ``AssertionError`` with the verdict's whole text and, given a directory (``repro_dir=`` or
the environment variable ``REFPLAN_REPRO_DIR``, e.g. set in CI and uploaded as an artifact),
write the failing case there as ``maps.json`` (``refplan.maps/1``) and ``plans.json``
(``refplan.plans/1``), the files ``refplan verify maps.json plans.json`` reads. The message names
both files and the command. Without a directory nothing is written.

Each failure gets its own folder, named by a hash of the two files' content: two failures never
overwrite each other, and the same failure (a test re-run, hypothesis replaying its example)
lands in the same folder. Under hypothesis every failing example met while shrinking gets a
folder; the message of the failure hypothesis reports names the minimal one.

Whatever was passed is written if it can be: maps as ``ParamAffineMap`` or DeepSpeed dicts, plans
as ``TransferPlan``, DeepSpeed plan dicts or lists of segment dicts (converted through
``TransferPlan.from_dict``; a plan without ``logical_shape`` gets its maps'). Input that cannot be
written in those formats (the malformed plan the verdict is about, say) goes to
``maps.raw.json``/``plans.raw.json`` beside them, and the message says that the replay cannot hold
it. The written files are read back and judged once more; if that verdict differs from the one
raised, the message says so too, rather than promising a replay that does not happen.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .formats import MapsBatch, dump_maps, dump_plans, parse_maps, parse_plans
from .maps import ParamAffineMap
from .oracle import FALLBACK_MAX_ELEMENTS, BatchVerdict, Verdict, verify_plan, verify_plans
from .oracle.layout import MapLike
from .oracle.segments import PlanLike
from .plan import TransferPlan, TransferSegment

__all__ = ["REPRO_ENV", "assert_plan_valid", "assert_plans_valid"]

REPRO_ENV = "REFPLAN_REPRO_DIR"
"""The environment variable naming a repro directory when ``repro_dir`` is not given."""


def assert_plan_valid(
    target: MapLike,
    source: MapLike,
    plan: PlanLike,
    *,
    parameter: str = "param",
    repro_dir: str | os.PathLike[str] | None = None,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
) -> None:
    """Raise ``AssertionError`` unless ``verify_plan(target, source, plan)`` is ``ok``.

    The message is the verdict's full text (status, reason, counterexample). With ``repro_dir``
    (or ``$REFPLAN_REPRO_DIR``) the case is also written there as a one-parameter batch named
    ``parameter``, and the message names the files and the ``refplan verify`` command that
    replays the same verdict. ``unverifiable`` fails too: a plan the oracle could not check is
    not known to be right. ``fallback_elements`` is ``verify_plan``'s; the command replays with
    its default, and the message says so when that changes the verdict.
    """
    verdict = verify_plan(target, source, plan, parameter=parameter, fallback_elements=fallback_elements)
    if verdict.ok:
        return
    where = _repro_dir(repro_dir)
    text = f"refplan: the plan is not valid\n{verdict}"
    if where is not None:
        text += "\n" + _write_repro(where, {parameter: (target, source)}, {parameter: plan}, {parameter: verdict})
    raise AssertionError(text)


def assert_plans_valid(
    pairs: Mapping[str, tuple[MapLike, MapLike]],
    plans: Mapping[str, PlanLike],
    *,
    repro_dir: str | os.PathLike[str] | None = None,
    fallback_elements: int = FALLBACK_MAX_ELEMENTS,
) -> None:
    """Raise ``AssertionError`` unless ``verify_plans(pairs, plans)`` is ``ok``.

    ``pairs`` is ``{name: (target, source)}``, as ``plan_transfers`` takes. The message is the
    batch verdict's full text; with ``repro_dir`` (or ``$REFPLAN_REPRO_DIR``) the whole batch is
    written, so the replay's batch verdict is this one.
    """
    result: BatchVerdict = verify_plans(pairs, plans, fallback_elements=fallback_elements)
    if result.ok:
        return
    where = _repro_dir(repro_dir)
    text = f"refplan: the plans are not valid\n{result}"
    if where is not None:
        text += "\n" + _write_repro(where, pairs, plans, result.verdicts)
    raise AssertionError(text)


def _repro_dir(given: str | os.PathLike[str] | None) -> Path | None:
    if given is not None:
        return Path(given)
    env = os.environ.get(REPRO_ENV, "")
    return Path(env) if env else None


def _jsonable(value: Any) -> Any:
    """``json.dumps``'s fallback for raw input: refplan's objects as their dict forms, numpy
    scalars as numbers, anything else as its ``repr`` (the raw files are for reading, not replay)."""
    if isinstance(value, (ParamAffineMap, TransferPlan, TransferSegment)):
        return value.to_dict()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


def _dumps(doc: Any, *, raw: bool = False) -> str:
    """JSON text; dict order is kept for the replayable files (it is the order they were given in)."""
    return json.dumps(doc, indent=1, sort_keys=raw, default=_jsonable if raw else None) + "\n"


def _as_map(value: Any, where: str) -> ParamAffineMap:
    if isinstance(value, ParamAffineMap):
        return value
    return ParamAffineMap.from_dict(value, where)


def _as_plan(value: Any, shape: tuple[int, ...] | None, where: str) -> TransferPlan:
    """A plan as ``TransferPlan`` (``InvalidMapError`` and friends when it is not one)."""
    if isinstance(value, TransferPlan):
        return value
    if isinstance(value, Mapping):
        if "logical_shape" not in value and "segments" in value and shape is not None:
            value = {**value, "logical_shape": list(shape)}
        return TransferPlan.from_dict(value, where)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if shape is None:
            raise TypeError(f"{where}: a segment list, and no maps to take its logical shape from")
        segments = [s.to_dict() if isinstance(s, TransferSegment) else s for s in value]
        return TransferPlan.from_dict({"logical_shape": list(shape), "segments": segments}, where)
    raise TypeError(f"{where}: a {type(value).__name__} is not a plan")


def _write_repro(
    root: Path,
    pairs: Mapping[str, tuple[Any, Any]],
    plans: Mapping[str, Any],
    verdicts: Mapping[str, Verdict],
) -> str:
    """Write the case under ``root``; return the lines the failure message adds.

    Never raises: the assertion the caller is about to raise is the point, and a repro that could
    not be written (an unwritable directory) is reported in its message instead.
    """
    try:
        return _write_repro_files(root, pairs, plans, verdicts)
    except Exception as exc:  # an OSError, or input no conversion above foresaw
        return f"repro: could not be written under {root} ({type(exc).__name__}: {exc})"


def _write_repro_files(
    root: Path,
    pairs: Mapping[str, tuple[Any, Any]],
    plans: Mapping[str, Any],
    verdicts: Mapping[str, Verdict],
) -> str:
    converted: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    raw_maps: dict[str, Any] = {}
    problems: list[str] = []
    for name in sorted(pairs):
        target, source = pairs[name]
        try:
            converted[name] = (_as_map(target, f"{name}: target map"), _as_map(source, f"{name}: source map"))
        except Exception as exc:
            raw_maps[name] = {"target": target, "source": source}
            problems.append(f"the maps of {name!r} are not a refplan.maps/1 entry ({type(exc).__name__}: {exc})")
    written_plans: dict[str, TransferPlan] = {}
    raw_plans: dict[str, Any] = {}
    for name in sorted(plans):
        pair = converted.get(name)
        shape = tuple(pair[0].logical_shape) if pair is not None else None
        try:
            written_plans[name] = _as_plan(plans[name], shape, f"plans[{name!r}]")
        except Exception as exc:
            raw_plans[name] = plans[name]
            problems.append(f"the plan of {name!r} is not a refplan.plans/1 entry ({type(exc).__name__}: {exc})")
    maps_text = _dumps(dump_maps(MapsBatch(converted)))
    plans_text = _dumps(dump_plans(written_plans))
    raw = {"maps.raw.json": raw_maps, "plans.raw.json": raw_plans}
    raw_texts = {file: _dumps(doc, raw=True) for file, doc in raw.items() if doc}
    digest = hashlib.sha256("\0".join([maps_text, plans_text, *raw_texts.values()]).encode()).hexdigest()[:16]
    folder = root / f"refplan-repro-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    maps_path = folder / "maps.json"
    plans_path = folder / "plans.json"
    maps_path.write_text(maps_text, encoding="utf-8")
    plans_path.write_text(plans_text, encoding="utf-8")
    for file, text in raw_texts.items():
        (folder / file).write_text(text, encoding="utf-8")
    lines = [
        f"repro: {maps_path} and {plans_path}",
        f"replay: refplan verify {shlex.quote(str(maps_path))} {shlex.quote(str(plans_path))}",
    ]
    if problems:
        lines.append(
            "not in the replay: " + "; ".join(problems)
            + f"; the raw input is in {', '.join(str(folder / f) for f in raw_texts)}"
        )
    # Judged as ``refplan verify`` judges the files: read back, with the command's budget, and
    # first its size rules (a tensor above 2**62 elements is bad input there, exit 2, where the
    # oracle as a library says unverifiable: the replay must not be promised to say the same).
    from .errors import AffineTransferError
    from .frames import check_sizes

    replay_pairs = parse_maps(json.loads(maps_text), from_json=True).pairs
    try:
        check_sizes(replay_pairs)
    except AffineTransferError as exc:
        first = (str(exc).splitlines() or [""])[0]
        lines.append(f"note: the replay's verdict differs: refplan verify refuses these maps before judging the plan "
                     f"(exit 2, {type(exc).__name__}: {first})")
        return "\n".join(lines)
    replayed = verify_plans(replay_pairs, parse_plans(json.loads(plans_text), from_json=True))
    differ = [name for name in sorted(verdicts) if str(replayed.verdicts.get(name)) != str(verdicts[name])]
    if differ:
        name = differ[0]
        lines.append(
            f"note: the replay's verdict differs for {len(differ)} parameter(s), e.g. {name!r}: "
            f"{replayed.verdicts.get(name, 'no verdict')}"
        )
    return "\n".join(lines)
