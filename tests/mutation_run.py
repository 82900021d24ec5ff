"""Run mutmut over a group of modules (``make mutation [MODULES="refplan/plan.py refplan/frames.py"]``).

mutmut 3.8.1 reads one static configuration (``[tool.mutmut]`` of the ``pyproject.toml`` in its
working directory) with one test selection for every mutated module. The planner's core is
reached by almost every test, so each core module gets its own selection
(``refplan_core."<module>"`` in ``[tool.mutmut]``, a key mutmut does not read): this script runs
mutmut once per group, each in a scratch copy (``mutants/.work/<group>/``: ``refplan/``,
``tests/`` and a ``pyproject.toml`` whose ``[tool.mutmut]`` mutates only that group and selects its
tests), then copies each mutated module's results (``<path>.meta``) to ``mutants/``, where
``tests/mutation_score.py`` reads them. The groups:

- ``refplan/check.py`` and ``refplan/oracle/*`` (``only_mutate`` of ``[tool.mutmut]``): one run
  with ``pytest_add_cli_args_test_selection``, as before;
- each module named in ``refplan_core``: one run with its own list, plus ``refplan_core_deselect``.

``MODULES`` (positional arguments here) picks modules; a glob of ``only_mutate`` or a module under
it is accepted. The default runs all. ``--show NAME`` prints a mutant's diff (``mutmut show`` in
its group's scratch copy). Run times per group are printed and written to ``mutants/times.json``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
WORK = MUTANTS / ".work"
MUTMUT = Path(sys.executable).parent / "mutmut"


def _config() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    return config


def groups(modules: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """(name, only_mutate patterns, test selection) per group of the requested modules, in order."""
    config = _config()
    default_patterns: list[str] = list(config["only_mutate"])  # type: ignore[call-overload]
    default_selection: list[str] = list(config["pytest_add_cli_args_test_selection"])  # type: ignore[call-overload]
    core: dict[str, list[str]] = dict(config.get("refplan_core", {}))  # type: ignore[call-overload]
    deselect: list[str] = list(config.get("refplan_core_deselect", []))  # type: ignore[call-overload]
    wanted = modules or default_patterns + list(core)
    checker_oracle: list[str] = []
    out: list[tuple[str, list[str], list[str]]] = []
    for module in wanted:
        if module in core:
            out.append((Path(module).stem, [module], list(core[module]) + deselect))
        elif module in default_patterns or any(fnmatch.fnmatch(module, p) for p in default_patterns):
            checker_oracle.append(module)
        else:
            raise SystemExit(f"mutation_run: {module} is in no group of [tool.mutmut] (only_mutate or refplan_core)")
    if checker_oracle:
        out.insert(0, ("check_oracle", checker_oracle, default_selection))
    return out


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def scratch_pyproject(only_mutate: list[str], selection: list[str]) -> str:
    """The project's pyproject.toml with a ``[tool.mutmut]`` for one group (the rest unchanged:
    pytest reads its own section from it)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    config = _config()
    block = "\n".join([
        "[tool.mutmut]",
        f"source_paths = {_toml_list(list(config['source_paths']))}",  # type: ignore[call-overload]
        f"only_mutate = {_toml_list(only_mutate)}",
        f"pytest_add_cli_args_test_selection = {_toml_list(selection)}",
        f"pytest_add_cli_args = {_toml_list(list(config['pytest_add_cli_args']))}",  # type: ignore[call-overload]
        "use_git_change_detection = false",
        "",
    ])
    return re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", lambda _: block + "\n", text)


def run_group(name: str, only_mutate: list[str], selection: list[str], children: int, log: Path) -> float:
    here = WORK / name
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "refplan", here / "refplan", ignore=ignore)
    shutil.copytree(ROOT / "tests", here / "tests", ignore=ignore)
    (here / "pyproject.toml").write_text(scratch_pyproject(only_mutate, selection), encoding="utf-8")
    env = dict(os.environ, HYPOTHESIS_PROFILE="mutation", PYTHONHASHSEED="0")
    start = time.monotonic()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"===== {name}: {' '.join(only_mutate)}\n")
        out.flush()
        code = subprocess.call(
            [str(MUTMUT), "run", "--max-children", str(children)], cwd=here, env=env, stdout=out, stderr=out
        )
    took = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"mutation_run: mutmut failed for {name} (exit {code}); see {log}")
    for meta in (here / "mutants").rglob("*.py.meta"):
        target = MUTANTS / meta.relative_to(here / "mutants")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(meta, target)
    return took


def show(name: str) -> int:
    """``mutmut show NAME`` in the scratch copy of the group that holds the mutant."""
    for group in sorted(WORK.glob("*")):
        for meta in (group / "mutants").rglob("*.py.meta"):
            codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
            if name in codes:
                return subprocess.call([str(MUTMUT), "show", name], cwd=group)
    print(f"mutation_run: no mutant {name} under {WORK}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: every group)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--show", metavar="NAME", help="print the diff of one mutant of the last run")
    args = parser.parse_args(argv)
    if args.show:
        return show(args.show)
    plan = groups(args.modules)
    shutil.rmtree(MUTANTS, ignore_errors=True)
    MUTANTS.mkdir()
    log = ROOT / "mutants.log"
    log.write_text("", encoding="utf-8")
    times: dict[str, float] = {}
    total = time.monotonic()
    for name, only_mutate, selection in plan:
        times[name] = round(run_group(name, only_mutate, selection, args.max_children, log), 1)
        print(f"mutation_run: {name} ({' '.join(only_mutate)}): {times[name]:.0f} s", flush=True)
    times["all"] = round(time.monotonic() - total, 1)
    print(f"mutation_run: all: {times['all']:.0f} s")
    (MUTANTS / "times.json").write_text(json.dumps(times, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
