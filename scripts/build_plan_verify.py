"""Build, plan and verify bench scenarios end to end, in CPU microseconds per parameter.

The bench times each planner's own call on inputs built beforehand; this shows what a user of
``refplan verify`` or of the oracle in CI pays for a batch: building its maps, ``plan_transfers``
and ``verify_plans``, best of ``--repeat``. ``--tree DIR`` imports refplan from another checkout
(``git archive <commit> | tar -x -C DIR``), so that two commits can be run side by side in the
same minutes. A measuring aid for docs/performance.md, not part of the library.

    .venv/bin/python scripts/build_plan_verify.py llama-sync moe-model --tree /tmp/old
"""

from __future__ import annotations

import argparse
import gc
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="+")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tree", help="import refplan from this checkout instead")
    args = parser.parse_args()
    if args.tree:
        sys.path.insert(0, args.tree)
    from refplan import plan_transfers, verify_plans
    from refplan.cli.bench import SCENARIOS

    for name in args.scenario:
        best = [float("inf")] * 3
        for _ in range(args.repeat):
            gc.collect()
            start = time.process_time()
            scenario = SCENARIOS[name]()
            built = time.process_time()
            plans = plan_transfers(scenario.pairs, endpoints=scenario.endpoints,
                                   element_size=scenario.element_size, process_node=scenario.process_node)
            planned = time.process_time()
            verdict = verify_plans(scenario.pairs, plans)
            verified = time.process_time()
            if verdict.status != "ok":
                raise SystemExit(f"{name}: the oracle found the plans {verdict.status}")
            per = 1e6 / len(scenario.pairs)
            for i, seconds in enumerate((built - start, planned - built, verified - planned)):
                best[i] = min(best[i], seconds * per)
            del scenario, plans, verdict
        build, plan, verify = best
        print(f"{name}: build {build:.1f} us | plan {plan:.1f} us | verify {verify:.1f} us | "
              f"total {build + plan + verify:.1f} us per parameter")


if __name__ == "__main__":
    main()
