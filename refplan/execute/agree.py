"""The small agreements of a call (the verdict's brief, the outcome's status word): the elementwise
maximum of a few int64 words over every process of the group, through the group's store.

Why the store and not the group's ``all_reduce``: a warm call's fixed cost is mostly these two
agreements and the scheduling around them, and on gloo a tiny all-reduce is a ring of hops, each
handed between gloo's work thread, its transport thread and the caller. Measured on 4 gloo
processes sharing 2 cores (issue 26, item 8c), back to back: an all-reduce of 2 int64 words took
1.39-1.64 ms and 1.8-2.1 ms of CPU summed over the processes; this agreement 0.49-0.58 ms and
0.40-0.47 ms of CPU (plus the store server's). On NCCL it also spares a device synchronisation.

The protocol, for agreement number ``seq`` on a group (every process counts the same agreements,
since calls on a group are matched in the order each process makes them):

1. append this process's record (its group rank, then the words, little-endian) to
   ``<prefix>/<seq>/v`` (a ``set`` or an ``append`` is sent without waiting for an answer; every
   other request is a round trip). The rank makes every process's record distinct, and the
   process that reads them requires each rank exactly once: ``FileStore.append`` drops a value
   equal to the key's current value, so two processes' identical records (every agreed brief)
   were one record there (an outside audit, 2026-12-06; protocol 10 adds the rank);
2. ``add(<prefix>/<seq>/n, 1)``, or ``1 + _UNSETTLED`` from a process whose own record already
   settles the answer as "not agreed" (a refusal in the brief, a failure in the outcome);
3. the process whose ``add`` returns exactly the group's size (every process arrived, none
   unsettled) is the only one to compute the answer: it reads every record, takes their maximum
   and writes it to ``<prefix>/<seq>/d`` with ``set``. Records it cannot read as one per rank
   make it write a mark with its error's text instead (``_UNREADABLE``), so that every process
   raises the same ``UnreadableRecordsError`` (before, it wrote its own record, which settled the
   call for its peers: they moved data while it raised "no data moved");
4. an unsettled process writes its own record to ``d`` at once, with ``compare_set`` from empty
   (the first such writer wins), so the others never wait for a peer that may be dead; every
   reader then reads a record that does not settle the call, as the maximum would not, and all of
   them go on to the full all-gather over the group, which names what happened
   (``verdict._exchange``, ``outcome._outcome``);
5. every other process waits for ``d`` (with the caller's timeout) and reads it;
6. a process whose wait for ``d`` ends with its timeout writes ``_ABANDONED`` to ``d`` (from
   empty: an answer that came meanwhile wins, and is used). Its own arrival is already counted,
   so before protocol 9 the late processes completed the count with its stale record and went on
   as if it were with them — moving data, and having their outcome agreement completed by its next
   call's brief — while it had raised "no data moved". Every process that reads or writes ``d``
   now finds the mark and raises, so an agreement is completed by all or by none.

``d`` is written once either way, always by ``compare_set`` from empty: by the one process that
completed a count with no unsettled record in it, by unsettled processes, whose count can never
complete, or by a process that stopped waiting (step 6). An agreement whose settling
records are all the same (``uniform``: the outcome's status word, which only says "every process
finished its part") exchanges no records: the count alone says that all arrived with that record,
and the process that completes it writes its own as the answer. On the path every warm call takes
this costs the last process to arrive two round trips (its ``add``, and the ``compare_set`` that
writes the answer, where protocol 8's ``set`` was sent without waiting) and the others one more
(their read) after ``d`` appears; measured, about 0.2–0.3 ms of a warm call (docs/performance.md).

An agreement's keys also name its kind (``v`` a verdict's brief, ``o`` an outcome), so that
records of one kind never complete an agreement of the other.

The first process to arrive at agreement ``seq`` (settled or not) deletes the keys of agreement
``seq - 2`` (``_forget_older``): every process has finished reading them, since each has arrived
at ``seq - 1`` (its count was complete, or its ``d`` was written early by a process whose failure
sends everyone on to the all-gather, which no process leaves before all arrive). The one
agreement that follows an early-settled one at once, the statuses an NCCL group asks for after a
failure (``outcome._statuses``), leaves that deletion to the process that completes its count
(``forget_first=False``): a process with nothing to move can reach it while a peer still reads
the verdict's answer.

A group uses the store only if it has at most ``_STORE_MAX_PROCESSES`` processes (the store is one
server: an agreement costs it a few requests per process), its store is not a ``FileStore``
(every request appends to one file that is never compacted, so a sync loop would grow it by a few
hundred bytes a call for good; such a group agrees by its ``all_reduce``), and its hello (the
first full exchange) showed every process able to:
each process clones the group's store (a connection of its own, so that nothing else in the
process that blocks on the shared client can delay an agreement) and sends a random nonce; the
nonce of the group's first process names the keys (``prefix``). Every process decides from the
same gathered rows, so either all use the store or all use the group's ``all_reduce``.
"""

