"""Where ``plan_transfers`` spends its time, per stage and per parameter, on bench scenarios.

Runs the planner's own stages one after another, as ``plan_transfers`` does (cyclic collection
paused): validation and requests (``_prepare_batch``), the copies handed to the policy, the
default policy, ``check_answers``, and emitting (or reusing) the plans. Prints the best of
``--repeat`` runs in CPU microseconds per parameter. A measuring aid for docs/performance.md,
not part of the library: it reaches into the planner's private stages on purpose.

    .venv/bin/python scripts/plan_stages.py moe-model llama-sync
"""

from __future__ import annotations

import argparse
import gc
import time

from refplan import planner
from refplan._gc import cycle_collection_paused
from refplan.check import check_answers
from refplan.cli.bench import SCENARIOS
from refplan.limits import PlanBudget
from refplan.policies import balanced


def stages(name: str, repeat: int) -> dict[str, float]:
    scenario = SCENARIOS[name]()
    budget = PlanBudget()
    best: dict[str, float] = {}
    for _ in range(repeat):
        gc.collect()
        with cycle_collection_paused():
            marks = [time.process_time()]
            prepared, sizes, floor = planner._prepare_batch(
                scenario.pairs, budget, scenario.endpoints, scenario.element_size, scenario.process_node, None
            )
            marks.append(time.process_time())
            requests = [r for p in prepared for r in p.requests]
            names = [p.name for p in prepared for _ in p.requests]
            copies = planner._for_policy(balanced, requests, names)
            marks.append(time.process_time())
            answers = balanced(copies)
            marks.append(time.process_time())
            resolved = check_answers(
                requests, answers, element_size=sizes, min_split_bytes=floor, budget=budget, parameters=names
            )
            marks.append(time.process_time())
            planner._finish_all(prepared, resolved, budget)
            marks.append(time.process_time())
        labels = ("validate + requests", "policy input", "policy", "check", "emit / reuse plans")
        for label, a, b in zip(labels, marks, marks[1:]):
            best[label] = min(best.get(label, float("inf")), (b - a) * 1e6 / len(scenario.pairs))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name in args.scenario:
        best = stages(name, args.repeat)
        cells = " | ".join(f"{label} {us:.1f} us" for label, us in best.items())
        print(f"{name}: {cells} | total {sum(best.values()):.1f} us per parameter")


if __name__ == "__main__":
    main()
