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
    links = [agree._Link(store, "refplan/agree/statuses", 2) for _ in range(2)]
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
