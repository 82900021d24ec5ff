"""The ``refplan`` command: ``plan``, ``verify``, ``demo``, and ``sync``, ``conformance``,
``show``, ``bench`` where their modules are present. ``python -m refplan`` is the same command.

Exit codes are part of the interface so CI can branch on them: 0 success, 1 a plan judged
invalid, 2 bad input (unreadable file, invalid map, refused layout or policy, budget, a missing
optional dependency), 3 a plan the oracle could not verify. Errors print one line naming the
error class, never a traceback. Every sub-command takes ``-q/--quiet`` (only results and errors)
and ``-v/--verbose`` (more detail), so scripts and people can each get what they need.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .._progress import escaping_unencodable
from ..errors import AffineTransferError
from ..formats import (
    MAX_ELEMENT_SIZE,
    dump_plans,
    output_file_name,
    read_endpoints,
    read_maps,
    stdout_gone,
    write_text_file,
)
from ..limits import STREAM_PLANS_BYTES
from ..planner import plan_transfers
from ..policies import POLICIES

__all__ = ["main"]


class _CannotWrite(Exception):
    """An output file could not be written; the message is the whole line after the prefix."""


def _write_json(doc: Any, output: str | None) -> None:
    text = json.dumps(doc, indent=None, separators=(",", ":"), sort_keys=True) + "\n"
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    try:
        write_text_file(output, text)  # whole or not at all: a failed write leaves the old file
    except OSError as exc:  # a missing folder, a directory, no permission: said in words
        raise _CannotWrite(f"cannot write {output}: {exc.strerror or exc}") from None


def _cmd_plan(args: argparse.Namespace) -> int:
    # Argument errors are the caller's, not a map's: one line, exit 2, before any file is read.
    if args.element_size is not None and not 1 <= args.element_size <= MAX_ELEMENT_SIZE:
        # The bound is the one a maps file's element_size is held to (formats.MAX_ELEMENT_SIZE).
        print(f"refplan plan: --element-size must be from 1 to {MAX_ELEMENT_SIZE} bytes, got {args.element_size}",
              file=sys.stderr)
        return 2
    if args.min_split_bytes is not None and args.min_split_bytes < 0:
        print(f"refplan plan: --min-split-bytes must be at least 0, got {args.min_split_bytes}", file=sys.stderr)
        return 2
    batch = read_maps(args.maps)
    endpoints = batch.endpoints
    if args.endpoints is not None:
        endpoints = read_endpoints(args.endpoints)
    element_size = batch.element_size
    if args.element_size is not None:
        element_size = dict.fromkeys(batch.pairs, args.element_size)
    policy = POLICIES[args.policy]
    if args.policy == "split_balanced" and args.min_split_bytes is not None:
        # The floor reaches the policy as well as the planner's check: the registered policy keeps
        # its default 8 MiB floor, so a larger --min-split-bytes refused the policy's own valid
        # splits ("below min_split_bytes") and a smaller one changed nothing (as ``bench`` builds it).
        from ..policies.split_balanced import split_balanced_policy

        policy = split_balanced_policy(args.min_split_bytes)
    plans = plan_transfers(
        batch.pairs,
        endpoints=endpoints,
        element_size=element_size,
        replica_policy=policy,
        min_split_bytes=args.min_split_bytes,
        process_node=batch.process_node,  # without endpoints, refused as plan_transfers refuses it
    )
    _write_json(dump_plans(plans), args.output)
    if args.verbose:
        for name in sorted(plans):
            plan = plans[name]
            print(f"refplan plan: {name}: {len(plan.segments)} segments, {plan.moved_elements} elements",
                  file=sys.stderr)
    if not args.quiet:
        segments = sum(len(p.segments) for p in plans.values())
        moved = sum(p.moved_elements for p in plans.values())
        print(
            f"refplan plan: {len(plans)} parameter(s), {segments} segments, {moved} elements, policy {args.policy}",
            file=sys.stderr,
        )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from ..verify import run_verify_cli

    return run_verify_cli(args.maps, args.plans, as_json=args.json, quiet=args.quiet, stream=args.stream,
                          verbose=args.verbose, junit=args.junit, all_failures=args.all)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import demo_report

    report, all_ok = demo_report(quiet=args.quiet, verbose=args.verbose)
    print(report)
    return 0 if all_ok else 1  # the oracle's verdicts are the demo's result


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("refplan")
    except Exception:  # running from a source tree that was never installed
        from .. import __version__

        return __version__


def _common() -> argparse.ArgumentParser:
    """``-q`` / ``-v``, shared by every sub-command (so they go after the command's name)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true",
                       help="print only results and errors: no summaries, no progress")
    group.add_argument("-v", "--verbose", action="store_true", help="print more detail (per parameter, per case)")
    return common


