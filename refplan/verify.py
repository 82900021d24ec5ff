"""``refplan.verify``: the independent oracle's public face, and the ``refplan verify`` command.

The oracle itself lives in ``refplan.oracle`` (verdicts, its own map validation, segments, the
judgement), which imports nothing of the planner. This module re-exports its public names, so
``from refplan.verify import verify_plan`` keeps working, and holds the command-line front end,
which reads files through ``files`` — a tool's concern, kept out of the oracle's import closure.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from . import limits
from .errors import AffineTransferError, InputFileError, InvalidMapError
from .formats import MapsBatch, PlansStream, check_keys, load_json, parse_plans, read_maps
from .oracle import FALLBACK_MAX_ELEMENTS, MAX_COORDINATE, BatchVerdict, Verdict, verify_plan, verify_plans
from .oracle.stream import verify_stream
from .plan import TransferPlan

__all__ = [
    "FALLBACK_MAX_ELEMENTS",
    "MAX_COORDINATE",
    "BatchVerdict",
    "Verdict",
    "run_verify_cli",
    "verify_plan",
    "verify_plans",
    "verify_stream",
]


def run_verify_cli(
    maps_path: str, plans_path: str, *, as_json: bool = False, quiet: bool = False, stream: bool | None = None
) -> int:
    """``refplan verify MAPS.json PLANS.json``: print a report, return the exit code.

    Exit 0 ok, 1 invalid, 3 unverifiable, 2 bad input: a file that cannot be read or parsed (one
    line on stderr), or a map that fails validation (reported per parameter as ``invalid_map``).
    The plans file is a ``refplan.plans/1`` batch, or a bare ``{logical_shape, segments}`` plan
    dict (DeepSpeed's) when the maps file holds exactly one parameter. ``quiet`` prints no text
    report (the exit code says it all; ``--json`` is still printed, since it was asked for).

    ``stream`` reads the plans file one parameter at a time (``formats.PlansStream``,
    ``oracle.stream.verify_stream``), holding one plan instead of the batch; ``None`` (the
    default) streams files of at least ``limits.STREAM_PLANS_BYTES``. The report, the exit code
    and every error line are the same either way; streaming adds one line on stderr saying so
    (not with ``quiet``).
    """
    try:
        batch = read_maps(maps_path)
    except (AffineTransferError, InputFileError) as exc:
        print(f"refplan verify: bad input: {exc}", file=sys.stderr)
        return 2
    if stream is None:
        try:
            size = os.path.getsize(plans_path)
        except OSError:
            size = 0  # the reader reports it
        stream = size >= limits.STREAM_PLANS_BYTES
        why = f"{size} bytes, at least the {limits.STREAM_PLANS_BYTES}-byte threshold"
    else:
        why = "as asked"
    if stream and not quiet:
        print(f"refplan verify: streaming {plans_path} ({why}): one parameter at a time", file=sys.stderr)
    try:
        result = _verify_streaming(batch, plans_path) if stream else verify_plans(
            batch.pairs, _plans_of(load_json(plans_path), batch, plans_path)
        )
    except InputFileError as exc:
        print(f"refplan verify: bad input: {exc}", file=sys.stderr)
        return 2
    except AffineTransferError as exc:
        text = str(exc)
        where = text if text.startswith(str(plans_path)) else f"{plans_path}: {text}"
        print(f"refplan verify: bad input: {where}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    elif not quiet:
        print(result)
    for name in sorted(result.verdicts):
        verdict = result.verdicts[name]
        if verdict.status == "invalid_map":
            print(f"refplan verify: bad input: parameter {name!r}: {verdict.map_error}", file=sys.stderr)
            break
    return result.exit_code


def _plans_of(doc: Any, batch: MapsBatch, plans_path: str) -> dict[str, TransferPlan]:
    """The plans of a whole plans document: a ``refplan.plans/1`` batch, or a bare plan dict
    for a maps file of one parameter."""
    if isinstance(doc, Mapping) and "format" not in doc and "segments" in doc:
        if len(batch.pairs) != 1:
            raise InvalidMapError(
                f"{plans_path}: a bare plan needs a maps file with exactly one parameter, "
                f"this one has {len(batch.pairs)}"
            )
        (name,) = batch.pairs
        check_keys(doc, "plan")
        return {name: TransferPlan.from_dict(doc, f"plans[{name!r}]")}
    return parse_plans(doc, from_json=True)


def _verify_streaming(batch: MapsBatch, plans_path: str) -> BatchVerdict:
    """Judge each plan as ``PlansStream`` reads it; a document that turns out not to be a plans
    batch (a bare plan) is handled as the whole-file path handles it."""
    plans = PlansStream(plans_path)
    result = verify_stream(batch.pairs, plans)
    if not plans.streamed:
        return verify_plans(batch.pairs, _plans_of(plans.document, batch, plans_path))
    return result
