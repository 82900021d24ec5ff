"""``refplan sync``: a real multi-process sync on this machine, checked element by element.

Why it exists: the planner and the oracle reason about boxes; only moving real bytes between real
processes shows that the executor's protocol (verdict exchange, rounds, staging, rank
translation) delivers every element. Each process loads the model and plans for itself — the
planner is deterministic, so the executor's schedule digest must agree across processes, which
exercises that check for real rather than handing every process one pickled plan.

Data are *markers*: logical element ``k`` of a parameter holds a bit pattern derived from ``k``
(``marker_bits``), so equal bits mean "the right element landed here" for every dtype, including
bfloat16 where integer values would repeat. Sources are cut from the markers through the source
map, expected targets through the target map (``refplan.simulate.extract_shards``), and every
target element is compared bit for bit.

Processes are started with ``fork`` around a ``TCPStore`` hosted by the parent on an ephemeral
port (about 0.15 s for four processes, against seconds for ``spawn``); CUDA cannot survive a fork,
so the NCCL backend uses ``spawn``. Children wait on a gate until every fork is done, so no child
connects to the store while the parent is still forking. ``run_ranks`` is the reusable launcher
(the tests use it too).

Exit codes: 0 every target element exact, 1 a mismatch or a failure while moving, 2 bad input or
a transfer rejected before anything moved.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .._progress import Progress
from ..box import volume
from ..errors import AffineTransferError, InvalidMapError, describe_exception
from ..limits import MAX_TIMEOUT
from ..maps import ParamAffineMap
from ..policies import POLICIES
from ..requests import TransferEndpoints

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    import torch

__all__ = [
    "DTYPES",
    "RankOutcome",
    "SyncConfig",
    "add_sync_arguments",
    "bits_of",
    "colocated_endpoints",
    "marker_bits",
    "restrict",
    "run_ranks",
    "run_sync_cli",
    "tensor_from_bits",
]

DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8")
"""Dtype names ``--dtype`` accepts (attributes of ``torch``)."""

# Exponent and mantissa widths of the float formats: markers are positive normal numbers.
_FLOAT_FIELDS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
_SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

Array = np.ndarray[Any, Any]


# ---------------------------------------------------------------------------------------------
# Markers and bit views.


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _mix(k: Array) -> Array:
    """splitmix64 finalizer: scatters indices so a wrapped marker range has no short period."""
    z = k + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: Array = z ^ (z >> np.uint64(31))
    return out


def marker_bits(shape: Sequence[int], dtype: torch.dtype) -> Array:
    """Bit patterns (signed ints of the dtype's width) that mark each logical element of F.

    Floats get positive *normal* numbers (exponent field ≥ 1, below all-ones), so no NaN, infinity
    or denormal can be altered by a copy; integers get their index modulo the type's range. While
    F has no more elements than the format has such values, element ``k`` gets the ``k``-th one,
    so every marker is unique; beyond that, a scrambled index picks one (rarely repeated, never
    periodic). The all-ones pattern (``-1``) is never a float marker, which makes it a sentinel
    that cannot be mistaken for data.
    """
    name = _dtype_name(dtype)
    width = dtype.itemsize
    n = volume(tuple(shape))
    k = np.arange(n, dtype=np.uint64)
    if name in _FLOAT_FIELDS:
        exp_bits, man_bits = _FLOAT_FIELDS[name]
        span = ((1 << exp_bits) - 2) << man_bits
        index = k if n <= span else _mix(k) % np.uint64(span)
        bits = index + np.uint64(1 << man_bits)
    elif name in DTYPES:
        span = 1 << (8 * width)
        bits = k if n <= span or width == 8 else _mix(k) % np.uint64(span)
    else:
        raise ValueError(f"no markers for dtype {dtype}")
    with np.errstate(over="ignore"):
        out: Array = bits.astype(_UNSIGNED[width]).view(_SIGNED[width]).reshape(tuple(shape))
    return out


def tensor_from_bits(bits: Array, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A tensor of ``dtype`` holding exactly these bit patterns (no value conversion)."""
    import torch

    raw = np.ascontiguousarray(bits).view(_SIGNED[dtype.itemsize])
    return torch.from_numpy(raw.copy()).view(dtype).to(device)


def bits_of(tensor: torch.Tensor) -> Array:
    """The bit patterns of a tensor as signed ints of its width (for exact comparison)."""
    import torch

    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(ints).cpu().numpy()


def restrict(param_map: ParamAffineMap, locations: Sequence[int]) -> ParamAffineMap | None:
    """The part of a map held by ``locations`` (None when it holds nothing there).

    A process only needs its own shards; extracting the others would multiply the work by the
    number of processes.
    """
    keep = [loc for loc in param_map.ranks if loc in set(locations)]
    if not keep:
        return None
    return ParamAffineMap(
        param_map.logical_shape,
        {loc: param_map.shard_shapes[loc] for loc in keep if loc in param_map.shard_shapes},
        {loc: param_map.pieces_by_rank.get(loc, ()) for loc in keep},
    )


# ---------------------------------------------------------------------------------------------
# The launcher.


@dataclass(frozen=True)
class RankOutcome:
    """What one process returned, or the error it ended with (``error_type`` is the class name)."""

    rank: int
    value: Any = None
    error: str | None = None
    error_type: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its launcher dies (Linux; elsewhere nothing).

    Why: the launcher hosts the group's store, and a child forked from it inherits the store's
    listening socket, so once the launcher is gone a child's next store request connects and is
    never answered. Killed by SIGTERM (``timeout``, a job scheduler) or SIGKILL, the launcher left
    both children of a 2-process ``refplan sync --timeout 5`` blocked in ``TCPStore.clone`` for
    over 90 s, holding the output pipe open (an outside probe, 2026-12-06). ``parent`` is the
    launcher's pid: one that died before the signal was armed is seen by ``getppid``. Armed only
    for the ``fork`` and ``spawn`` start methods, whose children are the launcher's own; a
    ``forkserver`` child's parent is the server, which would kill it at once.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # no prctl to call: the launcher's own deadline still bounds the run
        return
    if os.getppid() != parent:
        os._exit(1)


def _rank_main(
    fn: Callable[[int, int], Any],
    rank: int,
    world: int,
    port: int,
    backend: str,
    timeout_s: float,
    threads: int,
    gate: Connection,
    report: Connection,
    quiet: bool = False,
    parent: int | None = None,
) -> None:
    """Body of one launched process: wait for the gate, join the group, run ``fn``, report, exit.

    Always ends with ``os._exit``: a forked child must never return into the parent's code (a
    test runner, a CLI), and a process group broken by a timeout must not block interpreter exit.
    ``threads`` is 1 for a forked child: GNU OpenMP is not fork-safe, and a child forked from a
    parent that has run a parallel torch op hangs in its first parallel region (seen here).
    ``quiet`` sends the child's stderr to the null device: the CLI reports each process in one
    line from its outcome, and torch's own warnings from a broken group would add many more.
    """
    outcome: RankOutcome
    if parent is not None:
        _die_with_parent(parent)
    if quiet:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported, not in __all__

        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)})
        gate.recv()
        timeout = timedelta(seconds=timeout_s)
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        outcome = RankOutcome(rank, fn(rank, world))
    except BaseException as exc:
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        outcome = RankOutcome(rank, None, f"{type(exc).__name__}: {exc}\n{detail}", type(exc).__name__)
    try:
        report.send(outcome)
    except Exception as exc:  # an unpicklable value must still report something
        report.send(RankOutcome(rank, None, f"cannot report result: {type(exc).__name__}: {exc}", "ReportError"))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _main_thread(pid: int | None) -> tuple[bool, int | None]:
    """Whether the process is stopped by a signal or a tracer, and the user plus system CPU time
    of its main thread in clock ticks, from one read of Linux's ``/proc`` (elsewhere: not
    stopped, and None, and the launcher then reads a process that has not reported as idle). The
    main thread's time alone: torch's background threads (the store's, the process group's) tick
    now and then in a process whose work is hung, which read as work. A signal stops every
    thread, so the main thread's state is the process's."""
    if pid is None:
        return False, None
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return False, None
    stopped = bool(fields) and fields[0] in ("T", "t")
    try:
        return stopped, int(fields[11]) + int(fields[12])  # utime and stime, fields 14 and 15 of stat(5)
    except (ValueError, IndexError):
        return stopped, None


