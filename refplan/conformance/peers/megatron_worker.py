"""The megatron-core 0.19.2 side of ``--planner megatron``: a subprocess, not imported by refplan.

megatron-core 0.19.2's wheel is for CPython 3.12 only, but its resharding modules are pure Python;
``make peers`` installs it (and the ``triton`` it imports) with ``pip install --target`` into a folder
of its own, which this process puts first on ``sys.path`` (so the 0.16.1 in the virtual environment
stays as it is, for ``--planner megatron-0.16``). It reads one JSON request per line on stdin: the
rosters ``build_plan_from_rosters`` takes, each ``ParameterMetadata`` as a dict of its fields; for
every destination rank it calls ``build_plan_from_rosters(dst_rosters, src_rosters, rank)`` (0.19.2's
pure, collective-free entry point) and answers one JSON line: the receive ops as (parameter,
destination rank, source rank, source slices, destination slices) with the CPU and wall seconds of
the planning calls alone (``seconds``, ``wall_seconds``, what ``refplan bench`` reports), or the
exception's class and message. Run as ``python -P megatron_worker.py FOLDER`` (``-P``: its own
folder, which holds refplan's ``megatron.py``, stays off ``sys.path``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import time
import warnings
from typing import Any


def _slices(value: Any) -> list[list[int | None]]:
    return [[s.start, s.stop, s.step] for s in value]


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import megatron.core  # type: ignore[import-untyped]
        import torch
        from megatron.core.resharding.planner import build_plan_from_rosters  # type: ignore[import-untyped]
        from megatron.core.resharding.utils import ParameterMetadata  # type: ignore[import-untyped]
    from importlib.metadata import version  # the folder is first on sys.path: its dist-info wins

    print(json.dumps({"ready": version("megatron-core"), "torch": torch.__version__,
                      "file": megatron.core.__file__}), flush=True)

    def meta(d: dict[str, Any]) -> Any:
        fields = dict(d)
        fields["shape"] = tuple(fields["shape"])
        fields["dtype"] = getattr(torch, fields["dtype"])
        return ParameterMetadata(**fields)

    for line in sys.stdin:
        request = json.loads(line)
        try:
            dst = {int(r): {m["resolved_name"]: meta(m) for m in ms} for r, ms in request["dst"].items()}
            src = {name: [meta(m) for m in ms] for name, ms in request["src"].items()}
            ops = []
            plans = []
            with contextlib.redirect_stdout(io.StringIO()):
                # Only the planning calls are timed (CPU and wall), not the request's decoding nor the
                # answer's encoding: `refplan bench` reports these seconds, not the round trip.
                wall, cpu = time.perf_counter(), time.process_time()
                for rank in sorted(dst):
                    plans.append((rank, build_plan_from_rosters(dst, src, rank)))
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            for rank, plan in plans:
                for op in plan.recv_ops:
                    ops.append([op.param_name, rank, op.peer_rank, _slices(op.peer_slice), _slices(op.my_slice)])
            answer: dict[str, Any] = {"ops": ops, "seconds": cpu, "wall_seconds": wall}
        except Exception as exc:  # reported to the adapter, which judges refusal or crash by class
            answer = {"error": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else ""}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