from __future__ import annotations

import secrets
import struct
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

_NEEDED = ("append", "add", "compare_set", "wait", "check", "delete_key", "set_timeout")
"""Store methods the agreement uses (every store torch ships has them; a store without them makes
the process report no store in its hello, and the group uses its ``all_reduce``)."""


_STORE_MAX_PROCESSES = 16
"""The largest group that agrees through its store; a larger one uses its ``all_reduce``. The store
is one server that answers every request in turn (``TCPStore``), shared with torch's own use of it,
so an agreement costs it about four requests per process: measured on gloo, 2 cores, back to back,
0.47 ms per agreement on 4 processes, 0.69-0.82 on 8, 1.3 on 16, 2.5-2.8 on 32 — linear, about
80 us a process, which would be ~80 ms on 1 024 processes, where a collective grows with log N.
Up to 16 processes the store stays within about a millisecond and was faster than the all-reduce
every time it was measured (1.4, 3.9-4.2, 6.4-7.1 ms on 4, 8, 16 processes there); beyond that no
measurement here speaks for it."""


_UNSETTLED = 1 << 32
"""What an unsettled process adds to an agreement's count on top of its 1: the count can then never
equal the group's size (at most ``_STORE_MAX_PROCESSES``), so nobody computes or writes an answer
beside the unsettled process's own."""


_ABANDONED = b"abandoned: a process stopped waiting for this agreement"
"""What a process that stopped waiting writes as an agreement's answer (step 6 of the module's
text). Its length is no multiple of 8, so it can never be an answer of records."""


_POLL_SECONDS = 0.0005
"""Least time between two looks at whether the agreement has completed while packing ahead
(``Meanwhile``): each look is a round trip to the store."""


@dataclass
class _Link:
    """A group's agreements through its store: this executor's own connection, the keys' prefix
    (from the nonce agreed in the hello) and the number of agreements made so far."""

    store: Any  # dist.Store; typed loosely because torch's stubs do not list every method
    prefix: str
    size: int
    rank: int  # this process's rank in the group: the first word of its records (required: see ``_maximum``)
    seq: int = 0
    kinds: dict[int, str] = field(default_factory=dict)
    """The kind of each of the last agreements (by number), so that ``_forget_older`` deletes the
    keys that agreement used and no others (a delete is a round trip)."""


_LINKS: weakref.WeakKeyDictionary[object, _Link] = weakref.WeakKeyDictionary()
"""Groups whose hello showed every process able to agree through the store; set together with
``verdict._GREETED`` and, like it, never removed while the group lives."""


_OFFERS: weakref.WeakKeyDictionary[object, tuple[Any, int]] = weakref.WeakKeyDictionary()
"""This process's store clone and nonce for a group not yet greeted, offered in its hello; made
once per group, so that a group whose hellos keep failing does not open a connection per call."""


def offer(group: object) -> int:
    """The nonce this process sends in its hello for ``group``: nonzero if it can agree through
    the group's store (its clone kept for ``adopt``), else 0 — also for a group of more than
    ``_STORE_MAX_PROCESSES``, which opens no connection. Never raises."""
    if group in _OFFERS:
        return _OFFERS[group][1]
    nonce = 0
    clone: Any = None
    try:
        from torch.distributed import distributed_c10d

        if distributed_c10d.get_world_size(group) <= _STORE_MAX_PROCESSES:  # type: ignore[arg-type]
            # The group's own store (a prefix store for a subgroup); cloned, so that this
            # executor has a connection of its own (``TCPStore`` serialises a client's requests).
            store: Any = distributed_c10d._get_process_group_store(group)  # type: ignore[arg-type]
            clone = None if _file_backed(store) else store.clone()  # a FileStore: see the module's text
            if clone is not None and all(callable(getattr(clone, name, None)) for name in _NEEDED):
                nonce = secrets.randbits(62) | 1
    except Exception:
        clone, nonce = None, 0
    try:
        _OFFERS[group] = (clone if nonce else None, nonce)
    except TypeError:  # not weakly referenceable: no store path for it
        return 0
    return nonce


