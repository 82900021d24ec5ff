"""The verdict: every process's hello and verdict, agreed before any byte moves.

The first call on a group all-gathers one fixed-size message (``_HELLO_WORDS``) from every
process. Its size never changes, so that a peer of another protocol is a disagreement instead of a
gloo abort; every process raises the same ``TransferRejectedError`` from the gathered rows alone.
Once that exchange has shown every process of the group running this protocol, later calls on the
group agree on a two-word brief (``_BRIEF_WORDS``) instead — its maximum over the processes,
through the group's store where the hello showed every process able (``agree``), else one
``all_reduce(MAX)``: it settles an agreed, unrefused call, and anything else (a refusal, a
disagreement, a number the brief cannot hold) sends every process on to the full all-gather, so
rejections read exactly as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import agree
from .common import (
    TransferExecutionError,
    TransferRejectedError,
    _Context,
    _describe,
    _ended,
)
from .summary import SUMMARY_WORDS, disagreement

_MAGIC = 0x7265_6670_6C61_6E33  # "refplan3": a peer running another protocol disagrees, never hangs


_PROTOCOL = 10  # the verdict's messages and the agreements (8: shorter; 9: call numbers, abandoned agreements;
# 10: the schedule summary where a refusing process's reason goes, and a digest of its parts' hashes)


_HELLO_AGREED = 4  # words every process must have equal: magic, protocol, message length, outcome


_HELLO_WORDS = 37
"""Words of the one message every call all-gathers before any byte moves (its hello and verdict
together): magic, protocol, this message's length, whether the process runs the outcome
agreement, its number of rounds, the schedule digest, its refusal flag, its global rank, the
device type of its buffers, its store nonce (``agree.offer``: nonzero if it can agree through the
group's store), and its reason (the rest) or, from protocol 10, if it refuses nothing, the summary
of its schedule (``summary``: which parts of the schedule a digest disagreement is about).

Fixed for good, so that a peer of another protocol meets a message of the same size and is found
by comparing words instead of by a collective of mismatched tensors, which gloo answers with
``std::terminate``. 37 is the size of protocol "refplan2"'s verdict and of protocol 3's hello
(which preceded a separate verdict): a process of either reads this message as one of another
magic or protocol and disagrees; it never aborts. Protocol 4 merged the hello and the verdict
into this one all-gather: each is a collective of about 4 ms on 4 processes sharing 2 loaded
cores, a third of a warm call's fixed cost (issue 26). Protocol 5 keeps this message and makes
the outcome agreement a 1-word all-reduce first (``outcome.py``). Protocol 6 keeps this message
as the first exchange on every group and for every call that is not settled by the brief.
Protocol 7 adds the store nonce to the header: a group whose hello shows every process able makes
its brief and outcome agreements through its store (``agree``), a third of the cost again.
Protocol 8 keeps this message and makes those agreements shorter (``agree``: the process that
completes a count with no unsettled record writes the answer without ``compare_set``, and the
outcome exchanges no records): a process of protocol 7 would wait for answers written another
way, so the two disagree here instead. Protocol 9 adds the call's number on its group (``call``:
every call a process starts on the group, one refused there as concurrent included) to the header
and to what the brief requires equal, and marks a store agreement a process stopped waiting for
(``agree``), which protocol 8's processes would not read as such.
"""


_HEADER_WORDS = 11
"""magic, protocol, length, outcome, rounds, digest, rejected flag, global rank, device type, nonce,
call number."""


_REASON_BYTES = (_HELLO_WORDS - _HEADER_WORDS) * 8  # 208




_DEVICE_CODES = {"cpu": 1, "cuda": 2}


_BRIEF_WORDS = 2
"""Words of the brief a greeted group's calls all-reduce (``MAX``) instead of the full message.

Two because that is what gloo reduces in one step: measured on 4 (and 8) processes sharing 2
cores, an all-reduce of 1 or 2 int64 words costs 0.6-0.7 ms (1.8-2.0 ms on 8), one of 3 words
2.5 ms, 4-8 words 2.8-5 ms, and the 37-word all-gather 3.8-4 ms (issue 26, item 8c: a warm call's
fixed cost must stay within 5 ms). NCCL has no bitwise reductions, so the brief uses only MAX.

