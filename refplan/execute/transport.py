"""The transport: the rounds of messages after an agreed verdict, posted ahead, packed and unpacked.

After the verdict nothing is left that can fail by the executor's own logic; what can fail here
is the transport's (a dead or stuck peer), and every wait is bounded by the call's timeout.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.graph import increment_version as _increment_version

from . import schedule
from .common import _RETAINED, TransferExecutionError, _Context, _describe, _ended
from .schedule import _SLOTS, _bind, _Message, _Piece, _Schedule, _view

_ORDERED_BATCHES = False
"""Post each round as one batch in piece order even over gloo: NCCL's path, which the CPU tests
take by setting this (the tagged, out-of-order posting is gloo's alone)."""


_MAX_IN_FLIGHT = 32  # rounds posted and not yet waited on, at most


@dataclass
class _Round:
    index: int
    works: list[Any]
    labels: list[tuple[str, int]]  # (direction, peer) of each work
    landing: Sequence[tuple[torch.Tensor, torch.Tensor]]  # (target box, its staged bytes), unpacked after
    buffers: list[torch.Tensor]
    posted: float = 0.0  # time.monotonic() when its works were posted (NCCL times a wait from there)


def _tag(r: int, i: int) -> int:
    """The gloo tag of piece ``i`` of round ``r``: unique among the pieces of the rounds that can be
    in flight on one pair (fewer than ``2 * _MAX_IN_FLIGHT``; a message has fewer than 2**24 pieces,
    as max_chunks is at most that)."""
    return (r % (2 * _MAX_IN_FLIGHT)) << 24 | i


_Wire = tuple[int, _Message, int, _Piece, torch.Tensor, "torch.Tensor | None"]


def _wires(sched: _Schedule, r: int, direction: str) -> list[_Wire]:
    """Round r's pieces on every queue of one direction, in peer order and piece order: (peer,
    message, piece index, piece, the tensor on the wire, the queue's staging slot this round).

    The wire is the shard itself for a direct piece, else the piece's range of the slot
    (slots alternate by round parity, so round r+1 packs while round r is in flight).
    """
    _bind(sched)
    queues = sched.outgoing if direction == "send" else sched.incoming
    out = []
    for peer in sorted(queues):
        message = queues[peer][r] if r < len(queues[peer]) else None
        if message is None:
            continue
        slot = sched.slots.get((direction, peer))
        stage = slot[r % _SLOTS] if slot is not None else None
        for i, piece in enumerate(message.pieces):
            wire = piece.direct
            if wire is None:
                assert stage is not None
                wire = stage[piece.start : piece.end]
            out.append((peer, message, i, piece, wire, stage))
    return out


Pack = tuple[tuple[torch.Tensor, torch.Tensor], ...]
"""A staged send's copies: (its range of the staging slot, the box of the source shard) per chunk."""


@dataclass(frozen=True)
class _Send:
    peer: int
    index: int  # the piece's index in its message (its tag's low bits)
    wire: torch.Tensor
    tag: int
    packs: Pack  # empty for a piece sent straight from the shard


@dataclass(frozen=True)
class _Posts:
    """One round of a program: what it posts, in peer and piece order, and what it unpacks."""

    receives: tuple[tuple[torch.Tensor, int, int], ...]  # (wire, peer, tag)
    sends: tuple[_Send, ...]
    landing: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    buffers: list[torch.Tensor]  # every wire of the round (kept alive by a failed call: ``_RETAINED``)
    staging: frozenset[tuple[str, int]]  # (direction, peer) of the queues it stages on


@dataclass(frozen=True)
class _Program:
    """A schedule's transport with every view made: the rounds' wires, packing and unpacking boxes,
    tags and staging sets, and the local copies. Made once per warm layout and buffers
    (``schedule._PROGRAMS`` says when one may be reused), so that a warm call posts from
    prepared lists, as the bare replay of its schedule does (``bench._floor``)."""

    rounds: tuple[_Posts, ...]
    local: tuple[tuple[torch.Tensor, torch.Tensor, int], ...]  # (target box, source box, bytes)
    direct: int  # pieces sent from or received into a shard in place (``TransferStats.direct_messages``)
    sent: dict[int, int]
    received: dict[int, int]
    layout: object  # held, so that the id in its key stays this layout's while it is kept
    bases: tuple[torch.Tensor, ...] = ()  # the buffers' views and arenas it was made from, in key order
    detachers: list[Callable[[], object]] = field(default_factory=list)  # its finalizers' (``_keep``)

    def still_at(self, addresses: tuple[int, ...]) -> bool:
        """Whether the memory this program's views address now is at ``addresses`` (a call's
        buffers and arenas, in key order): read from its own views, since a storage it holds
        can give its memory back while held (``untyped_storage().resize_``), after which another
        allocation can take that address and the views follow the storage elsewhere."""
        return _addresses(self.bases) == addresses


def _build(sched: _Schedule) -> _Program:
    """Every view the transport of ``sched`` posts, packs and unpacks, in the order it does."""
    rounds = max((len(q) for q in (*sched.incoming.values(), *sched.outgoing.values())), default=0)
    posts = []
    for r in range(rounds):
        receives, landing, buffers = [], [], []
        for peer, message, i, piece, wire, stage in _wires(sched, r, "receive"):
            receives.append((wire, peer, _tag(r, i)))
            buffers.append(wire)
            if piece.direct is None:
                assert stage is not None
                for op, at in message.parts[piece.first : piece.last]:
                    dst = _view(sched.targets[op.key], op.offset, op.shape, op.strides)
                    landing.append((dst, stage[at : at + op.nbytes].view(dst.dtype).view(op.shape)))
        sends = []
        for peer, message, i, piece, wire, _stage in _wires(sched, r, "send"):
            packs: list[tuple[torch.Tensor, torch.Tensor]] = []
            if piece.direct is None:
                for o, at in message.parts[piece.first : piece.last]:
                    src = _view(sched.sources[o.key], o.offset, o.shape, o.strides)
                    start = at - piece.start
                    packs.append((wire[start : start + o.nbytes].view(src.dtype).view(o.shape), src))
            sends.append(_Send(peer, i, wire, _tag(r, i), tuple(packs)))
            buffers.append(wire)
        used = set()
        for direction, queues in (("send", sched.outgoing), ("receive", sched.incoming)):
            for peer, queue in queues.items():
                if r < len(queue) and any(p.direct is None for p in queue[r].pieces):
                    used.add((direction, peer))
        posts.append(_Posts(tuple(receives), tuple(sends), tuple(landing), buffers, frozenset(used)))
    local = tuple(
        (_view(sched.targets[item.target], item.segment.target_offset, item.segment.shape, item.segment.target_strides),
         _view(sched.sources[item.source], item.segment.source_offset, item.segment.shape, item.segment.source_strides),
         item.nbytes)
        for item in sched.local
    )
    direct = sum(1 for queues in (sched.outgoing, sched.incoming) for queue in queues.values()
                 for message in queue for piece in message.pieces if piece.direct is not None)
    return _Program(
        tuple(posts), local, direct,
        {peer: sum(m.payload for m in queue) for peer, queue in sched.outgoing.items()},
        {peer: sum(m.payload for m in queue) for peer, queue in sched.incoming.items()},
        sched.layout,
        (*sched.sources.values(), *sched.targets.values(), *sched.arenas),
    )


def _addresses(tensors: Sequence[torch.Tensor]) -> tuple[int, ...] | None:
    """The address of each of ``tensors`` now, or None if one cannot be read."""
    try:
        return tuple(t.data_ptr() for t in tensors)
    except RuntimeError:
        return None


def _program(sched: _Schedule) -> _Program:
    """This call's program: the one kept for the same layout and the same buffer and arena
    addresses if there is one (``schedule._PROGRAMS`` says why that is the same memory), else a
    new one, which ``_keep`` keeps once the call has finished cleanly.

    Only CPU buffers are kept views of: a device's memory is the caller's to free at once, and
    NCCL's batches cost one call a round anyway.
    """
    if isinstance(sched.program, _Program):
        return sched.program
    if sched.layout is not None and sched.device.type == "cpu":
        addresses = _addresses((*sched.sources.values(), *sched.targets.values(), *sched.arenas))
        if addresses is not None:
            sched.program_key = (id(sched.layout), len(sched.sources), len(sched.targets), addresses)
            kept = schedule._PROGRAMS.get(sched.program_key)
            if isinstance(kept, _Program) and kept.layout is sched.layout and kept.still_at(addresses):
                sched.program = kept
                sched.program_key = None  # kept already
                return kept
            # A program kept for these addresses whose views now address other memory (a storage
            # it holds was resized, and this call's buffers were allocated where it was) is never
            # used; the one made now replaces it when this call finishes cleanly (``_keep``).
    program = _build(sched)
    sched.program = program
    return program


def _keep(sched: _Schedule, bound: int) -> None:
    """Keep the program a cleanly finished call made, for the next call on the same addresses.

    Only here, just before its arenas go back to the pool (``schedule._recycle``, whose releases
    drop every kept program): a refused or failed call's arenas never return to the pool, and a
    program kept with them would hold staging that no bound counts. Not kept either if an arena is
    too large to be pooled (above ``bound``), or a buffer takes no weak reference (its finalizer
    is what drops the program when the buffer dies, so that it never keeps a caller's memory).
    """
    key, sched.program_key = sched.program_key, None
    pooled = all(schedule._POOL.pools(arena, bound) for arena in sched.arenas)
    if key is None or not isinstance(sched.program, _Program) or not pooled:
        return
    program = sched.program
    try:
        for owner in sched.owners:
            program.detachers.append(weakref.finalize(owner, schedule._PROGRAMS.forget, key).detach)
    except TypeError:
        schedule._unwatch(program)  # the finalizers registered before the one refused
        return
    schedule._PROGRAMS.put(key, program)


def _send(group: Any, wire: torch.Tensor, peer: int, tag: int) -> Any:
    """Post one tagged send of a checked wire to group rank ``peer`` straight on the process group.

    What ``dist.isend`` ends in, without its checks of the argument's type, the group's membership
    and a complex dtype, and its rank conversion: each warm call posts 43 messages a process on the
    ``--sync`` batch, and the transport's Python is what a loaded machine makes dear (issue 26,
    item 8a). Wires are uint8 views the checks made, peers group ranks of a group this process is in.
    """
    return group.send([wire], peer, tag)


def _receive(group: Any, wire: torch.Tensor, peer: int, tag: int) -> Any:
    """Post one tagged receive into a checked wire from group rank ``peer`` (as ``_send``)."""
    return group.recv([wire], peer, tag)


def _pack(packs: Pack) -> None:
    """Copy a staged piece's chunks from the source shards into its range of the staging slot."""
    for slot, box in packs:
        slot.copy_(box)


Packed = frozenset[tuple[int, int, int]]
"""Staged sends packed during the verdict, as (round, peer, piece index)."""


def _pack_ahead(sched: _Schedule, finished: Callable[[], bool] = lambda: False) -> Packed:
    """Pack staged sends of the first ``_SLOTS`` rounds (each has its own slot), piece by piece in
    posting order, while the verdict is in flight, and return which pieces are packed.

    This only reads the caller's validated source shards and writes this process's own staging,
    so it changes nothing the caller can see if the verdict is a refusal, and it is bounded by
    the staging already allocated. It stops as soon as ``finished()`` says the verdict's
    collective has completed: past that point packing would only delay the first round's posts
    (its direct sends, and the receives every peer waits on), which the transport overlaps with
    the packing of the remaining pieces instead. Measured on the 272 MiB ``--sync`` batch,
    packing both rounds outright took about 7 ms while the two-word brief takes under 1 ms.
    Making the program (``_program``) here, during the verdict, is part of the same overlap, and
    the whole of it on a process that only receives (or copies locally): its views of the wires
    and unpacking boxes, made anew whenever its buffers are not the ones its kept views were made
    for (0.4-0.6 ms on a receiver of the 272 MiB ``--sync`` batch). Any failure here leaves the
    packing of every piece, and the program, to ``_move``.
    """
    done: set[tuple[int, int, int]] = set()
    try:
        program = _program(sched)
        with torch.no_grad():
            for r, posts in enumerate(program.rounds[:_SLOTS]):
                for send in posts.sends:
                    if send.packs:
                        if finished():
                            return frozenset(done)
                        _pack(send.packs)
                        done.add((r, send.peer, send.index))
    except Exception:
        return frozenset()
    return frozenset(done)


def _move(
    ctx: _Context, sched: _Schedule, timeout: timedelta, packed: Packed = frozenset()
) -> tuple[int, int, dict[int, int], dict[int, int]]:
    """Run the rounds, two in flight; returns (rounds, local bytes, sent per peer, received per peer).

    The staged sends in ``packed`` were packed already (``_pack_ahead``).
    """
    program = _program(sched)
    rounds = len(program.rounds)
    local_bytes = 0
    to_global = dict(zip(ctx.members, ctx.global_ranks))
    tagged = sched.device.type == "cpu" and not _ORDERED_BATCHES
    nccl = sched.device.type == "cuda"
    to_group = {process: rank for rank, process in enumerate(ctx.members)}
    group: Any = ctx.group if ctx.group is not None else dist.group.WORLD

    def post(r: int) -> _Round:
        """Post round r: every receive, then every send.

        Over gloo each piece carries a tag, so a send may be posted out of order: direct pieces
        (and staged ones packed during the verdict) go out at once and each other staged piece as
        soon as it is packed, overlapping the packing
        with the transfer. NCCL matches in posting order and needs one grouped batch (no tags:
        NCCL ignores them), so there the whole round is packed first and posted in piece order.
        Labels for error messages are (direction, peer) pairs, worded only if a wait fails.
        """
        posts = program.rounds[r]
        labels: list[tuple[str, int]] = [("receive", peer) for _wire, peer, _t in posts.receives]
        works: list[Any] = []
        try:
            if tagged:
                # gloo has no batching of its own: one isend/irecv per piece costs less than a
                # batch call per packed piece.
                for wire, peer, t in posts.receives:
                    works.append(_receive(group, wire, to_group[peer], t))
                later = []
                for send in posts.sends:
                    if send.packs and (r, send.peer, send.index) not in packed:
                        later.append(send)
                        continue
                    works.append(_send(group, send.wire, to_group[send.peer], send.tag))
                    labels.append(("send", send.peer))
                for send in later:
                    _pack(send.packs)
                    works.append(_send(group, send.wire, to_group[send.peer], send.tag))
                    labels.append(("send", send.peer))
            else:
                for send in posts.sends:
                    if send.packs and (r, send.peer, send.index) not in packed:
                        _pack(send.packs)
                ops = [dist.P2POp(dist.irecv, wire, to_global[peer], ctx.group, 0) for wire, peer, _t in posts.receives]
                ops += [dist.P2POp(dist.isend, send.wire, to_global[send.peer], ctx.group, 0) for send in posts.sends]
                works = list(dist.batch_isend_irecv(ops)) if ops else []
                labels += [("send", send.peer) for send in posts.sends]
        except Exception as exc:
            # Posted buffers may still be written by the transport, those of the rounds in
            # flight too: never free them (their works hold what the transport writes into).
            _RETAINED.append([(works, posts.buffers), *((t.works, t.buffers) for t, _used in in_flight)])
            # A peer that died (or closed its connection) in any round in flight can make this
            # post fail, so those rounds are named: the round being posted is only the latest.
            flying = [t.index for t, _used in in_flight]
            which = f"round {r} of {rounds}"
            if flying:
                which += f" (rounds {min(flying)}-{max(flying)} were in flight)"
            raise TransferExecutionError(
                f"{which}: posting failed; target buffers may be partly written: {_describe(exc)}"
            ) from exc
        return _Round(r, works, labels, posts.landing, posts.buffers, time.monotonic())

    def finish(rnd: _Round, in_flight: list[_Round]) -> None:
        # A round posted ahead waits behind earlier ones: its timeout runs from this wait.
        started = time.monotonic()
        deadline = started + timeout.total_seconds()
        # gloo times ``wait(t)`` from the wait; NCCL from when the work was made, at its post
        # (``WorkNCCL``'s start time), and rounds are posted up to ``_MAX_IN_FLIGHT`` ahead, so a
        # round behind others got the timeout less their time. Each wait is given what is left
        # of this round's deadline as its transport counts it.
        # Last posted first: a queue's messages share one connection and complete in the order
        # they went out, so waiting for its last one first leaves one blocking wait per queue
        # and round, not one per message (each a sleep and a wake-up of this thread: about
        # 50 us of its CPU on 2 shared cores, 2 ms of a 43-message call; issue 26, item 8a).
        for i in range(len(rnd.works) - 1, -1, -1):
            work = rnd.works[i]
            left = max(deadline - (rnd.posted if nccl else time.monotonic()), 0.001)
            try:
                work.wait(timedelta(seconds=left))
            except Exception as exc:
                # Posted buffers may still be written by the transport: never free them.
                _RETAINED.append([(x.works, x.buffers) for x in in_flight])
                if len(rnd.works) == len(rnd.labels):
                    direction, peer = rnd.labels[i]
                    what = f"{direction} {'from' if direction == 'receive' else 'to'} process {peer}"
                else:
                    what = "its messages"
                # Rounds are posted ahead: a peer that died (or stalled) in any round in flight
                # fails the wait for the oldest one, so that is the earliest round it can have
                # been, never necessarily the one.
                last = max(x.index for x in in_flight)
                which = (f"round {rnd.index} of {rounds}" if last == rnd.index else
                         f"round {rnd.index} of {rounds} or a later one (rounds {rnd.index}-{last} were in flight)")
                raise TransferExecutionError(
                    f"{which}: {what} {_ended(started, timeout)}; target buffers may be partly written: "
                    f"{_describe(exc)}"
                ) from exc
        for box, staged in rnd.landing:
            box.copy_(staged)

    # Post ahead as far as staging allows: round s reuses slot s % 2 of a queue, so it waits only
    # for an in-flight round of the same parity that stages on a queue that s stages on too (a
    # message sent straight from/into shards holds no slot). Any such local choice of when to
    # wait is deadlock-free: a process only waits for rounds every peer has already posted or
    # will post without waiting on anything later.
    in_flight: list[tuple[_Round, frozenset[tuple[str, int]]]] = []
    for r in range(rounds):
        need = program.rounds[r].staging
        while in_flight and (
            len(in_flight) >= _MAX_IN_FLIGHT
            or any(t.index % _SLOTS == r % _SLOTS and used & need for t, used in in_flight)
        ):
            oldest, _used = in_flight.pop(0)
            finish(oldest, [oldest] + [t for t, _u in in_flight])
        in_flight.append((post(r), need))
        # Local copies overlap the rounds in flight: an even share of them per round.
        lo, hi = r * len(program.local) // rounds, (r + 1) * len(program.local) // rounds
        for box, source, nbytes in program.local[lo:hi]:
            box.copy_(source)
            local_bytes += nbytes
    while in_flight:
        oldest, _used = in_flight.pop(0)
        finish(oldest, [oldest] + [t for t, _u in in_flight])
    if rounds == 0:
        for box, source, nbytes in program.local:
            box.copy_(source)
            local_bytes += nbytes
    return rounds, local_bytes, dict(program.sent), dict(program.received)


def _mark_written(sched: _Schedule) -> None:
    """Tell autograd that this process's target buffers were modified in place.

    The transport writes received bytes through the buffers' addresses (gloo and NCCL write
    into the memory directly), which autograd does not see, while a local copy is a ``copy_``,
    which it does: a target that a graph had saved for backward then raised "modified by an
    inplace operation" when its bytes came from this process and silently gave gradients of the
    new values when they came from another one (torch's own ``dist.recv`` does not count either).
    Counted once the move has begun, for a failed move too (its targets may be partly written),
    and for every target buffer: a plan writes each element of each of them. Metadata only,
    about a quarter of a microsecond a buffer. It never raises: it runs before the outcome
    agreement, where a lone raise would strand the peers.
    """
    for target in sched.targets.values():
        with contextlib.suppress(Exception):  # every target passed the checks as a plain tensor
            _increment_version(target)


def _drain(device: torch.device, timeout: timedelta, sched: _Schedule) -> None:
    """Wait, bounded, for this process's queued CUDA work (unpacking copies) to finish.

    ``torch.cuda.synchronize`` has no timeout; an event polled against the deadline does, and on
    a timeout the staging is retained rather than freed under kernels that may still read it.
    """
    if device.type != "cuda":
        return
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    deadline = time.monotonic() + timeout.total_seconds()
    while not event.query():  # type: ignore[no-untyped-call]
        if time.monotonic() > deadline:
            _RETAINED.append(sched.slots)
            raise TransferExecutionError(
                f"queued CUDA copies did not finish within {timeout}; target buffers may be partly written"
            )
        time.sleep(0.0005)