def _file_backed(store: Any) -> bool:
    """Whether ``store`` is a ``FileStore``, under any prefix stores (a subgroup's store is one)."""
    from torch._C._distributed_c10d import FileStore, PrefixStore

    for _ in range(64):  # prefix stores nest once per level of subgroup; no chain is this deep
        if isinstance(store, FileStore):
            return True
        if not isinstance(store, PrefixStore):
            return False
        store = store.underlying_store
    return True  # a chain too deep to follow: not the store path's kind of store


def adopt(group: object, nonces: Sequence[int], size: int, rank: int) -> None:
    """After a hello that greets ``group``: agree through its store from now on if every process
    offered one (``nonces``, by group rank, the same rows on every process) and the group has at
    most ``_STORE_MAX_PROCESSES`` processes, else never. ``rank``: this process's rank in it."""
    clone, _mine = _OFFERS.pop(group, (None, 0))
    if (group in _LINKS or clone is None or not nonces or any(n <= 0 for n in nonces)
            or size > _STORE_MAX_PROCESSES or not 0 <= rank < size):
        return
    _LINKS[group] = _Link(clone, f"refplan/agree/{nonces[0]:x}", size, rank)


def link_of(group: object) -> _Link | None:
    return _LINKS.get(group)


def _pack(words: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(words)}q", *words)


class AbandonedError(RuntimeError):
    """An agreement that a process stopped waiting for (its timeout passed) before it completed."""


class UnreadableRecordsError(RuntimeError):
    """An agreement whose records were not one per rank (a store that lost, merged or repeated
    one): raised with the same text by the process that read them and by every process that
    reads the mark it wrote (``_UNREADABLE``)."""


_UNREADABLE = b"unreadable: "
"""The start of the answer a process that could not read the records writes, followed by its
error's text, padded so that the length is no multiple of 8 (never an answer of words)."""


def _unreadable_mark(text: str) -> bytes:
    mark = _UNREADABLE + text.encode("utf-8", "backslashreplace")
    return mark + b" " if len(mark) % 8 == 0 else mark


def _answered(raw: Any) -> bytes:
    """``raw`` as the agreement's answer; ``AbandonedError`` if it is the abandoned mark,
    ``UnreadableRecordsError`` if it is the unreadable one."""
    answer = bytes(raw)
    if answer.startswith(_UNREADABLE) and len(answer) % 8:
        raise UnreadableRecordsError(answer[len(_UNREADABLE):].decode("utf-8", "replace").rstrip(" "))
    if answer == _ABANDONED:
        raise AbandonedError(
            "another process stopped waiting for this agreement (its timeout passed) before every process had "
            "arrived; it went on without it, so nobody does"
        )
    return answer


def _unpack(raw: bytes, count: int) -> list[int]:
    if len(raw) != 8 * count:
        raise RuntimeError(f"an agreement's answer has {len(raw)} bytes, not {8 * count}")
    return list(struct.unpack(f"<{count}q", raw))


def _maximum(raw: bytes, count: int, size: int) -> bytes:
    """The answer of ``size`` records of a rank and ``count`` words: their words' maximum. Raises
    unless the records are exactly one per rank (a store that lost, merged or repeated one)."""
    width = 8 * (count + 1)
    if len(raw) != width * size:
        raise UnreadableRecordsError(f"an agreement holds {len(raw)} bytes of records, not {size} of {width}")
    rows = [struct.unpack_from(f"<{count + 1}q", raw, at) for at in range(0, len(raw), width)]
    ranks = sorted(row[0] for row in rows)
    if ranks != list(range(size)):
        raise UnreadableRecordsError(f"an agreement's records are from ranks {ranks}, "
                                     f"not one from each of 0..{size - 1}")
    return _pack([max(column) for column in zip(*(row[1:] for row in rows))])


Meanwhile = Callable[[Callable[[], bool]], frozenset[tuple[int, int, int]]]