def run_ranks(
    fn: Callable[[int, int], Any],
    nproc: int,
    *,
    backend: str = "gloo",
    timeout: timedelta = timedelta(seconds=60),
    deadline_s: float | None = None,
    start_method: str | None = None,
    grace_s: float = 3.0,
    quiet: bool = False,
) -> list[RankOutcome]:
    """Run ``fn(rank, world)`` in ``nproc`` fresh processes joined in one process group.

    The parent hosts the ``TCPStore`` on 127.0.0.1 (ephemeral port); ``timeout`` is the process
    group's and the store's timeout. The parent waits on every report pipe *and* every process's
    sentinel, so a process that dies without reporting (killed, ``os._exit``) is reported as
    ``Died`` at once rather than after the deadline; the parent also closes its own copies of
    the pipes' write ends, so a dead writer reads as end-of-file. Once a process has died the
    others get ``grace_s`` to report (their group is broken; most fail fast) before they are
    killed and reported as ``Stopped``. The parent waits at most ``deadline_s`` (default: twice
    the timeout plus a minute) in all, then kills what it started and reports it as ``Timeout``,
    so a hang can never outlive the launcher. With ``fork`` (the default for gloo) ``fn`` may be
    a closure; ``spawn`` (the default for NCCL, since CUDA does not survive a fork) needs a
    picklable ``fn``. ``quiet`` silences the children's stderr.
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported, not in __all__

    method = start_method or ("spawn" if backend == "nccl" else "fork")
    ctx: Any = mp.get_context(method)  # Fork- or SpawnContext; the base class lacks Process
    threads = 1 if method == "fork" else max(1, (os.cpu_count() or 1) // nproc)
    store = TCPStore(
        "127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False, timeout=timeout
    )
    gates = [ctx.Pipe(duplex=False) for _ in range(nproc)]
    reports = [ctx.Pipe(duplex=False) for _ in range(nproc)]
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                fn, rank, nproc, store.port, backend, timeout.total_seconds(), threads, gates[rank][0],
                reports[rank][1], quiet, os.getpid() if method in ("fork", "spawn") else None,
            ),
            daemon=True,
        )
        for rank in range(nproc)
    ]
    for proc in procs:
        proc.start()
    for reader, writer in gates:
        reader.close()
        writer.send(True)
        writer.close()
    for _reader, writer in reports:
        writer.close()
    limit = deadline_s if deadline_s is not None else 2 * timeout.total_seconds() + 60
    end = time.monotonic() + limit
    outcomes: dict[int, RankOutcome] = {}
    pending = {rank: (reports[rank][0], procs[rank]) for rank in range(nproc)}
    first_death: float | None = None
    # The first process to report a failure: every other one is then waiting on a broken job,
    # and each of its waits ends within the group's timeout (a dead or stuck peer makes them all
    # fail, and the executor's outcome agreement tells the rest early). A process that still has
    # not reported one timeout (and ``grace_s``) later, and has used no CPU time for as long, is
    # stuck itself (waiting on what will not come, hung in a native call); one suspended by
    # a signal or a debugger is stopped after the grace alone. One still computing (its own local
    # work can outlast the timeout) is left to the deadline. Before, the launcher waited for a
    # stuck one to the whole deadline, twice the timeout plus a minute, though the job's failure
    # was known a timeout earlier.
    first_failure: tuple[float, int] | None = None
    suspended: dict[int, float] = {}
    busy: dict[int, tuple[int | None, float]] = {}  # CPU ticks last seen, and when they last moved

    def take(rank: int) -> None:
        reader, proc = pending.pop(rank)
        try:
            outcomes[rank] = reader.recv()
        except (EOFError, OSError):
            proc.join(1)
            outcomes[rank] = RankOutcome(rank, None, f"exited ({proc.exitcode}) without reporting", "Died")

    while pending:
        stop = end if first_death is None else min(end, first_death + grace_s)
        if first_failure is not None:
            now = time.monotonic()
            patience = first_failure[0] + timeout.total_seconds() + grace_s
            for rank in sorted(pending):  # a suspended process does no work: it gets the grace only
                proc = pending[rank][1]
                stopped, ticks = _main_thread(proc.pid)
                seen = busy.get(rank)
                if seen is None or ticks is None or ticks != seen[0]:
                    busy[rank] = (ticks, now if seen is not None and ticks is not None else first_failure[0])
                if stopped:
                    since = suspended.setdefault(rank, now)
                    if now - since >= grace_s:
                        pending.pop(rank)
                        proc.kill()  # a stopped process never exits by itself: not waited for below
                        outcomes[rank] = RankOutcome(
                            rank, None, f"stopped: suspended (SIGSTOP or a debugger) with no report {grace_s:.0f} s "
                            f"after process {first_failure[1]} failed", "Stopped")
                    continue
                suspended.pop(rank, None)
                # Idle for a whole timeout (and the grace): any wait of its own would have ended by
                # then, so it is stuck; a shorter idle stretch (a sleep, some I/O) is no proof. A
                # report already in its pipe is taken below, never thrown away.
                idle = now - busy[rank][1] >= timeout.total_seconds() + grace_s
                if now >= patience and idle and not pending[rank][0].poll(0):
                    pending.pop(rank)
                    proc.kill()
                    outcomes[rank] = RankOutcome(
                        rank, None, f"stopped: no report {now - first_failure[0]:.0f} s after process "
                        f"{first_failure[1]} failed, and no CPU time used for "
                        f"{timeout.total_seconds() + grace_s:.0f} s (waiting on what will not come, or hung)",
                        "Stopped")
            if not pending:
                break
        left = stop - time.monotonic()
        if left <= 0:
            break
        by_object: dict[Any, int] = {}
        for rank, (reader, proc) in pending.items():
            by_object[reader] = rank
            by_object[proc.sentinel] = rank
        # At most an hour a wait: select() takes its timeout in milliseconds as a C int, and the
        # deadline of a long --timeout (twice it, plus a minute) does not fit one.
        for ready in wait(list(by_object), timeout=min(left, 3600.0 if first_failure is None else 0.25)):
            rank = by_object[ready]
            if rank not in pending:
                continue
            reader, proc = pending[rank]
            if ready is reader or reader.poll(0):
                take(rank)
            elif not proc.is_alive():  # died, and nothing left in its pipe
                pending.pop(rank)
                proc.join(1)
                outcomes[rank] = RankOutcome(rank, None, f"exited ({proc.exitcode}) without reporting", "Died")
            if outcomes.get(rank) is not None and outcomes[rank].error_type == "Died" and first_death is None:
                first_death = time.monotonic()
            if outcomes.get(rank) is not None and not outcomes[rank].ok and first_failure is None:
                first_failure = (time.monotonic(), rank)
    for rank in sorted(pending):
        if first_death is not None:
            dead = sorted(r for r, o in outcomes.items() if o.error_type == "Died")
            outcomes[rank] = RankOutcome(
                rank, None, f"stopped {grace_s:.0f} s after process {dead[0]} died", "Stopped"
            )
        else:
            outcomes[rank] = RankOutcome(rank, None, f"no report within {limit:.0f} s", "Timeout")
    for proc in procs:
        proc.join(timeout=0 if pending else 5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    for reader, _writer in reports:
        reader.close()
    del store
    return [outcomes[rank] for rank in range(nproc)]


# ---------------------------------------------------------------------------------------------
# The sync itself.


@dataclass(frozen=True)
class SyncConfig:
    """Everything a process needs to load, plan and check its part of the sync."""

    model: str = "demo"
    nproc: int = 4
    backend: str = "gloo"
    policy: str = "balanced"
    dtype: str = "bfloat16"
    budget_bytes: int = 8 << 20
    endpoints: str = "auto"
    timeout_s: float = 120.0


def _load_model(model: str) -> tuple[dict[str, tuple[ParamAffineMap, ParamAffineMap]], TransferEndpoints | None]:
    if model == "demo":
        from .demo import demo_batch

        pairs, endpoints, _sizes = demo_batch()
        return pairs, endpoints
    from ..files import read_maps

    batch = read_maps(model)
    return batch.pairs, batch.endpoints


def colocated_endpoints(
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]], nproc: int
) -> TransferEndpoints:
    """Source location i → process i mod nproc, target location j → process j mod nproc.

    The in-place layout (trainer and engine on the same processes, e.g. ZeRO-2 TP×DP → TP), used
    when a model's own endpoints need more processes than were asked for.
    """
    sources = sorted({loc for target, source in pairs.values() for loc in source.ranks})
    targets = sorted({loc for target, source in pairs.values() for loc in target.ranks})
    return TransferEndpoints({loc: loc % nproc for loc in sources}, {loc: loc % nproc for loc in targets})


def _bind(
    pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]],
    model_endpoints: TransferEndpoints | None,
    mode: str,
    nproc: int,
) -> tuple[TransferEndpoints, str]:
    fits = model_endpoints is not None and all(
        0 <= p < nproc for p in (*model_endpoints.source.values(), *model_endpoints.target.values())
    )
    if mode == "model" or (mode == "auto" and fits):
        if model_endpoints is None:
            raise InvalidMapError("--endpoints model: the model defines no endpoints (its maps file has no "
                                  "\"endpoints\"); use --endpoints colocated or auto")
        if not fits:
            raise InvalidMapError(f"--endpoints model: the model's endpoints {model_endpoints.to_dict()} need "
                                  f"processes outside 0..{nproc - 1}")
        return model_endpoints, "model"
    return colocated_endpoints(pairs, nproc), "colocated"


def _sync_rank(rank: int, world: int, cfg: SyncConfig) -> dict[str, Any]:
    """One process of ``refplan sync``: plan, fill markers, execute, compare every target bit."""
    import torch

    from ..execute import StagingBudget, execute_transfers
    from ..planner import plan_transfers
    from ..simulate import extract_shards

    dtype = getattr(torch, cfg.dtype)
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.backend == "nccl" else torch.device("cpu")
    pairs, model_endpoints = _load_model(cfg.model)
    endpoints, _how = _bind(pairs, model_endpoints, cfg.endpoints, world)
    started = time.perf_counter()
    plans = plan_transfers(
        pairs,
        endpoints=endpoints,
        element_size=dict.fromkeys(pairs, dtype.itemsize),
        replica_policy=POLICIES[cfg.policy],
    )
    plan_seconds = time.perf_counter() - started
    mine_src = [loc for loc, p in endpoints.source.items() if p == rank]
    mine_tgt = [loc for loc, p in endpoints.target.items() if p == rank]
    sources: dict[str, dict[int, torch.Tensor]] = {}
    targets: dict[str, dict[int, torch.Tensor]] = {}
    expected: dict[str, dict[int, Array]] = {}
    for name, (target_map, source_map) in sorted(pairs.items()):
        src_part = restrict(source_map, mine_src)
        tgt_part = restrict(target_map, mine_tgt)
        if src_part is None and tgt_part is None:
            continue
        full = marker_bits(target_map.logical_shape, dtype)
        limit = 4 * full.size + (1 << 24)
        if src_part is not None:
            shards = extract_shards(src_part, full, max_elements=limit)
            sources[name] = {loc: tensor_from_bits(b, dtype, device) for loc, b in shards.items()}
        if tgt_part is not None:
            wanted = extract_shards(tgt_part, full, max_elements=limit)
            expected[name] = wanted
            targets[name] = {
                loc: tensor_from_bits(np.full(b.shape, -1, dtype=b.dtype), dtype, device) for loc, b in wanted.items()
            }
    stats = execute_transfers(
        plans,
        sources,
        targets,
        endpoints,
        dtypes=dict.fromkeys(plans, dtype),
        budget=StagingBudget(cfg.budget_bytes),
        timeout=timedelta(seconds=cfg.timeout_s),
    )
    checked = mismatched = 0
    first: str | None = None
    for name, per_loc in sorted(expected.items()):
        for loc, want in sorted(per_loc.items()):
            got = bits_of(targets[name][loc])
            bad = np.flatnonzero(got != want)
            checked += want.size
            mismatched += int(bad.size)
            if bad.size and first is None:
                first = f"parameter {name!r} target location {loc} element {int(bad[0])}"
    return {
        "rank": rank,
        "plan_seconds": plan_seconds,
        "segments": stats.segments,
        "chunks": stats.chunks,
        "rounds": stats.rounds,
        "local_copy_bytes": stats.local_copy_bytes,
        "sent_bytes": dict(stats.sent_bytes),
        "received_bytes": dict(stats.received_bytes),
        "seconds": stats.seconds,
        "move_seconds": stats.move_seconds,
        "checked": checked,
        "mismatched": mismatched,
        "first_mismatch": first,
    }


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def add_sync_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``refplan sync`` (the CLI wires this into its ``sync`` sub-command)."""
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes to launch on this machine (default 4; under torchrun: the job's size)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo: CPU tensors; nccl: CUDA")
    parser.add_argument("--model", default="demo", help="'demo' (built-in TPxDP -> TP batch) or a maps JSON file")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="balanced",
                        help="replica policy (default balanced; see refplan plan --help)")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="element type moved (default bfloat16)")
    parser.add_argument("--budget-bytes", type=int, default=8 << 20, help="staging bytes per peer (default 8 MiB)")
    parser.add_argument(
        "--endpoints",
        choices=("auto", "model", "colocated"),
        default="auto",
        help="model: the model's own bindings; colocated: location i on process i mod nproc; "
        "auto: model's if they fit in --nproc, else colocated",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a stuck exchange fails")


def job_rank() -> tuple[int, int] | None:
    """(rank, world size) when this process was started by torchrun (or any env:// launcher).

    torchrun sets ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` for each process it starts; then
    ``refplan sync`` is one process of that job and must not start processes of its own.
    ``InvalidMapError`` when those three are set but unusable (a rank outside the world, values
    that are not ints, no ``MASTER_PORT``): before, such an environment was read as "no job", and
    under a broken launcher every process of the job forked a whole sync of its own.
    """
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        return None
    named = f"RANK={env['RANK']!r}, WORLD_SIZE={env['WORLD_SIZE']!r}"
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except ValueError:
        raise InvalidMapError(f"the torchrun environment is unusable: {named} must be ints") from None
    if not 0 <= rank < world:
        raise InvalidMapError(f"the torchrun environment is unusable: {named}: the rank is outside the world")
    if not env.get("MASTER_PORT"):
        raise InvalidMapError("the torchrun environment is unusable: MASTER_ADDR is set but MASTER_PORT is not")
    return rank, world


MIN_SYNC_TIMEOUT_S = 1.0
"""``refplan sync --timeout`` is also the store's and the process group's: below a second no process
can even join (the executor itself takes down to ``limits.MIN_TIMEOUT``)."""


def max_nproc() -> int:
    """The most processes ``refplan sync`` launches on this machine: 8 a core, and at least 64.
    Beyond that a typo (``--nproc 500``) forks hundreds of processes, or fails on open files."""
    return max(64, 8 * (os.cpu_count() or 1))


def _config(args: argparse.Namespace, world: int | None = None) -> SyncConfig:
    asked = getattr(args, "nproc", None)
    if world is not None and asked is not None and int(asked) != world:
        raise InvalidMapError(f"--nproc {asked} disagrees with the torchrun job's WORLD_SIZE={world}")
    cfg = SyncConfig(
        model=str(args.model),
        nproc=world if world is not None else (4 if asked is None else int(asked)),
        backend=str(args.backend),
        policy=str(args.policy),
        dtype=str(args.dtype),
        budget_bytes=int(args.budget_bytes),
        endpoints=str(getattr(args, "endpoints", "auto")),
        timeout_s=float(getattr(args, "timeout", 120.0)),
    )
    if cfg.nproc < 1:
        raise InvalidMapError(f"--nproc must be at least 1, got {cfg.nproc}")
    if world is None and cfg.nproc > max_nproc():
        raise InvalidMapError(
            f"--nproc {cfg.nproc} is more than this machine runs ({max_nproc()}: 8 a core, at least 64); "
            "a larger job is a torchrun job (refplan sync is then one process of it)"
        )
    if cfg.budget_bytes < 1:
        raise InvalidMapError(f"--budget-bytes must be positive, got {cfg.budget_bytes}")
    _check_timeout(cfg.timeout_s)
    if cfg.dtype not in DTYPES or cfg.policy not in POLICIES:
        raise InvalidMapError(f"unknown dtype {cfg.dtype!r} or policy {cfg.policy!r}")
    return cfg


def _check_timeout(seconds: float) -> None:
    """``--timeout`` from ``MIN_SYNC_TIMEOUT_S`` to ``MAX_TIMEOUT``, checked before anything is
    launched: the same value is the store's and the process group's timeout, and before this
    check ``inf`` or ``1e12`` failed inside the launch (an ``OverflowError`` reported as "cannot
    launch"), ``nan`` as a ``ValueError``, ``1e-4`` launched every process only for each call to
    be refused there, and ``0.001`` (the executor's least) could never join the store."""
    low, high = MIN_SYNC_TIMEOUT_S, MAX_TIMEOUT.total_seconds()
    if not low <= seconds <= high:  # also false for nan
        raise InvalidMapError(f"--timeout must be from {low:g} to {high:g} seconds (365 days), got {seconds}")


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "(no message)"


_describe = describe_exception


def _job_address() -> str:
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def _quiet_torch_logs() -> None:
    """Keep torch's C++ log below errors that end the process anyway, unless the caller set it.

    Why: a join that fails made c10d log each retry with the C++ exception's whole backtrace,
    about 20 lines of stack frames per attempt on stderr, before refplan's own one line; the
    command promises one line per failure. The level is read when torch loads, so this runs
    before the command imports it; a launched process inherits it. ``TORCH_CPP_LOG_LEVEL`` set
    by the caller (``INFO`` to debug a job) is kept, and so is ``-v``'s view: everything."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


@contextlib.contextmanager
def _join_deadline(rank: int, seconds: float, refusal: str | None = None) -> Iterator[None]:
    """End this process, with one line, if joining the job takes more than ``seconds`` (and 2 s).

    Why: torch's store client does not hold to the timeout it is given. A program other than the
    job's store listening on ``MASTER_PORT`` kept a process waiting as long as it listened, and
    with nothing listening the join took about three times ``--timeout`` (its retries), where the
    timeout is documented to end every wait. Only the command line runs this: it is the one
    place where ending the process is the caller's wish. A process that joins only to tell the
    others it refused its input (``refusal``) ends as bad input, exit 2, its one line saying both.
    """
    joined = threading.Event()

    def give_up() -> None:
        if not joined.is_set():
            failed = f"could not join the job at {_job_address()} within {seconds:g} s"
            print(f"refplan sync: process {rank}: " + (failed if refusal is None else
                  f"bad input: {refusal}; and {failed} to tell the others"), file=sys.stderr, flush=True)
            os._exit(1 if refusal is None else 2)

    timer = threading.Timer(seconds + 2.0, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        joined.set()
        timer.cancel()


def _run_in_job(cfg: SyncConfig, rank: int, world: int, refusal: str | None = None
                ) -> tuple[RankOutcome, list[RankOutcome] | None]:
    """This process's part of a torchrun job: its own outcome and, on rank 0, every process's.

    The process group comes from the job's environment (``env://``); a group the caller already
    initialized is used as it is and left open. ``refusal`` is what this process refused of its
    own input: it still joins, so that the processes first agree whether every one of them can
    start. Before, a process refusing a file missing on its node only exited; its peers waited
    for it until their timeout, and rank 0 reported "the process group did not start" with the
    cause printed on another node only. Now no process starts when one refuses, every process
    exits 2, and rank 0 names each refusal.
    """
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=cfg.timeout_s)
    mine: RankOutcome
    started_here = False
    try:
        if cfg.backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count()))))
        if not dist.is_initialized():
            try:
                with _join_deadline(rank, cfg.timeout_s, refusal):
                    dist.init_process_group(cfg.backend, timeout=timeout)
            except Exception as exc:
                # Rank 0 reports every process, but a process that never joined cannot reach it:
                # without this line its failure was printed by nobody.
                if rank != 0:
                    failed = f"could not join the job at {_job_address()}: {_first_line(_describe(exc))}"
                    print(f"refplan sync: process {rank}: " + (failed if refusal is None else
                          f"bad input: {refusal}; and {failed}"), file=sys.stderr, flush=True)
                raise
            started_here = True
        reasons: list[Any] = [None] * world
        try:
            dist.all_gather_object(reasons, refusal)
        finally:
            if refusal is not None and rank != 0:  # said on its own node too; rank 0 reports it for the job
                print(f"refplan sync: process {rank}: bad input: {refusal}", file=sys.stderr, flush=True)
        refusers = [r for r, text in enumerate(reasons) if text is not None]
        if refusal is not None:
            mine = RankOutcome(rank, None, refusal, "BadInput")
        elif refusers:
            mine = RankOutcome(rank, None, f"not started: processes {refusers} refused their input", "NotRun")
        else:
            mine = RankOutcome(rank, _sync_rank(rank, world, cfg))
    except Exception as exc:
        mine = (RankOutcome(rank, None, refusal, "BadInput") if refusal is not None
                else RankOutcome(rank, None, _describe(exc), type(exc).__name__))
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    try:
        if not dist.is_initialized():
            raise RuntimeError("the process group did not start")
        dist.gather_object(mine, gathered, dst=0)
    except Exception as exc:  # the group is broken: report what this process knows
        if rank == 0:
            gone = f"no report: the job's exchange failed ({_first_line(_describe(exc))})"
            gathered = [mine] + [RankOutcome(r, None, gone, "Died") for r in range(1, world)]
    finally:
        if started_here:
            with contextlib.suppress(Exception):  # a broken group may not tear down cleanly
                dist.destroy_process_group()
    if rank != 0 or gathered is None:
        return mine, None
    return mine, [
        o if isinstance(o, RankOutcome) else RankOutcome(r, None, "no report", "Died") for r, o in enumerate(gathered)
    ]


def run_sync_cli(args: argparse.Namespace) -> int:
    """``refplan sync``: launch (or join a torchrun job), move, check, report. Exit code 0, 1 or 2.

    Failures print exactly one line on stderr, naming each failed process and its error's first
    line; tracebacks stay out of it. Under torchrun every process returns its own exit code and
    only rank 0 prints.
    """
    try:
        job = job_rank()
    except InvalidMapError as exc:
        print(f"refplan sync: bad input: {_first_line(str(exc))}", file=sys.stderr, flush=True)
        return 2
    speaker = job is None or job[0] == 0
    if not getattr(args, "verbose", False):
        _quiet_torch_logs()

    def say(text: str, err: bool = False) -> None:
        if speaker:
            print(text, file=sys.stderr if err else sys.stdout, flush=True)

    def refuse(text: str) -> int:
        # Every process that refuses its own input says so: under torchrun a non-zero rank's
        # bad input (a file missing on its node) was printed by nobody, and rank 0 reported only
        # a store timeout. Such a line names its process.
        who = "" if job is None or job[0] == 0 else f"process {job[0]}: "
        print(f"refplan sync: {who}bad input: {text}", file=sys.stderr, flush=True)
        return 2

    try:
        cfg = _config(args, None if job is None else job[1])
    except AffineTransferError as exc:  # no backend or timeout to join the job with: said alone
        return refuse(_first_line(str(exc)))
    import torch

    wanted = 1 if job is not None else cfg.nproc
    if cfg.backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < wanted):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return refuse(f"--backend nccl needs {wanted} CUDA devices, found {count}")  # cannot join by NCCL
    refusal, pairs, how = _check_input(cfg, job)
    if refusal is not None and job is None:
        return refuse(refusal)
    quiet = bool(getattr(args, "quiet", False))
    if not quiet and refusal is None:  # -q: only the result (exact or not) and errors
        say(
            f"refplan sync: model {cfg.model} ({len(pairs)} parameters), {cfg.dtype}, policy {cfg.policy}, "
            f"{cfg.nproc} processes ({cfg.backend}{', torchrun' if job is not None else ''}), endpoints {how}, "
            f"budget {_size(cfg.budget_bytes)} per peer"
        )
    launched = time.perf_counter()
    if job is not None:
        mine, gathered = _run_in_job(cfg, job[0], job[1], refusal)
        if gathered is None:  # not rank 0: silent, and its exit code is its own outcome's
            return _own_code(mine)
        outcomes = gathered
    else:
        progress = Progress("refplan sync", quiet=quiet)  # a terminal only
        progress.status(f"starting {cfg.nproc} processes, planning and moving the batch ...")
        try:
            outcomes = run_ranks(
                partial(_sync_rank, cfg=cfg), cfg.nproc, backend=cfg.backend,
                timeout=timedelta(seconds=cfg.timeout_s), quiet=True,
            )
        except Exception as exc:
            print(f"refplan sync: cannot launch {cfg.nproc} processes: {_first_line(_describe(exc))}", file=sys.stderr)
            return 1
        finally:
            progress.close()
    return _report(outcomes, time.perf_counter() - launched, quiet)


# Bytes per logical element that building a parameter's markers holds at least at once: the
# uint64 index (8) and the bit patterns cast to the dtype's width (measured peaks, with tracemalloc:
# 12-26 bytes an element, by dtype). A floor, not the peak: the estimate must never refuse a
# model that fits.
_MARKER_FLOOR_BYTES = 8


def _available_memory() -> int | None:
    """Bytes this machine can still give without swapping (Linux's MemAvailable), else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _check_memory(pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]], endpoints: TransferEndpoints,
                  itemsize: int, ranks: Sequence[int]) -> str | None:
    """A refusal when the processes ``ranks`` of this machine cannot hold what the sync's check
    builds, else None.

    The check is the sync's, not the executor's: each process makes the markers of every
    parameter it touches (the whole logical tensor, one at a time) and keeps its source shards,
    its target shards and their expected values. Without this estimate a model of 2**40
    elements passed every check before the launch and each process then died of MemoryError
    (exit 1, "failed while moving"), although nothing about the transfer was wrong. The estimate
    is a floor of each process's peak, the larger of what it holds at the end (sources once,
    targets twice) and of its largest parameter's markers (``_MARKER_FLOOR_BYTES`` and the
    dtype's width an element), summed over this machine's processes: it refuses what cannot fit,
    never what might. One pass over the shards, whatever the number of processes.
    """
    available = _available_memory()
    if available is None:
        return None
    need = _memory_floor(pairs, endpoints, itemsize, ranks)
    if need <= available:
        return None
    count = f"{len(set(ranks))} processes" if len(set(ranks)) != 1 else "this process"
    return (f"the sync's element-by-element check needs at least {_size(need)} of memory for {count} on this "
            f"machine (the markers of each parameter's logical tensor, or the source shards, target shards and "
            f"expected values of each process), and {_size(available)} is available; sync a smaller model")


def _memory_floor(pairs: Mapping[str, tuple[ParamAffineMap, ParamAffineMap]], endpoints: TransferEndpoints,
                  itemsize: int, ranks: Sequence[int]) -> int:
    """``_check_memory``'s floor in bytes: per process the larger of what it holds at the end and
    of its largest parameter's markers, summed over ``ranks``."""
    wanted = set(ranks)
    held: dict[int, int] = dict.fromkeys(wanted, 0)
    largest: dict[int, int] = dict.fromkeys(wanted, 0)
    for name in pairs:
        target_map, source_map = pairs[name]
        touched: set[int] = set()
        for param_map, locations, copies in ((source_map, endpoints.source, 1), (target_map, endpoints.target, 2)):
            for loc, shape in param_map.shard_shapes.items():
                process = locations.get(loc)
                if process in wanted:
                    held[process] += copies * volume(tuple(shape))
                    touched.add(process)
        if touched:
            elements = volume(tuple(target_map.logical_shape))
            for process in touched:
                largest[process] = max(largest[process], elements)
    return sum(max(held[p] * itemsize, largest[p] * (_MARKER_FLOOR_BYTES + itemsize)) for p in wanted)


def _node_ranks(rank: int) -> list[int]:
    """The job's processes on this machine: torchrun numbers a node's processes contiguously."""
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return [rank]
    if not 0 <= local_rank < local_world:
        return [rank]
    return list(range(rank - local_rank, rank - local_rank + local_world))


def _check_input(cfg: SyncConfig, job: tuple[int, int] | None
                 ) -> tuple[str | None, dict[str, tuple[ParamAffineMap, ParamAffineMap]], str]:
    """What this process refuses of its input (None when nothing), the model's pairs and how
    they were bound; everything that can be refused is refused here, before anything is launched
    or joined, and every process of a job checks its own (files are read on its own node)."""
    import torch

    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    try:
        pairs, model_endpoints = _load_model(cfg.model)
        endpoints, how = _bind(pairs, model_endpoints, cfg.endpoints, cfg.nproc)
    except AffineTransferError as exc:
        return _first_line(str(exc)), pairs, ""
    except OSError as exc:
        return _first_line(_describe(exc)), pairs, ""
    try:  # every process plans again itself
        from ..planner import plan_transfers

        dtype = getattr(torch, cfg.dtype)
        plan_transfers(pairs, endpoints=endpoints, element_size=dict.fromkeys(pairs, dtype.itemsize),
                       replica_policy=POLICIES[cfg.policy])
    except AffineTransferError as exc:
        return f"{type(exc).__name__}: {_first_line(str(exc))}", pairs, how
    ranks = list(range(cfg.nproc)) if job is None else _node_ranks(job[0])
    return _check_memory(pairs, endpoints, dtype.itemsize, ranks), pairs, how


def _own_code(outcome: RankOutcome) -> int:
    if outcome.error_type in ("TransferRejectedError", "BadInput", "NotRun"):
        return 2
    if not outcome.ok or outcome.value["mismatched"]:
        return 1
    return 0


def _report(outcomes: Sequence[RankOutcome], wall: float, quiet: bool = False) -> int:
    """Print the summary of every process's outcome (``quiet``: only the last line, which says
    whether every element landed exact, and errors); the exit code."""
    refused = [o for o in outcomes if o.error_type == "BadInput"]
    if refused:  # a job whose processes agreed not to start: the cause, for every process that has one
        print("refplan sync: " + "; ".join(f"process {o.rank}: bad input: {_first_line(o.error)}" for o in refused),
              file=sys.stderr)
        return 2
    rejected = [o for o in outcomes if o.error_type == "TransferRejectedError"]
    if rejected:
        print(f"refplan sync: {_first_line(rejected[0].error)}", file=sys.stderr)
        return 2
    failed = [o for o in outcomes if not o.ok]
    if failed:
        parts = [f"process {o.rank} {_first_line(o.error)}" if o.error_type in ("Died", "Stopped", "Timeout")
                 else f"process {o.rank} failed: {_first_line(o.error)}" for o in failed]
        print("refplan sync: " + "; ".join(parts), file=sys.stderr)
    results = [o.value for o in outcomes if o.ok]
    total_landed = 0
    for r in results:
        sent = ", ".join(f"{p}: {_size(b)}" for p, b in sorted(r["sent_bytes"].items())) or "-"
        recv = ", ".join(f"{p}: {_size(b)}" for p, b in sorted(r["received_bytes"].items())) or "-"
        landed = sum(r["received_bytes"].values()) + r["local_copy_bytes"]
        total_landed += landed
        if quiet and r["mismatched"] == 0:  # -q keeps the lines that say what went wrong
            continue
        rate = landed / r["move_seconds"] / 1e9 if r["move_seconds"] > 0 else 0.0
        verdict = "exact" if r["mismatched"] == 0 else f"{r['mismatched']} MISMATCHED (first: {r['first_mismatch']})"
        print(
            f"  process {r['rank']}: sent {_size(sum(r['sent_bytes'].values()))} [{sent}], received "
            f"{_size(sum(r['received_bytes'].values()))} [{recv}], local {_size(r['local_copy_bytes'])}, "
            f"{r['rounds']} rounds, {r['chunks']} chunks, {r['move_seconds']:.4f} s, {rate:.2f} GB/s landed; "
            f"{r['checked']} elements {verdict}"
        )
    if results and not quiet:
        slowest = max(r["move_seconds"] for r in results)
        rate = total_landed / slowest / 1e9 if slowest > 0 else 0.0
        print(
            f"  total: {_size(total_landed)} landed in {slowest:.4f} s (slowest process) = {rate:.2f} GB/s; "
            f"plan {max(r['plan_seconds'] for r in results):.3f} s per process; launch to finish {wall:.2f} s"
        )
    if failed:
        return 1
    bad = sum(r["mismatched"] for r in results)
    print("refplan sync: every target element exact" if bad == 0 else f"refplan sync: {bad} elements wrong")
    return 0 if bad == 0 else 1
