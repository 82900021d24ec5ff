"""What refplan's planner and oracle cost on inputs with many overlapping pieces (2026-12-07).

An outside probe of the oracle found checks that listed every overlapping pair and intersected
each in Python. This script times, in one process, refplan alone (no peer plans these inputs:
they are adversarial shapes of refplan's own map format, not a user's sync), CPU seconds:

- ``repeated``: a plan repeating one whole-shard segment 2 000 times (a double write): ``verify_plan``;
- ``same-address``: a target map of 2 000 pieces on the same shard addresses (invalid): ``verify_plan``;
- ``rows-and-columns N``: a valid target map of an (N, N) F held twice, cut differently (N row
  pieces on location 0, N column pieces on location 1; N² overlapping pairs): ``plan_transfer``,
  then ``verify_plan`` on its plan, for N = 500, 1 000, 2 000.

It prints the command and the load average at its start. A measuring aid for docs/performance.md,
not a test: timings belong here. What a user pays for a model's sync beside every peer is
``refplan bench`` (``--e2e-only``).

    .venv/bin/python scripts/overlap_costs.py
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from refplan import AffinePiece, ParamAffineMap, TransferPlan, contiguous_split_map, plan_transfer, verify_plan


def _cpu(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.process_time()
    out = fn(*args)
    return time.process_time() - start, out


def rows_and_columns(n: int) -> ParamAffineMap:
    rows = [AffinePiece((1, n), n * r, (n, 1), n * r, (n, 1), [0, 1]) for r in range(n)]
    cols = [AffinePiece((n, 1), c, (n, 1), c, (n, 1), [0, 1]) for c in range(n)]
    return ParamAffineMap((n, n), {0: (n, n), 1: (n, n)}, {0: rows, 1: cols})


def main() -> int:
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}; "
          f"load average {os.getloadavg()[0]:.2f} at its start")
    whole = contiguous_split_map((64, 64), (64,), 0)
    (seg,) = plan_transfer(whole, whole).segments
    seconds, verdict = _cpu(verify_plan, whole, whole, TransferPlan((seg,) * 2000, (64, 64), 0))
    print(f"repeated: 2000 copies of one segment: verify {seconds:.2f} s ({verdict.status})")
    n = 2000
    same = ParamAffineMap((2 * n,), {0: (2,)}, {0: [AffinePiece((2,), 2 * j, (1,), 0, (1,), [0]) for j in range(n)]})
    good = contiguous_split_map((2 * n,), (2 * n,), 0)
    seconds, verdict = _cpu(verify_plan, same, good, [])
    print(f"same-address: {n} pieces on one shard address: verify {seconds:.2f} s ({verdict.status})")
    for n in (500, 1000, 2000):
        target, source = rows_and_columns(n), contiguous_split_map((n, n), (n,), 0)
        planned, plan = _cpu(plan_transfer, target, source)
        judged, verdict = _cpu(verify_plan, target, source, plan)
        print(f"rows-and-columns {n}: plan {planned:.2f} s, verify {judged:.2f} s ({verdict.status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