Word 0 is ``refused << 62 | full << 61 | h << 17 | rounds``, word 1 ``refused << 62 | full << 61 |
(2**44 - 1 - h) << 17``, where ``h`` is a 44-bit hash of everything the full message requires
equal (magic, protocol, its length, the outcome flag, the schedule digest and the device type of
this process's buffers) and ``rounds`` this process's rounds. The maximum of word 0 over the
processes has the largest ``h`` and that of word 1 the smallest: they are equal exactly when every
process sent the same ``h``, and then the low bits of word 0 are the most rounds of any process
(among equal ``h``, MAX orders by rounds). Any process's refusal, or a number the fields cannot
hold (``full``), sets a top bit that the maximum carries to every process. Every process reads
the same two words, so all of them take the same branch: return, or the full all-gather.
"""


_VERDICT_WORDS = _BRIEF_WORDS
"""Words of a warm call's verdict (on a greeted group, nothing refused, everything agreed): the
brief, all-reduced; the full message (``_HELLO_WORDS``, all-gathered) is the group's first call's
and that of every call the brief does not settle."""


_ROUND_BITS = 17  # a schedule of more rounds than fit here (default max_rounds is 2**16) takes the full exchange


_HASH_BITS = 44


_HASH_MASK = (1 << _HASH_BITS) - 1


_ROUND_MASK = (1 << _ROUND_BITS) - 1


_REFUSED = 1 << 62


_FULL = 1 << 61


_GREETED: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()
"""Groups on which a full exchange showed every process running this protocol. Every process
gathered the same rows, so every one records the same, and nothing ever removes an entry while
the group lives: a failed call leaves it, because a process that forgot it alone (a failure seen
by some processes only, as with ``outcome=False``) would meet its peers' two-word all-reduce with
the full all-gather, a collective of another kind and size, which gloo answers by aborting. The
only way to disagree is a full exchange that completed on some processes and failed on others —
a group whose collective already failed, which torch.distributed does not promise to be usable
(a destroyed group's object takes its entry with it; a new group greets again)."""


_BROKEN: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
"""Groups on which one of this executor's collectives (an all-reduce or all-gather of a verdict or
an outcome) failed or timed out in this process, with what happened. A store agreement that a
process gives up on is marked abandoned so that nobody completes it (``agree``); a collective has
no such mark: a peer arriving after this process's timeout may still complete it with this
process's contribution, and its next collective then meets this process's next call. So such a
group is refused from then on in this process (``call.execute_transfers``), before anything is
posted on it, as torch.distributed does not promise a group usable after a failed collective."""


_NCCL_JOINED: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()
"""Device-mapped groups (``cpu:gloo,cuda:nccl``) on which every process has joined one NCCL
collective through this executor (``_join_nccl``), so that their NCCL communicator exists."""


def _nccl_device(ctx: _Context, holds: torch.device | None) -> torch.device:
    """The CUDA device this process's NCCL operations on the group use (the verdict of an
    NCCL-only group, the join of a device-mapped one): the group's bound device, else its
    buffers', else the current device.

    The bound device first: the group's NCCL communicator is there alone, and a process whose
    buffers are elsewhere refuses (``checks._off_bound_device``); its refusal must reach its peers
    through a collective NCCL accepts, not fail alone in it."""
    bound = getattr(_group_of(ctx), "bound_device_id", None)
    if isinstance(bound, torch.device) and bound.type == "cuda" and bound.index is not None:
        return bound
    if holds is not None and holds.type == "cuda":
        return holds
    if isinstance(bound, torch.device) and bound.type == "cuda":
        return bound
    return torch.device("cuda", torch.cuda.current_device())


def _join_nccl(ctx: _Context, holds: torch.device | None, cuda: bool, timeout: timedelta, started: float) -> None:
    """On an accepted call over CUDA on a device-mapped group, make every process join one
    one-word NCCL all-reduce the first time, before any round is posted.

    There the verdict and the outcome go over gloo (or the store), so the first NCCL operation on
    the group would be round 0's ``batch_isend_irecv``, which uses the group's whole communicator
    and creates it on first use, waiting for every member; torch says so of its first call
    ("all ranks of the group must participate"). A process that moves nothing in that call (it
    only copies locally, or holds no buffer) never posts a round, and its peers waited in the
    creation, which no timeout of the executor's covers. Every process knows from the verdict
    whether any process moves CUDA tensors (``cuda``: the device types of every process, or its
    own where the brief settled the call, which it does only when they are equal), and every
    accepted call on a group is made by all its processes, so all of them decide alike. The
    all-reduce is waited with the call's timeout; a failure there is a failed collective on the
    group (``mark_broken``), before any byte moved. Eager communicators
    (``init_process_group(device_id=...)``) and NCCL-only groups (whose verdict is already an
    NCCL collective) need none, but pay at most this one word once.
    """
    if not cuda or ctx.backends.get("cpu") != "gloo" or ctx.backends.get("cuda") != "nccl":
        return
    group = _group_of(ctx)
    try:
        if _NCCL_JOINED.get(group):
            return
    except TypeError:  # not weakly referenceable: joined on every call
        pass
    try:
        word = torch.zeros(1, dtype=torch.int64, device=_nccl_device(ctx, holds))
        work = dist.all_reduce(word, group=ctx.group, async_op=True)
        if work is not None:
            work.wait(timeout)
    except Exception as exc:
        mark_broken(group, "the first NCCL collective of a device-mapped group", exc)
        raise TransferExecutionError(
            f"creating the process group's NCCL communicator (every process joins one NCCL all-reduce before "
            f"the first round) {_ended(started, timeout)}; no data moved: {_describe(exc)}"
        ) from exc
    with contextlib.suppress(TypeError):
        _NCCL_JOINED[group] = True


def broken(group: object) -> str | None:
    """What failed on ``group`` in this process (``_BROKEN``), or ``None``."""
    try:
        return _BROKEN.get(group)
    except TypeError:  # not weakly referenceable: never marked
        return None


def mark_broken(group: object, what: str, exc: BaseException) -> None:
    """Record that a collective of this executor failed on ``group`` (``_BROKEN``)."""
    with contextlib.suppress(TypeError):  # not weakly referenceable: never marked
        _BROKEN.setdefault(group, f"{what}: {_describe(exc)}")


def _group_of(ctx: _Context) -> object:
    return ctx.group if ctx.group is not None else dist.group.WORLD


def _brief(agreed: Sequence[int], refused: bool, rounds: int) -> list[int]:
    """The two words of the brief (``_BRIEF_WORDS``) for this process."""
    text = ",".join(str(int(v)) for v in agreed).encode()
    h = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") & _HASH_MASK
    flags = (_REFUSED if refused else 0) | (_FULL if not 0 <= rounds < _ROUND_MASK else 0)
    low = rounds if 0 <= rounds < _ROUND_MASK else 0
    return [flags | h << _ROUND_BITS | low, flags | (_HASH_MASK - h) << _ROUND_BITS]


def _settled(words: Sequence[int]) -> int | None:
    """The most rounds of any process if the reduced brief settles the call (every process sent
    the same hash, nobody refused, every number fitted), else ``None`` (the full exchange decides)."""
    high, low = int(words[0]), int(words[1])
    if (high | low) & (_REFUSED | _FULL) or high < 0 or low < 0:
        return None
    if (high >> _ROUND_BITS) & _HASH_MASK != _HASH_MASK - ((low >> _ROUND_BITS) & _HASH_MASK):
        return None
    return high & _ROUND_MASK


Meanwhile = Callable[[Callable[[], bool]], frozenset[tuple[int, int, int]]]
"""Work run while a verdict collective is in flight (``transport._pack_ahead``), given a test of
whether the collective has completed so that it can stop then; what it returns is passed on."""


def _run_meanwhile(meanwhile: Meanwhile | None, work: Any) -> frozenset[tuple[int, int, int]]:
    if meanwhile is None:
        return frozenset()
    finished: Callable[[], bool] = (lambda: False) if work is None else work.is_completed
    return meanwhile(finished)


def _reduce(
    ctx: _Context,
    device: torch.device,
    words: Sequence[int],
    timeout: timedelta,
    meanwhile: Meanwhile | None = None,
) -> tuple[list[int], frozenset[tuple[int, int, int]]]:
    """The elementwise maximum of the brief over the processes: through the group's store if its
    hello linked it (``agree``; a refused or unfit brief is written as the answer at once, since it
    settles nothing), else by the group's ``all_reduce(MAX)``. ``meanwhile`` runs while it is in
    flight."""
    link = agree.link_of(_group_of(ctx))
    if link is not None:
        return agree.agree_max(link, words, timeout, early=_settled([words[0], words[1]]) is None,
                               meanwhile=meanwhile)
    mine = torch.tensor(list(words), dtype=torch.int64, device=device)
    try:
        work = dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=ctx.group, async_op=True)
        done = _run_meanwhile(meanwhile, work)
        if work is not None:
            work.wait(timeout)
    except Exception as exc:
        mark_broken(_group_of(ctx), "a verdict's all-reduce", exc)
        raise
    return [int(v) for v in mine.cpu().tolist()], done


def _verdict_device(ctx: _Context, local: torch.device | None) -> torch.device:
    """The device of the verdict tensor: the same device *type* on every process.

    A collective on a device-mapped group goes to the backend of the tensor's device, so every
    process must pick the same type from what they share — the group's backend — never from
    their own buffers: CPU whenever the group has gloo for CPU, else CUDA (the group's bound
    device, else the buffers' device, else the current device).
    """
    if ctx.backends.get("cpu") == "gloo" or "cuda" not in ctx.backends:
        return torch.device("cpu")
    return _nccl_device(ctx, local)


def _encode_reason(reason: str, nbytes: int = _REASON_BYTES) -> list[int]:
    """``nbytes // 8`` words of a reason; nothing here can raise (lone surrogates are escaped).
    A reason longer than that ends in "…" where it is cut, so that a reader can tell (a cut
    reason read "131072 network chunks, at least ; process 1: ...": an outside probe)."""
    try:
        raw = str(reason).encode("utf-8", "backslashreplace")
        if len(raw) > nbytes:
            mark = "…".encode()
            raw = raw[: nbytes - len(mark)].decode("utf-8", "ignore").encode("utf-8") + mark
        raw = raw[:nbytes].decode("utf-8", "ignore").encode("utf-8")
    except Exception:
        raw = b"(the reason could not be encoded)"[:nbytes]
    raw = raw.ljust(nbytes, b"\0")
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, nbytes, 8)]


