"""The decisions the executor takes for NCCL, tested on CPU (no GPU here; spec/executor.md,
"On GPUs (NCCL)"): which processes join a device-mapped group's NCCL communicator before the
first round, and which CUDA buffers a group bound to one device refuses. The NCCL calls
themselves are replaced by recorders; what is tested is that every process decides alike from
what the verdict told it, and that a refusal comes before the verdict.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

from refplan.execute import TransferExecutionError, verdict
from refplan.execute.checks import _off_bound_device
from refplan.execute.common import _Context

pytestmark = pytest.mark.timeout(60)


class _Group:
    """Stands for a process group: weakly referenceable, compared by identity."""


def _ctx(group: _Group, backends: dict[str, str]) -> _Context:
    return _Context(group, True, 0, (0, 1), (0, 1), 0, ",".join(f"{k}:{v}" for k, v in backends.items()),
                    backends)  # type: ignore[arg-type]


@pytest.fixture
def all_reduces(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every all-reduce ``_join_nccl`` posts, its tensor made on CPU in place of a CUDA device."""
    posted: list[Any] = []

    def all_reduce(tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> None:
        posted.append((tensor.tolist(), group))

    monkeypatch.setattr(verdict, "_nccl_device", lambda ctx, holds: torch.device("cpu"))
    monkeypatch.setattr(verdict.dist, "all_reduce", all_reduce)
    return posted


MAPPED = {"cpu": "gloo", "cuda": "nccl"}


def test_a_device_mapped_group_joins_its_nccl_communicator_once_before_the_first_cuda_round(
    all_reduces: list[Any],
) -> None:
    """On ``cpu:gloo,cuda:nccl`` the verdict goes over gloo, so the first NCCL operation would be
    round 0, which a process moving nothing never posts: every process, the idle ones included,
    joins one NCCL all-reduce first, once per group."""
    group = _Group()
    ctx = _ctx(group, MAPPED)
    verdict._join_nccl(ctx, None, True, timedelta(seconds=5), 0.0)  # holds no buffer, others move CUDA
    assert all_reduces == [([0], group)]
    verdict._join_nccl(ctx, torch.device("cuda", 0), True, timedelta(seconds=5), 0.0)
    assert len(all_reduces) == 1, "joined twice on one group"
    other = _Group()
    verdict._join_nccl(_ctx(other, MAPPED), None, True, timedelta(seconds=5), 0.0)
    assert [g for _t, g in all_reduces] == [group, other]


@pytest.mark.parametrize(("backends", "cuda"), [
    (MAPPED, False),  # nobody moves CUDA tensors: no NCCL operation follows
    ({"cuda": "nccl"}, True),  # NCCL-only: the verdict itself was an NCCL collective of every process
    ({"cpu": "gloo"}, False),
])
def test_no_join_where_no_nccl_round_follows_or_the_verdict_was_one(
    all_reduces: list[Any], backends: dict[str, str], cuda: bool
) -> None:
    verdict._join_nccl(_ctx(_Group(), backends), None, cuda, timedelta(seconds=5), 0.0)
    assert all_reduces == []


def test_a_failed_join_moves_nothing_and_marks_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("NCCL communicator creation timed out")

    monkeypatch.setattr(verdict, "_nccl_device", lambda ctx, holds: torch.device("cpu"))
    monkeypatch.setattr(verdict.dist, "all_reduce", failing)
    group = _Group()
    with pytest.raises(TransferExecutionError, match=r"NCCL communicator .* no data moved: RuntimeError: NCCL"):
        verdict._join_nccl(_ctx(group, MAPPED), None, True, timedelta(seconds=5), 0.0)
    assert "first NCCL collective" in (verdict.broken(group) or "")


def test_buffers_off_the_groups_bound_device_are_refused_before_the_verdict() -> None:
    """A group made with ``device_id=cuda:i`` has its NCCL communicator on cuda:i only."""
    cuda = torch.device
    said = _off_bound_device(cuda("cuda", 1), cuda("cuda", 0))
    assert said is not None and said.startswith("buffers on cuda:1, but the process group is bound to cuda:0"), said
    assert _off_bound_device(cuda("cuda", 0), cuda("cuda", 0)) is None
    assert _off_bound_device(cuda("cpu"), cuda("cuda", 0)) is None  # gloo moves CPU buffers
    assert _off_bound_device(cuda("cuda", 1), None) is None  # not bound
    assert _off_bound_device(cuda("cuda", 1), cuda("cuda")) is None  # bound without an index
    assert _off_bound_device(None, cuda("cuda", 0)) is None  # holds no buffer


def test_on_nccl_who_failed_is_asked_through_the_store_not_the_aborted_communicator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a failed round NCCL's communicator is aborted, so on a group whose collectives are
    NCCL's and that agrees through its store, every process's status comes from the store (each
    its own at its group rank): both processes learn that process 1 failed, and no collective is
    posted (it would fail at once on the aborted communicator and name every target)."""
    import threading

    from torch._C._distributed_c10d import HashStore

    from refplan.execute import agree, outcome

    def no_collective(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a collective was posted")

    monkeypatch.setattr(outcome, "_gather", no_collective)
    store = HashStore()
    links = [agree._Link(store, "refplan/agree/statuses", 2, rank) for rank in range(2)]
    got: dict[int, Any] = {}

    def run(me: int) -> None:
        ctx = _Context(_Group(), True, me, (0, 1), (0, 1), me, "nccl", {"cuda": "nccl"})  # type: ignore[arg-type]
        try:
            got[me] = outcome._statuses(ctx, links[me], torch.device("cuda", 0), [0, 1][me], timedelta(seconds=10))
        except Exception as exc:
            got[me] = exc

    threads = [threading.Thread(target=run, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {0: [0, 1], 1: [0, 1]}, got


def test_who_failed_never_deletes_the_verdicts_keys_while_a_peer_may_still_read_them() -> None:
    """The outcome's count can be settled early (a failed process writes it at once), so another
    process reaches the statuses agreement while a process with nothing to move may still be
    reading the verdict's answer, two agreements back: deleting those keys at the first arrival
    made that process fail alone ("an agreement's answer has 1 bytes, not 16"), its count two
    behind for good. They go once every process has arrived at the statuses agreement."""
    import threading
    import time as clock

    from torch._C._distributed_c10d import HashStore

    from refplan.execute import agree, outcome
    from refplan.execute.outcome import _FAILED, _OK

    store = HashStore()

    class Slow:
        """A store whose wait returns and is then descheduled a moment before the read."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def wait(self, keys: Any, *args: Any) -> None:
            self.inner.wait(keys, *args)
            clock.sleep(0.5)

    links = {"a": agree._Link(store, "p", 3, 0), "c": agree._Link(store, "p", 3, 1),
             "z": agree._Link(Slow(store), "p", 3, 2)}
    limit = timedelta(seconds=10)
    brief = [5, 7]
    got: dict[str, Any] = {}

    def statuses(name: str, status: int) -> None:
        me = "acz".index(name)
        ctx = _Context(_Group(), True, me, (0, 1, 2), (0, 1, 2), me, "nccl", {"cuda": "nccl"})  # type: ignore[arg-type]
        try:
            got[name] = outcome._statuses(ctx, links[name], torch.device("cuda", 0), status, limit)
        except Exception as exc:
            got[name] = repr(exc)

    def failed() -> None:  # its part failed: its outcome word settles the count at once
        agree.agree_max(links["a"], brief, limit)
        agree.agree_max(links["a"], [_FAILED], limit, early=True, uniform=True, kind="o")
        statuses("a", _FAILED)

    def finished() -> None:
        agree.agree_max(links["c"], brief, limit)
        agree.agree_max(links["c"], [_OK], limit, uniform=True, kind="o")
        statuses("c", _OK)

    def idle() -> None:  # nothing to move: from the verdict straight to the outcome
        try:
            got["z_brief"] = agree.agree_max(links["z"], brief, limit)[0]
            agree.agree_max(links["z"], [_OK], limit, uniform=True, kind="o")
        except Exception as exc:
            got["z_brief"] = repr(exc)
            return
        statuses("z", _OK)

    threads = [threading.Thread(target=f) for f in (idle, failed, finished)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {"z_brief": brief, "a": [_FAILED, _OK, _OK], "c": [_FAILED, _OK, _OK],
                   "z": [_FAILED, _OK, _OK]}, got
    assert store.num_keys() <= 3 * 3, store.num_keys()  # the verdict's keys went once all had arrived


def test_the_verdict_goes_to_the_groups_bound_device_so_a_refusal_reaches_every_process() -> None:
    """On an NCCL-only group bound to cuda:0, a process whose buffers are on cuda:1 refuses; its
    verdict must travel on cuda:0, where the communicator is (on cuda:1 NCCL refused the
    collective and that process failed alone)."""
    group = _Group()
    group.bound_device_id = torch.device("cuda", 0)  # type: ignore[attr-defined]
    ctx = _ctx(group, {"cuda": "nccl"})
    assert verdict._verdict_device(ctx, torch.device("cuda", 1)) == torch.device("cuda", 0)
    assert verdict._nccl_device(ctx, torch.device("cuda", 1)) == torch.device("cuda", 0)
    unbound = _ctx(_Group(), {"cuda": "nccl"})
    assert verdict._verdict_device(unbound, torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert verdict._verdict_device(_ctx(group, MAPPED), torch.device("cuda", 1)) == torch.device("cpu")


def test_a_failed_transfer_over_nccl_refuses_its_group_from_then_on() -> None:
    """A timed-out NCCL wait aborts the communicator: after a failed call over NCCL every process
    refuses the group before anything is posted (round 0 of a next call, its verdict settled
    through the store, would fail after the verdict). Over gloo the group stays usable."""
    from types import SimpleNamespace

    from refplan.execute import TransferRejectedError, call

    cuda_group, cpu_group = _Group(), _Group()
    failure = TransferExecutionError("round 0 of 3: receive from process 1 timed out")
    call._nccl_failed(_ctx(cuda_group, MAPPED), SimpleNamespace(device=torch.device("cuda", 0)), failure)  # type: ignore[arg-type]
    call._nccl_failed(_ctx(cpu_group, MAPPED), SimpleNamespace(device=torch.device("cpu")), failure)  # type: ignore[arg-type]
    assert "a transfer over NCCL" in (verdict.broken(cuda_group) or "")
    assert verdict.broken(cpu_group) is None
    with pytest.raises(TransferRejectedError, match="a transfer over NCCL"):
        call._enter(_ctx(cuda_group, MAPPED))
