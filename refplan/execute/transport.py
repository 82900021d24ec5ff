"""The transport: the rounds of messages after an agreed verdict, posted ahead, packed and unpacked.

After the verdict nothing is left that can fail by the executor's own logic; what can fail here
is the transport's (a dead or stuck peer), and every wait is bounded by the call's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .common import _RETAINED, TransferExecutionError, _Context, _describe, _ended
from .schedule import _SLOTS, _Local, _Message, _Piece, _Schedule, _view

_ORDERED_BATCHES = False
"""Post each round as one batch in piece order even over gloo: NCCL's path, which the CPU tests
take by setting this (the tagged, out-of-order posting is gloo's alone)."""


_MAX_IN_FLIGHT = 32  # rounds posted and not yet waited on, at most


@dataclass
class _Round:
    index: int
    works: list[Any]
    labels: list[tuple[str, int]]  # (direction, peer) of each work
    landing: list[tuple[_Message, _Piece, torch.Tensor | None]]
    buffers: list[torch.Tensor]


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


def _pack(sched: _Schedule, message: _Message, piece: _Piece, wire: torch.Tensor) -> None:
    """Copy a staged piece's chunks from the source shards into its range of the staging slot."""
    for o, at in message.parts[piece.first : piece.last]:
        src = _view(sched.sources[o.key], o.offset, o.shape, o.strides)
        start = at - piece.start
        wire[start : start + o.nbytes].view(src.dtype).view(o.shape).copy_(src)


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
    Any failure here leaves the packing of every piece to ``_move``.
    """
    rounds = min(_SLOTS, max((len(q) for q in sched.outgoing.values()), default=0))
    done: set[tuple[int, int, int]] = set()
    try:
        with torch.no_grad():
            for r in range(rounds):
                for peer, message, i, piece, wire, _stage in _wires(sched, r, "send"):
                    if piece.direct is None:
                        if finished():
                            return frozenset(done)
                        _pack(sched, message, piece, wire)
                        done.add((r, peer, i))
    except Exception:
        return frozenset()
    return frozenset(done)


def _move(
    ctx: _Context, sched: _Schedule, timeout: timedelta, packed: Packed = frozenset()
) -> tuple[int, int, dict[int, int], dict[int, int]]:
    """Run the rounds, two in flight; returns (rounds, local bytes, sent per peer, received per peer).

    The staged sends in ``packed`` were packed already (``_pack_ahead``).
    """
    rounds = max((len(q) for q in (*sched.incoming.values(), *sched.outgoing.values())), default=0)
    sent = {peer: sum(m.payload for m in queue) for peer, queue in sched.outgoing.items()}
    received = {peer: sum(m.payload for m in queue) for peer, queue in sched.incoming.items()}
    local_bytes = 0
    to_global = dict(zip(ctx.members, ctx.global_ranks))

    def local_copy(item: _Local) -> int:
        seg = item.segment
        _view(sched.targets[item.target], seg.target_offset, seg.shape, seg.target_strides).copy_(
            _view(sched.sources[item.source], seg.source_offset, seg.shape, seg.source_strides)
        )
        return item.nbytes

    tagged = sched.device.type == "cpu" and not _ORDERED_BATCHES

    def tag(r: int, i: int) -> int:
        # Without tags (NCCL ignores them anyway) messages match in posting order.
        return _tag(r, i) if tagged else 0

    def post(r: int) -> _Round:
        """Post round r: every receive, then every send.

        Over gloo each piece carries a tag, so a send may be posted out of order: direct pieces
        (and staged ones packed during the verdict) go out at once and each other staged piece as
        soon as it is packed, overlapping the packing
        with the transfer. NCCL matches in posting order and needs one grouped batch, so there
        the whole round is packed first and posted in piece order. Labels for error messages are
        (direction, peer) pairs, worded only if a wait fails: this runs once per piece.
        """
        recvs: list[tuple[torch.Tensor, int, int]] = []  # (wire, global peer, tag)
        labels: list[tuple[str, int]] = []
        landing: list[tuple[_Message, _Piece, torch.Tensor | None]] = []
        buffers: list[torch.Tensor] = []
        ready: list[tuple[torch.Tensor, int, int, tuple[str, int]]] = []  # direct, or packed during the verdict
        staged: list[tuple[_Message, _Piece, torch.Tensor, int, int, tuple[str, int]]] = []
        in_order: list[tuple[torch.Tensor, int, int, tuple[str, int]]] = []  # piece order, which NCCL matches by
        for direction in ("receive", "send"):
            receive = direction == "receive"
            for peer, message, i, piece, wire, stage in _wires(sched, r, direction):
                label = (direction, peer)
                dst, t = to_global[peer], tag(r, i)
                buffers.append(wire)
                if receive:
                    recvs.append((wire, dst, t))
                    labels.append(label)
                    landing.append((message, piece, None if piece.direct is not None else stage))
                    continue
                in_order.append((wire, dst, t, label))
                if piece.direct is not None or (r, peer, i) in packed:
                    ready.append((wire, dst, t, label))
                else:
                    staged.append((message, piece, wire, dst, t, label))

        works: list[Any] = []
        try:
            if tagged:
                # gloo has no batching of its own: one isend/irecv per piece costs less than a
                # batch call per packed piece.
                for wire, dst, t in recvs:
                    works.append(dist.irecv(wire, dst, ctx.group, t))
                for wire, dst, t, label in ready:
                    works.append(dist.isend(wire, dst, ctx.group, t))
                    labels.append(label)
                for message, piece, wire, dst, t, label in staged:
                    _pack(sched, message, piece, wire)
                    works.append(dist.isend(wire, dst, ctx.group, t))
                    labels.append(label)
            else:
                for message, piece, wire, _dst, _t, _label in staged:
                    _pack(sched, message, piece, wire)
                ops = [dist.P2POp(dist.irecv, wire, dst, ctx.group, t) for wire, dst, t in recvs]
                ops += [dist.P2POp(dist.isend, wire, dst, ctx.group, t) for wire, dst, t, _label in in_order]
                works = list(dist.batch_isend_irecv(ops)) if ops else []
                labels += [label for _wire, _dst, _t, label in in_order]
        except Exception as exc:
            _RETAINED.append(buffers)
            # A peer that died (or closed its connection) in any round in flight can make this
            # post fail, so those rounds are named: the round being posted is only the latest.
            flying = [t.index for t, _used in in_flight]
            which = f"round {r} of {rounds}"
            if flying:
                which += f" (rounds {min(flying)}-{max(flying)} were in flight)"
            raise TransferExecutionError(
                f"{which}: posting failed; target buffers may be partly written: {_describe(exc)}"
            ) from exc
        return _Round(r, works, labels, landing, buffers)

    def finish(rnd: _Round, in_flight: list[_Round]) -> None:
        # A round posted ahead waits behind earlier ones: its timeout runs from this wait.
        started = time.monotonic()
        deadline = started + timeout.total_seconds()
        # Last posted first: a queue's messages share one connection and complete in the order
        # they went out, so waiting for its last one first leaves one blocking wait per queue
        # and round, not one per message (each a sleep and a wake-up of this thread: about
        # 50 us of its CPU on 2 shared cores, 2 ms of a 43-message call; issue 26, item 8a).
        for i in range(len(rnd.works) - 1, -1, -1):
            work = rnd.works[i]
            left = max(deadline - time.monotonic(), 0.001)
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
        for message, piece, stage in rnd.landing:
            if stage is not None:
                for op, at in message.parts[piece.first : piece.last]:
                    dst = _view(sched.targets[op.key], op.offset, op.shape, op.strides)
                    dst.copy_(stage[at : at + op.nbytes].view(dst.dtype).view(op.shape))

    # Post ahead as far as staging allows: round s reuses slot s % 2 of a queue, so it waits only
    # for an in-flight round of the same parity that stages on a queue that s stages on too (a
    # message sent straight from/into shards holds no slot). Any such local choice of when to
    # wait is deadlock-free: a process only waits for rounds every peer has already posted or
    # will post without waiting on anything later.
    def staging(r: int) -> set[tuple[str, int]]:
        used = set()
        for direction, queues in (("send", sched.outgoing), ("receive", sched.incoming)):
            for peer, queue in queues.items():
                if r < len(queue) and any(p.direct is None for p in queue[r].pieces):
                    used.add((direction, peer))
        return used

    in_flight: list[tuple[_Round, set[tuple[str, int]]]] = []
    for r in range(rounds):
        need = staging(r)
        while in_flight and (
            len(in_flight) >= _MAX_IN_FLIGHT
            or any(t.index % _SLOTS == r % _SLOTS and used & need for t, used in in_flight)
        ):
            oldest, _used = in_flight.pop(0)
            finish(oldest, [oldest] + [t for t, _u in in_flight])
        in_flight.append((post(r), need))
        # Local copies overlap the rounds in flight: an even share of them per round.
        lo, hi = r * len(sched.local) // rounds, (r + 1) * len(sched.local) // rounds
        for item in sched.local[lo:hi]:
            local_bytes += local_copy(item)
    while in_flight:
        oldest, _used = in_flight.pop(0)
        finish(oldest, [oldest] + [t for t, _u in in_flight])
    if rounds == 0:
        for item in sched.local:
            local_bytes += local_copy(item)
    return rounds, local_bytes, sent, received


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
