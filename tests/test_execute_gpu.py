"""The executor on CUDA tensors and NCCL: the checks ``scripts/gpu-check.sh`` runs on a GPU machine.

Why a file of its own: ``make test`` installs the CPU build of torch, so these checks can only
run where the GPU script has installed a CUDA build of the same torch version. Each test skips
with a reason that names how many devices it needs and how many are here; with one GPU every
check except the two-process NCCL transfer runs (two processes cannot share one GPU in one
NCCL communicator). What a CPU can check about the script itself (it parses, its dry run names
the pinned CUDA torch and every check) runs in ``make test``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import _dist_worker as worker
import pytest
import torch

from refplan import TransferEndpoints, contiguous_split_map
from refplan.cli.sync import run_ranks
from refplan.execute import execute_transfer, execute_transfers
from refplan.planner import plan_transfer

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("gpu")]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need(devices: int, have: int, what: str) -> str:
    """The skip reason: what is needed and what is here, right for 0, 1 or more devices."""
    build = "" if torch.version.cuda else " (this torch is a CPU build: run scripts/gpu-check.sh)"
    return f"{what} needs {devices} CUDA device{'s' if devices > 1 else ''}, {have} here{build}"


GPUS = cuda_devices()
one_gpu = pytest.mark.skipif(GPUS < 1, reason=need(1, GPUS, "this check"))
two_gpus = pytest.mark.skipif(GPUS < 2, reason=need(2, GPUS, "NCCL between two processes"))


def test_skip_reasons_count_devices() -> None:
    reason = need(2, 1, "NCCL between two processes")
    assert reason.startswith("NCCL between two processes needs 2 CUDA devices, 1 here")
    assert need(1, 0, "x").startswith("x needs 1 CUDA device, 0 here")
    assert "none here" not in need(2, 1, "x")


def test_gpu_check_script_parses_and_plans_every_check() -> None:
    """The script's CPU-runnable part: bash accepts it, and its dry run pins the CUDA torch and
    names each check without installing anything."""
    bash = shutil.which("bash")
    assert bash is not None
    subprocess.run([bash, "-n", str(SCRIPT)], check=True)
    env = {**os.environ, "GPU_CHECK_GPUS": "1"}
    done = subprocess.run([bash, str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, check=False,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "torch==2.13.0" in out and "torch.version.cuda" in out
    assert "tests/test_execute_gpu.py" in out and "--backend nccl" in out and "torchrun" in out


@one_gpu
def test_cuda_single_process_local_copies_every_dtype() -> None:
    source_map = contiguous_split_map((6, 8), [3, 3], 0)
    target_map = contiguous_split_map((6, 8), [4, 4], 1)
    endpoints = TransferEndpoints({0: 0, 1: 0}, {0: 0, 1: 0})
    plan = plan_transfer(target_map, source_map, endpoints=endpoints)
    for dtype in worker.ALL_DTYPES:
        raw = torch.randint(0, 256, (48, dtype.itemsize), dtype=torch.uint8, device="cuda")
        # Rows 0-2 and 3-5 of the (6, 8) tensor, built from bytes (clone needs no kernel of the dtype).
        sources = {0: raw[:24].clone().view(dtype).reshape(-1), 1: raw[24:].clone().view(dtype).reshape(-1)}
        targets = {0: torch.zeros(24 * dtype.itemsize, dtype=torch.uint8, device="cuda").view(dtype),
                   1: torch.zeros(24 * dtype.itemsize, dtype=torch.uint8, device="cuda").view(dtype)}
        execute_transfer(plan, sources, targets, endpoints, dtype=dtype)
        for loc, cols in ((0, slice(0, 4)), (1, slice(4, 8))):
            # Expected bytes from the uint8 source: not every dtype has a copy kernel of its own.
            want = raw.view(6, 8, dtype.itemsize)[:, cols].reshape(6, 4 * dtype.itemsize).cpu()
            got = targets[loc].view(torch.uint8).view(6, 4 * dtype.itemsize).cpu()
            assert torch.equal(got, want), f"{dtype} location {loc}"


@one_gpu
def test_nccl_single_process_group_and_device_mapped_group() -> None:
    outcomes = run_ranks(worker.nccl_single, 1, backend="nccl", timeout=timedelta(seconds=120), deadline_s=250)
    assert outcomes[0].ok, outcomes[0].error
    res: dict[str, Any] = outcomes[0].value
    for label in ("nccl", "mapped"):
        assert res[label]["exact"] and res[label]["sources_intact"], (label, res[label])


@one_gpu
def test_cuda_buffers_on_a_gloo_group_are_refused_collectively() -> None:
    outcomes = run_ranks(worker.cuda_on_gloo, 2, backend="gloo", start_method="spawn",
                         timeout=timedelta(seconds=120), deadline_s=250)
    values = [o.value for o in outcomes]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert all(v["raised"] == "TransferRejectedError" and "need the nccl backend" in v["message"] for v in values)
    assert len({v["message"] for v in values}) == 1 and all(v["unchanged"] for v in values)


@one_gpu
def test_mixed_device_types_are_refused_collectively() -> None:
    outcomes = run_ranks(worker.mixed_devices, 2, backend="gloo", start_method="spawn",
                         timeout=timedelta(seconds=120), deadline_s=250)
    values = [o.value for o in outcomes]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert all(v["raised"] == "TransferRejectedError" and "different device types" in v["message"] for v in values)
    assert len({v["message"] for v in values}) == 1


@two_gpus
def test_nccl_two_processes() -> None:
    outcomes = run_ranks(worker.nccl_pair, 2, backend="nccl", timeout=timedelta(seconds=60), deadline_s=170)
    for o in outcomes:
        assert o.ok, o.error
        assert o.value["exact"] and o.value["guards"] and o.value["sources_intact"], o.value


def test_cpu_buffers_without_a_group_need_no_cuda() -> None:
    """The device comes from the buffers: CPU tensors never touch CUDA, GPU or not."""
    endpoints = TransferEndpoints({0: 0}, {0: 0})
    plans = {"w": plan_transfer(contiguous_split_map((4,), [4], 0), contiguous_split_map((4,), [4], 0),
                                endpoints=endpoints)}
    target = torch.zeros(4)
    execute_transfers(plans, {"w": {0: torch.arange(4.0)}}, {"w": {0: target}}, endpoints,
                      dtypes={"w": torch.float32})
    assert torch.equal(target, torch.arange(4.0))
