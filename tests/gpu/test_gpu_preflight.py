"""``torchstage preflight`` on GPUs: the matmul probe runs on the GPU (bfloat16 where it has it) and, with several
GPUs, the collectives on NCCL; the figures are a GPU's, not a CPU's."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_preflight_probes_the_gpus(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "CUDA_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    gpus = torch.cuda.device_count()
    command = [sys.executable, "-m", "torchstage", "preflight", "--json"]
    if gpus > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                   "-m", "torchstage", "preflight", "--json"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]  # 1: a GPU slower than others
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("{")]
    report = json.loads(line)
    assert len(report["ranks"]) == gpus
    for rank in report["ranks"]:
        assert rank["device"].startswith(f"cuda:{rank['local_rank']} ")
        assert min(rank["matmul"]) > 5_000  # GFLOP/s: a GPU's, not a CPU thread's
    assert (report["all_reduce_gbps"] is None) == (gpus == 1)
