"""Where the whole call's CPU goes, by library and symbol, beside raw, its floor and its transport
alone (issue 26, item 8a).

Four gloo processes run, interleaved in one launch and each after a barrier, the order reversing
every run: raw ``all_to_all_single`` of the same per-pair bytes (``raw``), the executor's own schedule
replayed bare (``floor``: ``refplan.cli.bench._floor``), the executor's transport alone on the
schedule of its warm call (``move``: ``transport._move``) and the warm call (``exec``), on the
``--sync`` bench's 272.6 MiB batch (``refplan.cli.bench.WHOLE_LAYOUT``). ``perf record`` samples the
four processes meanwhile; each process logs the ``CLOCK_MONOTONIC`` window of each of its calls,
and each sample is charged to the kind whose window (in its own process) holds it. Prints, per
call and summed over the processes: CPU of the senders and the receivers (and of their callers'
threads), CPU by shared library, and the symbols whose CPU grows most from one kind to the next.

Why interleaved and sampled rather than timed: this machine's CPU per call drifts by ~10 % from
one launch to the next, more than the differences looked for; within one launch the kinds share
the drift, and a sample says which library (the interpreter, torch's bindings, its kernels, the
kernel's socket copies) the extra CPU is spent in, which ``time.process_time`` cannot.

Needs ``perf`` allowed to attach to this user's processes. A measuring aid for
docs/performance.md ("What the interpreter costs under load"), not a test: no target element is
checked here (the bench and ``scripts/whole_call_floor.py`` check them).

    .venv/bin/python scripts/whole_call_perf.py [--runs N] [--freq HZ] [--layers L]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

KINDS = ("raw", "floor", "move", "exec")

Window = tuple[float, float, str]  # (start, end, kind), CLOCK_MONOTONIC seconds


def _work(folder: str, runs: int, layers: int | None) -> Any:
    def work(rank: int, world: int) -> int:
        import torch
        import torch.distributed as dist

        from refplan.cli import bench
        from refplan.execute import execute_transfers, transport

        whole = bench._warm_whole_call(rank, layers)
        plans, apart, sources, expected, targets, dtypes, timeout = (
            whole.plans, whole.endpoints, whole.sources, whole.expected, whole.targets, whole.dtypes, whole.timeout)
        floor = bench._floor(plans, apart, sources, bench._blank_targets(expected, torch.bfloat16), dtypes)
        sends, receives, out_buf, in_buf = bench._raw_buffers(whole.stats, world)
        calls: dict[str, Callable[[], object]] = {
            "raw": lambda: dist.all_to_all_single(out_buf, in_buf, receives, sends),
            "floor": floor,
            "move": lambda: transport._move(whole.ctx, whole.sched, timeout),
            "exec": lambda: execute_transfers(plans, sources, targets, apart, dtypes=dtypes, timeout=timeout),
        }
        for kind in KINDS:  # each warm once before sampling starts
            dist.barrier()
            calls[kind]()
        Path(folder, f"ready_{rank}").write_text(str(os.getpid()))
        give_up = time.monotonic() + 120
        while not Path(folder, "go").exists():  # the parent attaches perf, then says go
            if time.monotonic() > give_up:
                raise RuntimeError("perf was never attached (no 'go' within 120 s)")
            time.sleep(0.05)
        time.sleep(1.0)
        dist.barrier()
        windows: list[Window] = []
        for run in range(runs):
            for kind in KINDS if run % 2 == 0 else KINDS[::-1]:
                dist.barrier()
                started = time.monotonic()
                calls[kind]()
                windows.append((started, time.monotonic(), kind))
        Path(folder, f"windows_{rank}.json").write_text(json.dumps({"pid": os.getpid(), "windows": windows}))
        return 0

    return work


def charge(lines: Iterable[str], windows: Mapping[int, tuple[int, Sequence[Window]]]) -> Counter[tuple[str, ...]]:
    """Samples per (kind, role, thread, library, symbol) from ``perf script -F pid,tid,time,ip,sym,dso``
    lines; ``windows``: process id -> (rank, its calls' windows sorted by start). A sample outside
    every window of its process (barriers, waits between calls) is not charged. Role: ``S`` for
    the senders (ranks 0 and 1), ``R`` for the receivers; thread: ``main`` (the caller's) or ``other``;
    symbol: its first word (C++ signatures are cut at their first space)."""
    starts = {pid: [w[0] for w in ws] for pid, (_rank, ws) in windows.items()}
    out: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        parts = line.split()
        if len(parts) < 3 or "/" not in parts[0]:
            continue
        pid_text, tid_text = parts[0].split("/", 1)
        try:
            pid, tid, when = int(pid_text), int(tid_text), float(parts[1].rstrip(":"))
        except ValueError:
            continue
        if pid not in windows:
            continue
        rank, ws = windows[pid]
        i = bisect.bisect_right(starts[pid], when) - 1
        if i < 0 or when > ws[i][1]:
            continue
        library = parts[-1].strip("()").rsplit("/", 1)[-1] if len(parts) > 3 else "?"
        symbol = parts[3] if len(parts) > 4 else "?"
        out[(ws[i][2], "S" if rank < 2 else "R", "main" if pid == tid else "other", library, symbol)] += 1
    return out


def report(samples: Counter[tuple[str, ...]], runs: int, freq: int) -> list[str]:
    """The printed summary: milliseconds of CPU per call, summed over the processes."""
    def ms(count: float) -> float:
        return count / freq / runs * 1e3

    def total(**match: str) -> float:
        keys = ("kind", "role", "thread", "library", "symbol")
        return ms(sum(n for key, n in samples.items()
                      if all(key[keys.index(k)] == v for k, v in match.items())))

    lines = ["CPU per call, summed over the processes (ms): senders (their callers' threads), receivers (...), all"]
    for kind in KINDS:
        lines.append(
            f"  {kind:<5} senders {total(kind=kind, role='S'):6.1f} ({total(kind=kind, role='S', thread='main'):5.1f})"
            f"  receivers {total(kind=kind, role='R'):6.1f} ({total(kind=kind, role='R', thread='main'):5.1f})"
            f"  all {total(kind=kind):6.1f}"
        )
    libraries = Counter[str]()
    for key, n in samples.items():
        if key[0] == "exec":
            libraries[key[3]] += n
    lines.append("by library:" + " " * 25 + "".join(f"{kind:>8}" for kind in KINDS))
    for library, _n in libraries.most_common(8):
        lines.append(f"  {library[:34]:<34}" + "".join(f"{total(kind=k, library=library):8.2f}" for k in KINDS))
    by_symbol: dict[str, Counter[tuple[str, str]]] = {kind: Counter() for kind in KINDS}
    for key, n in samples.items():
        by_symbol[key[0]][(key[3], key[4])] += n
    for before, after in itertools.pairwise(KINDS):
        grown = sorted(set(by_symbol[before]) | set(by_symbol[after]),
                       key=lambda s: by_symbol[before][s] - by_symbol[after][s])[:10]
        lines.append(f"grown most from {before} to {after}:")
        for library, symbol in grown:
            lines.append(f"  {ms(by_symbol[after][(library, symbol)] - by_symbol[before][(library, symbol)]):+6.2f}"
                         f"  {symbol[:50]:<50} {library[:30]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--freq", type=int, default=1999, help="perf's samples per second")
    parser.add_argument("--layers", type=int, default=None, help="the model at this many layers (10: the bench's)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        from refplan.cli.sync import run_ranks

        outcomes = run_ranks(_work(args.worker, args.runs, args.layers), 4, backend="gloo",
                             timeout=timedelta(seconds=600))
        for o in outcomes:
            if not o.ok:
                print(f"process {o.rank} failed: {(o.error or '').splitlines()[0]}")
        return 0 if all(o.ok for o in outcomes) else 1
    perf = shutil.which("perf")
    if perf is None:
        print("whole_call_perf: needs Linux perf on PATH")
        return 2
    folder = tempfile.mkdtemp(prefix="refplan-perf-")
    command = [sys.executable, __file__, "--worker", folder, "--runs", str(args.runs)]
    if args.layers is not None:
        command += ["--layers", str(args.layers)]
    worker = subprocess.Popen(command)
    pids: list[str] = []
    while len(pids) < 4:
        if worker.poll() is not None:
            print("whole_call_perf: the processes ended before sampling could start")
            return 1
        pids = [p.read_text() for p in sorted(Path(folder).glob("ready_*"))]
        time.sleep(0.1)
    data = str(Path(folder, "perf.data"))
    recorder = subprocess.Popen([perf, "record", "-F", str(args.freq), "-k", "CLOCK_MONOTONIC", "-o", data,
                                 "-p", ",".join(pids)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    Path(folder, "go").write_text("")
    code = worker.wait()
    recorder.send_signal(signal.SIGINT)
    recorder.wait()
    if code != 0:
        return 1
    windows: dict[int, tuple[int, list[Window]]] = {}
    for rank in range(4):
        logged = json.loads(Path(folder, f"windows_{rank}.json").read_text())
        windows[int(logged["pid"])] = (rank, sorted((float(a), float(b), str(k)) for a, b, k in logged["windows"]))
    script = subprocess.run([perf, "script", "-i", data, "-F", "pid,tid,time,ip,sym,dso"],
                            capture_output=True, text=True, check=False)
    samples = charge(script.stdout.splitlines(), windows)
    if not samples:
        print(f"whole_call_perf: no sample fell in a call's window (perf: {script.stderr.strip()[:200]})")
        return 1
    print("\n".join(report(samples, args.runs, args.freq)))
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