def agree_max(
    link: _Link,
    words: Sequence[int],
    timeout: timedelta,
    *,
    early: bool = False,
    meanwhile: Meanwhile | None = None,
    uniform: bool = False,
    kind: str = "v",
    forget_first: bool = True,
) -> tuple[list[int], frozenset[tuple[int, int, int]]]:
    """The elementwise maximum of ``words`` over the group's processes (see the module's text);
    ``early``: this process's own record already settles the call as not agreed, so it is written
    as the answer at once. ``uniform``: every process whose record settles the call sends this
    same record, so no records are exchanged (the count decides). ``meanwhile`` runs while this
    process waits for the answer, told when it has come; what it returns is passed on (empty
    without it). ``kind`` names the agreement's kind in its keys (``v`` a brief, ``o`` an outcome).
    ``forget_first``: the first process to arrive deletes agreement ``seq - 2``'s keys (every
    process is past it once anyone arrives here, as long as the agreement before this one was
    not settled early); without it, the process that completes the count does (everyone has
    arrived), for an agreement that follows an early-settled one at once, which a process with
    nothing to wait for may reach while a peer still reads ``seq - 2``'s answer.
    Raises on a timeout or a store failure, and ``AbandonedError`` for an agreement another
    process stopped waiting for (the callers turn either into the call's error)."""
    store = link.store
    link.seq += 1
    link.kinds[link.seq] = kind
    link.kinds.pop(link.seq - 3, None)  # three kept: this one and the two ``_forget_older`` may need
    base = f"{link.prefix}/{link.seq}{kind}/"
    count = len(words)
    mine = _pack(words)
    store.set_timeout(timeout)
    if not uniform:
        store.append(base + "v", _pack([link.rank, *words]))
    arrived = int(store.add(base + "n", 1 + (_UNSETTLED if early else 0)))
    done: frozenset[tuple[int, int, int]] = frozenset()
    if arrived == link.size:
        # Every record is in and none is unsettled: this process alone writes the answer.
        if not forget_first:
            _forget_older(link)
        if uniform:
            answer = mine
        else:
            # Read the records without waiting (``compare_set`` against a value no concatenation
            # of records can equal returns the current value and changes nothing).
            try:
                answer = _maximum(store.compare_set(base + "v", "x", ""), count, link.size)
            except UnreadableRecordsError as exc:
                # So that nobody waits for an answer that never comes, and nobody reads one: every
                # process raises this error (its own record would have settled its peers' call).
                answer = _unreadable_mark(str(exc))
        # From empty only: a process that stopped waiting may have marked it abandoned (step 6).
        answer = _answered(store.compare_set(base + "d", "", answer))
        if meanwhile is not None:  # told that the agreement has completed: it packs nothing ahead
            done = meanwhile(lambda: True)
    elif early:
        answer = _answered(store.compare_set(base + "d", "", mine))
        if forget_first and arrived % _UNSETTLED == 1:  # the first to arrive, unsettled: after its answer is out
            _forget_older(link)
    else:
        if forget_first and arrived == 1:
            _forget_older(link)
        if meanwhile is not None:
            done = meanwhile(_poller(store, base + "d"))
        try:
            store.wait([base + "d"], timeout)
        except Exception:
            # Stopped waiting: mark it so that no late process completes it without this one; an
            # answer that came meanwhile wins the compare_set and is used.
            try:
                late = bytes(store.compare_set(base + "d", "", _ABANDONED))
            except Exception:
                late = _ABANDONED  # the store is gone too: the wait's error says what happened
            if late == _ABANDONED:
                raise
        answer = _answered(store.compare_set(base + "d", "x", ""))
    return _unpack(answer, count), done


def _forget_older(link: _Link) -> None:
    """Delete the keys of agreement ``seq - 2``; called by the one process that arrived first at
    agreement ``seq`` (its count's first ``add``, settled or not: the count modulo ``_UNSETTLED``).

    Before, only a first arrival that was settled deleted them, so every agreement whose first
    arrival was a refusing process (a refusal is quick, so it usually is) left its three keys in
    the store for good: about 0.9 keys a refused call on 4 processes, never reclaimed.
    """
    kind = link.kinds.get(link.seq - 2)
    if kind is not None:
        old = f"{link.prefix}/{link.seq - 2}{kind}/"
        for suffix in ("v", "n", "d"):
            link.store.delete_key(old + suffix)


def _poller(store: Any, key: str) -> Callable[[], bool]:
    """A test of whether ``key`` exists, asking the store at most every ``_POLL_SECONDS``."""
    last = [time.perf_counter()]
    seen = [False]

    def finished() -> bool:
        if seen[0]:
            return True
        now = time.perf_counter()
        if now - last[0] < _POLL_SECONDS:
            return False
        last[0] = now
        seen[0] = bool(store.check([key]))
        return seen[0]

    return finished
