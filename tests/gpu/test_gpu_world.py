"""The GPU process paths: an NCCL world (distributed=True, and torchrun), and bitwise resume on a GPU."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.resume_helpers import checkpoint_differences, run_tiny, start_tiny

SCRIPT = Path(__file__).parent / "scripts" / "nccl_run.py"
ROOT = Path(__file__).resolve().parents[2]


def run(args, tmp_path, timeout=300):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]


def test_distributed_true_runs_one_process_per_visible_gpu(tmp_path):
    ranks = run([sys.executable, str(SCRIPT), str(tmp_path / "logs")], tmp_path)
    gpus = torch.cuda.device_count()
    assert len(ranks) == gpus
    assert [r["rank"] for r in ranks] == list(range(gpus))
    for r in ranks:
        assert r["world_size"] == gpus and r["device"] == f"cuda:{r['local_rank']}"
        assert r["backend"] == ("nccl" if gpus > 1 else None)
        assert r["valid_loss"] == ranks[0]["valid_loss"]  # every rank holds the same global metrics
    assert (tmp_path / "logs" / "checkpoints" / "last.pth").exists()


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_torchrun_of_one_process_trains_on_the_gpu_without_a_process_group(tmp_path):
    # a world of one forms no process group, under torchrun as under distributed=True on one GPU
    # (tests/launch/test_env.py); its collectives are no-ops
    ranks = run(["torchrun", "--nproc-per-node=1", str(SCRIPT), str(tmp_path / "logs")], tmp_path)
    assert len(ranks) == 1
    assert ranks[0]["backend"] is None and ranks[0]["device"] == "cuda:0" and ranks[0]["world_size"] == 1


def test_resume_after_sigkill_on_a_gpu_is_bitwise_equal(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run_tiny(whole).returncode == 0
    killed = start_tiny(parts, KILL_AT_BATCH=13)
    killed.communicate(timeout=300)
    assert killed.returncode == -9
    resumed = run_tiny(parts, "last", timeout=300)
    assert resumed.returncode == 0, resumed.stdout
    last_whole, last_parts = whole / "checkpoints" / "last.pth", parts / "checkpoints" / "last.pth"
    assert checkpoint_differences(last_whole, last_parts) == []
    state = torch.load(last_whole, weights_only=True)
    # the run really was on the GPU: its CUDA generator's state is in the checkpoint (weights are saved as host copies)
    assert all("cuda" in rank for rank in state["rng"])
