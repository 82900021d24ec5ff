"""The ``refplan`` command: ``plan``, ``verify``, ``demo``.

Exit codes are part of the interface so CI can branch on them: 0 success, 1 a plan judged
invalid, 2 bad input (unreadable file, invalid map, refused layout or policy, budget), 3 a plan
the oracle could not verify. Errors print one line naming the error class, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import AffineTransferError
from .files import dump_plans, load_json, parse_endpoints, read_maps
from .planner import plan_transfers
from .policies import POLICIES

__all__ = ["main"]


def _write_json(doc: Any, output: str | None) -> None:
    text = json.dumps(doc, indent=None, separators=(",", ":"), sort_keys=True) + "\n"
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text, encoding="utf-8")


def _cmd_plan(args: argparse.Namespace) -> int:
    batch = read_maps(args.maps)
    endpoints = batch.endpoints
    if args.endpoints is not None:
        endpoints = parse_endpoints(load_json(args.endpoints))
    element_size = batch.element_size
    if args.element_size is not None:
        element_size = dict.fromkeys(batch.pairs, args.element_size)
    plans = plan_transfers(
        batch.pairs,
        endpoints=endpoints,
        element_size=element_size,
        replica_policy=POLICIES[args.policy],
        min_split_bytes=args.min_split_bytes,
        process_node=batch.process_node if endpoints is not None else None,
    )
    _write_json(dump_plans(plans), args.output)
    segments = sum(len(p.segments) for p in plans.values())
    moved = sum(p.moved_elements for p in plans.values())
    print(
        f"refplan plan: {len(plans)} parameter(s), {segments} segments, {moved} elements, policy {args.policy}",
        file=sys.stderr,
    )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import run_verify_cli

    return run_verify_cli(args.maps, args.plans, as_json=args.json)


def _cmd_demo(_args: argparse.Namespace) -> int:
    from .demo import run_demo

    print(run_demo())
    return 0


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refplan", description="Reference planner for affine resharding transfers")
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="maps JSON (refplan.maps/1) in, plans JSON (refplan.plans/1) out")
    plan.add_argument("maps", help="maps batch file")
    plan.add_argument("-o", "--output", help="plans file to write (default: stdout)")
    plan.add_argument("--policy", choices=sorted(POLICIES), default="balanced")
    plan.add_argument("--endpoints", help="JSON {source: {loc: proc}, target: {loc: proc}}; overrides the maps file")
    plan.add_argument("--element-size", type=int, help="bytes per element for every parameter")
    plan.add_argument("--min-split-bytes", type=int, help="smallest part of a split (default 8 MiB)")
    plan.set_defaults(func=_cmd_plan)

    verify = sub.add_parser("verify", help="check plans against their maps with the independent oracle")
    verify.add_argument("maps")
    verify.add_argument("plans")
    verify.add_argument("--json", action="store_true", help="machine-readable report")
    verify.set_defaults(func=_cmd_verify)

    demo = sub.add_parser("demo", help="plan a built-in TPxDP -> TP sync with two policies")
    demo.set_defaults(func=_cmd_demo)

    for name, module, add_arguments, run, help_text in _OPTIONAL:
        _optional_command(sub, name, module, add_arguments, run, help_text, load=name == command)
    return parser


_OPTIONAL = (
    ("sync", "refplan.sync", "add_sync_arguments", "run_sync_cli",
     "run a real sync over torch.distributed on this machine and check every byte"),
    ("conformance", "refplan.conformance.runner", "add_conformance_arguments", "run_conformance_cli",
     "run the conformance corpus against a planner"),
    ("show", "refplan.show", "add_show_arguments", "run_show_cli",
     "per-process load table and an SVG picture of a plan"),
    ("bench", "refplan.bench", "add_bench_arguments", "run_bench_cli",
     "plan named scenarios side by side and print ratios"),
)


def _optional_command(
    sub: Any, name: str, module: str, add_arguments: str, run: str, help_text: str, *, load: bool
) -> None:
    """Register a sub-command whose module is imported only when that command runs.

    Keeps ``refplan plan`` fast and free of torch (``sync`` imports it); a command whose module
    is absent from this build is simply not offered.
    """
    import importlib
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return
    parser = sub.add_parser(name, help=help_text)
    if load:
        target = importlib.import_module(module)
        getattr(target, add_arguments)(parser)
        parser.set_defaults(func=getattr(target, run))


def _one_line(text: str) -> str:
    """``text`` with every line break escaped, so an error is exactly one line whatever it quotes."""
    return "\\n".join(text.splitlines())


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    args = _parser(command).parse_args(words)
    try:
        code: int = args.func(args)
    except AffineTransferError as exc:
        print(_one_line(f"refplan {args.command}: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        return 0
    except OSError as exc:  # e.g. -o names a directory or an unwritable path (inputs are read by load_json)
        where = f"{exc.filename}: " if exc.filename else ""
        print(_one_line(f"refplan {args.command}: {type(exc).__name__}: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 2
    except MemoryError:
        print(f"refplan {args.command}: MemoryError: the input is too large to load", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