def _decode_reason(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def _gather(
    ctx: _Context,
    device: torch.device,
    words: Sequence[int],
    timeout: timedelta,
    meanwhile: Meanwhile | None = None,
) -> tuple[list[list[int]], frozenset[tuple[int, int, int]]]:
    """All-gather one int64 word list per process (every process sends as many words: the verdict
    is ``_HELLO_WORDS`` long in every protocol, the outcome one word after an agreed verdict);
    ``meanwhile`` runs while it is in flight."""
    mine = torch.tensor(list(words), dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in ctx.members]
    try:
        work = dist.all_gather(gathered, mine, group=ctx.group, async_op=True)
        done = _run_meanwhile(meanwhile, work)
        if work is not None:
            work.wait(timeout)
    except Exception as exc:
        mark_broken(_group_of(ctx), "an all-gather of verdicts or outcomes", exc)
        raise
    return [[int(v) for v in t.cpu().tolist()] for t in gathered], done


def _grouped(ctx: _Context, rows: Sequence[Sequence[int]], word: int, skip: int | None = None) -> dict[int, list[int]]:
    """The processes of the gathered ``rows`` grouped by their ``word``-th word (rows whose word is
    ``skip`` left out): more than one group is a disagreement, named by its groups."""
    out: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        if row[word] != skip:
            out.setdefault(row[word], []).append(ctx.members[r])
    return out


def _exchange_failed(started: float, timeout: timedelta, exc: BaseException) -> TransferExecutionError:
    return TransferExecutionError(f"exchanging verdicts {_ended(started, timeout)}; no data moved: {_describe(exc)}")


def _exchange(
    ctx: _Context,
    device: torch.device,
    digest: int,
    reason: str | None,
    holds: torch.device | None,
    timeout: timedelta,
    meanwhile: Meanwhile | None = None,
    outcome: bool = True,
    rounds: int = 0,
    phases: dict[str, float] | None = None,
    number: int = 0,
    summary: Sequence[int] = (),
    parameters: Iterable[str] = (),
) -> tuple[frozenset[tuple[int, int, int]], int]:
    """Agree on every process's verdict: on a greeted group first by the two-word brief
    (``_BRIEF_WORDS``), which returns at once when it settles the call; otherwise (the group's
    first call, or a brief that does not settle) by all-gathering one message of ``_HELLO_WORDS``
    words (hello and verdict in one) from every process, and raising the same
    ``TransferRejectedError`` everywhere on messages whose agreed words differ (another protocol,
    or options), any refusal, digest disagreement, or buffers on different device types.

    The size never changes because a collective of tensors of different sizes is not an error
    gloo reports: it aborts the process. ``meanwhile`` runs while the message is in flight (work
    that only touches this process's own staging: ``_pack_ahead``, told when the collective has
    completed); its result is returned (empty without it) with the most rounds any process's
    schedule has (``rounds`` is this process's), which bounds how long the outcome agreement may
    wait for the slowest process. ``phases`` receives the seconds of the exchange (with
    ``meanwhile``) as ``verdict``.

    ``number`` is the call's number on its group in this process (``call._enter``: every call
    started on the group, one refused there as concurrent included). Calls are matched in the
    order each process makes them, so a call that some processes refused alone (before it touched
    the group) leaves the others' calls paired with their next ones: equal keys and digests
    matched a process's k-th call with a peer's (k-1)-th, and both returned normally with the
    other iteration's data. The number must be equal too; a group whose processes disagree about
    it is out of step for good, and every later call on it is refused. A call some processes never
    started is not seen by numbers (a per-iteration ``key`` is, spec/executor.md guarantee 10).

    ``summary`` (``summary.schedule_digests``) travels where a refusing process's reason does, so
    that a digest disagreement names the parts of the schedule that differ; ``parameters``, this
    process's parameter names (sorted only then), name a parameter whose dtype differs.
    """

    def name(group_rank: int, global_rank: int) -> str:
        process = ctx.members[group_rank] if 0 <= group_rank < len(ctx.members) else global_rank
        return f"process {process}" if process == global_rank else f"process {process} (global rank {global_rank})"

    if not ctx.collective:
        if reason is not None:
            raise TransferRejectedError(
                f"transfer rejected before any data moved: {name(0, ctx.global_rank)}: {reason}", (ctx.me,)
            )
        return frozenset(), rounds
    code = 0 if holds is None else _DEVICE_CODES.get(holds.type, 99)
    group = _group_of(ctx)
    greeted = bool(_GREETED.get(group))
    header = [_MAGIC, _PROTOCOL, _HELLO_WORDS, int(outcome), rounds, digest, int(reason is not None),
              ctx.global_rank, code, 0 if greeted else agree.offer(group), number]
    started = time.monotonic()
    done: frozenset[tuple[int, int, int]] = frozenset()
    if greeted:
        # Everything the full message requires equal (its first ``_HELLO_AGREED`` words), the
        # digest and the device type, read from the header the full exchange would send.
        brief = _brief((*header[:_HELLO_AGREED], digest, code, number), reason is not None, rounds)
        try:
            reduced, done = _reduce(ctx, device, brief, timeout, meanwhile)
        except Exception as exc:
            raise _exchange_failed(started, timeout, exc) from exc
        meanwhile = None  # it ran while the brief was in flight
        most = _settled(reduced)
        if most is not None:
            _join_nccl(ctx, holds, code == _DEVICE_CODES["cuda"], timeout, started)
            if phases is not None:
                phases["verdict"] = time.monotonic() - started
            return done, max(most, rounds)
    # The reason (or the summary) fills what the header leaves of the fixed size, whatever the
    # module's constants say, so that nothing can make this process's message another size than its peers'.
    room = _HELLO_WORDS - len(header)
    if reason is None and len(summary) <= room:
        words = header + [int(w) for w in summary] + [0] * (room - len(summary))
    else:
        words = header + _encode_reason(reason or "", room * 8)
    try:
        rows, packed = _gather(ctx, device, words, timeout, meanwhile)
    except Exception as exc:
        raise _exchange_failed(started, timeout, exc) from exc
    done = done or packed
    if phases is not None:
        phases["verdict"] = time.monotonic() - started
    if not greeted and all(row[:3] == rows[0][:3] for row in rows):
        # Every process gathered these rows, so every one of them records the same: from now on
        # the group's calls may be settled by the brief, through the store if all offered one.
        _GREETED[group] = True
        agree.adopt(group, [row[9] for row in rows], len(rows), ctx.global_ranks.index(ctx.global_rank))
    if any(row[:_HELLO_AGREED] != rows[0][:_HELLO_AGREED] for row in rows):
        # Built from the gathered rows alone, so every process raises the same text.
        detail = "; ".join(
            f"{name(r, ctx.global_ranks[r])}: magic {row[0] & (2**64 - 1):#018x}, protocol {row[1]}, "
            f"a message of {row[2]} words, outcome agreement {'on' if row[3] else 'off'}"
            for r, row in enumerate(rows)
        )
        raise TransferRejectedError(
            "transfer rejected before any data moved: processes run different executor protocols or "
            f"options ({detail})",
            tuple(ctx.members),
        )
    numbers = _grouped(ctx, rows, 10)
    if len(numbers) > 1:
        # Before refusals and digests: rows of different calls say nothing about one call.
        detail = "; ".join(f"call {n} on processes {procs}" for n, procs in sorted(numbers.items()))
        raise TransferRejectedError(
            "transfer rejected before any data moved: the processes are at different calls on this group "
            f"({detail}); calls on a group are matched in the order each process makes them, and a call that some "
            "processes started and refused alone (two at once in one process) leaves the group out of step for "
            "good: every later call on it is refused. Use a new process group (dist.new_group) for later calls",
            tuple(ctx.members),
        )
    most_rounds = max(max(row[4], 0) for row in rows)
    refused = [(r, row) for r, row in enumerate(rows) if row[6]]
    if refused:
        parts = [f"{name(r, row[7])}: {_decode_reason(row[_HEADER_WORDS:])}" for r, row in refused]
        raise TransferRejectedError(
            "transfer rejected before any data moved: " + "; ".join(parts),
            tuple(ctx.members[r] for r, _ in refused),
        )
    digests = _grouped(ctx, rows, 5)
    if len(digests) > 1:
        detail = ", ".join(f"{d & (2**64 - 1):#018x} on processes {procs}" for d, procs in sorted(digests.items()))
        try:
            which = disagreement([(ctx.members[r], row[_HEADER_WORDS:_HEADER_WORDS + SUMMARY_WORDS])
                                  for r, row in enumerate(rows)], sorted(parameters))
        except Exception:  # a summary this process cannot read: the digests alone, on every process alike
            which = ""
        raise TransferRejectedError(
            "transfer rejected before any data moved: processes disagree about the transfer schedule: "
            + (which or "plans, endpoints, budget, dtypes, endpoint_ranks or key") + f" (schedule digests {detail})",
            tuple(ctx.members),
        )
    kinds = _grouped(ctx, rows, 8, skip=0)  # a process with no buffers holds no device type
    if len(kinds) > 1:
        names = {v: k for k, v in _DEVICE_CODES.items()}
        detail = "; ".join(f"{names.get(k, 'other')} on processes {procs}" for k, procs in sorted(kinds.items()))
        raise TransferRejectedError(
            f"transfer rejected before any data moved: processes hold buffers on different device types ({detail}); "
            "one transfer uses one transport",
            tuple(p for procs in kinds.values() for p in procs),
        )
    _join_nccl(ctx, holds, _DEVICE_CODES["cuda"] in kinds, timeout, started)
    return done, most_rounds