_POLICY_HELP = (
    "replica policy: balanced (default: local copy first, then the least-loaded holder), first_holder "
    "(lowest holder location), lpt (largest first to the least-loaded holder, no locality), split_balanced "
    "(may split a region across holders by an alpha-beta cost)"
)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refplan", description="Reference planner for affine resharding transfers")
    parser.add_argument("--version", action="version", version=f"refplan {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common()

    plan = sub.add_parser("plan", parents=[common],
                          help="maps JSON (refplan.maps/1) in, plans JSON (refplan.plans/1) out")
    plan.add_argument("maps", help="maps batch file (refplan.maps/1; '-' reads standard input)")
    plan.add_argument("-o", "--output", type=output_file_name, help="plans file to write (default, or '-': stdout)")
    plan.add_argument("--policy", choices=sorted(POLICIES), default="balanced", help=_POLICY_HELP)
    plan.add_argument("--endpoints", metavar="FILE",
                      help="a JSON file {source: {loc: proc}, target: {loc: proc}}; overrides the maps file's")
    plan.add_argument("--element-size", type=int,
                      help="bytes per element for every parameter; overrides the maps file")
    plan.add_argument("--min-split-bytes", type=int, help="smallest part of a split (default 8 MiB)")
    plan.set_defaults(func=_cmd_plan)

    verify = sub.add_parser("verify", parents=[common],
                            help="check plans against their maps with the independent oracle")
    verify.add_argument("maps", help="maps batch file (refplan.maps/1) the plans were made for ('-': stdin)")
    verify.add_argument("plans",
                        help="plans file (refplan.plans/1), or one bare plan dict for a one-parameter maps file "
                             "('-': stdin)")
    verify.add_argument("--json", action="store_true", help="machine-readable report (every parameter)")
    verify.add_argument("--junit", metavar="FILE", type=output_file_name,
                        help="also write a JUnit XML report: one testcase per parameter, an invalid plan a failure "
                             "with the verdict's text, a map error an error, unverifiable skipped")
    verify.add_argument("--all", action="store_true",
                        help="list every parameter that is not ok (default: the first 20) and, under each invalid "
                             "one, every other segment that is wrong on its own (at most 20 per parameter, judging "
                             "its first 10 000 segments one by one); an address written twice or never is reported "
                             "by the parameter's verdict, first found")
    streaming = verify.add_mutually_exclusive_group()
    streaming.add_argument("--stream", dest="stream", action="store_const", const=True, default=None,
                           help="read the plans file one parameter at a time (default: only from "
                                f"{STREAM_PLANS_BYTES >> 20} MiB on)")
    streaming.add_argument("--no-stream", dest="stream", action="store_const", const=False,
                           help="read the whole plans file at once, whatever its size")
    verify.set_defaults(func=_cmd_verify)

    demo = sub.add_parser("demo", parents=[common], help="plan a built-in TPxDP -> TP sync with two policies")
    demo.set_defaults(func=_cmd_demo)

    for name, module, add_arguments, run, help_text in _OPTIONAL:
        _optional_command(sub, common, name, module, add_arguments, run, help_text, load=name == command)
    return parser


_OPTIONAL = (
    ("sync", "refplan.cli.sync", "add_sync_arguments", "run_sync_cli",
     "run a real sync over torch.distributed on this machine and check every byte"),
    ("conformance", "refplan.conformance.runner", "add_conformance_arguments", "run_conformance_cli",
     "run the conformance corpus against a planner"),
    ("show", "refplan.cli.show", "add_show_arguments", "run_show_cli",
     "per-process load table and an SVG picture of a plan"),
    ("bench", "refplan.cli.bench", "add_bench_arguments", "run_bench_cli",
     "plan named scenarios side by side and print ratios"),
)


def _optional_command(
    sub: Any, common: argparse.ArgumentParser, name: str, module: str, add_arguments: str, run: str,
    help_text: str, *, load: bool,
) -> None:
    """Register a sub-command whose module is imported only when that command runs.

    Keeps ``refplan plan`` fast and free of torch (``sync`` imports it); a command whose module
    is absent from this build is simply not offered.
    """
    import importlib
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return
    parser = sub.add_parser(name, help=help_text, parents=[common])
    if load:
        target = importlib.import_module(module)
        getattr(target, add_arguments)(parser)
        parser.set_defaults(func=getattr(target, run))


_EXTRAS = {"torch": "torch", "hypothesis": "hypothesis", "deepspeed": "peers", "matplotlib": "png",
           "cairosvg": "png"}
"""A module an optional feature imports -> the extra that installs it."""


def _one_line(text: str) -> str:
    """``text`` with every line break escaped, so an error is exactly one line whatever it quotes."""
    return "\\n".join(text.splitlines())


def main(argv: Sequence[str] | None = None) -> int:
    with escaping_unencodable():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    try:
        args = _parser(command).parse_args(words)
    except KeyboardInterrupt:  # Ctrl-C while the parser is built (it imports the sub-commands' modules)
        print(f"refplan{'' if command is None else ' ' + command}: interrupted", file=sys.stderr)
        return 130
    args.argv = words  # the command line as given, for a report that says how it was made (bench)
    try:
        code: int = args.func(args)
    except ModuleNotFoundError as exc:  # an optional dependency (torch for sync) is not installed
        missing = (exc.name or "").split(".")[0]
        if missing not in _EXTRAS:
            raise
        print(f"refplan {args.command}: needs {missing}, which is not installed "
              f"(pip install 'refplan[{_EXTRAS[missing]}]')", file=sys.stderr)
        return 2
    except AffineTransferError as exc:
        print(_one_line(f"refplan {args.command}: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`: not an error of ours (verify keeps its verdict's code)
        stdout_gone()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's code for SIGINT, not a traceback
        print(f"refplan {args.command}: interrupted", file=sys.stderr)
        return 130
    except _CannotWrite as exc:
        print(_one_line(f"refplan {args.command}: {exc}"), file=sys.stderr)
        return 2
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
