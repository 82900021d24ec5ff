"""The executor across process-group lifecycles: a group made on a ``FileStore``, and groups torch
no longer knows (destroyed, or from before the last ``init_process_group``)."""

from __future__ import annotations

import tempfile
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import _dist_worker as worker
import pytest

from refplan.cli.sync import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("execute")]


@pytest.fixture(scope="module")
def file_store() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "store")  # must not exist yet: every process opens the same file
        outcomes = run_ranks(partial(worker.file_store_groups, path=path), 2, timeout=timedelta(seconds=60),
                             deadline_s=200)
    errors = [f"process {o.rank}: {o.error}" for o in outcomes if not o.ok]
    assert not errors, "\n".join(errors)
    return [o.value for o in outcomes]


def test_a_file_store_group_moves_exactly_call_after_call(file_store: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(file_store):
        for case in ("world", "sub"):
            for i, call in enumerate(res[case]):
                assert call["exact"] and call["sources_intact"], (rank, case, i, call)
        assert res["after"]["exact"], (rank, res["after"])
        # Agreed by the group's all-reduce: a FileStore is one file that every request grows.
        assert not res["world_linked"], rank


@pytest.mark.parametrize("case", ["destroyed", "stale_world"])
def test_a_group_torch_no_longer_knows_is_refused_by_name(file_store: list[dict[str, Any]], case: str) -> None:
    for rank, res in enumerate(file_store):
        got = res[case]
        assert got["raised"] == "TransferRejectedError", (rank, got)
        assert "group is not a process group torch.distributed knows in this process" in got["message"], got
        assert "destroy_process_group" in got["message"] and got["unchanged"], got
