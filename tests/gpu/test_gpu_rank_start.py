"""Preloaded rank starts on a GPU machine: a launching process that initialised the CUDA driver is never forked (a
driver merely mapped by importing torch is no reason), and ranks started from a preloaded process use their GPU
with CUDA uninitialised at their first line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
import json, os, sys
import torch
first = {"cuda_initialized": torch.cuda.is_initialized(),
         "parent": open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")}
if os.environ.get("TOUCH_CUDA") and not os.environ.get("RANK"):
    assert torch.cuda.is_available()  # cuInit in the launching process: it must not be forked
from torchstage import distributed_cmd_run

def fn():
    x = torch.ones(4, device="cuda").sum().item()
    with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.json"), "w") as f:
        json.dump({**first, "sum": x, "device": torch.cuda.current_device()}, f)

distributed_cmd_run(fn, nprocs=1, max_restarts=1)  # one GPU is enough: a watched world of one is launched
"""


@pytest.mark.parametrize("touch, nvml", [(True, "0"), (False, "1")])
def test_a_rank_forked_from_a_preloaded_process_uses_its_gpu(tmp_path, touch, nvml):
    (tmp_path / "program.py").write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "TORCHSTAGE_START")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PYTORCH_NVML_BASED_CUDA_CHECK=nvml, **({"TOUCH_CUDA": "1"} if touch else {}))
    result = subprocess.run([sys.executable, str(tmp_path / "program.py"), str(tmp_path)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "forked from a preloaded process" in result.stdout + result.stderr
    rank = json.loads((tmp_path / "rank-0.json").read_text())
    assert rank["sum"] == 4.0 and rank["cuda_initialized"] is False
    if touch:  # the driver was initialised: the preloaded process is a fresh interpreter
        assert rank["parent"][1:3] == ["-m", "torchstage.launch.zygote"]
        assert "this one cannot be forked: the CUDA driver is initialised here" in result.stdout, result.stdout
    else:  # NVML counted the GPUs: the driver stayed uninitialised; a fork of the launching process, or (NVML's
        # own thread still running, as on an H200 with driver 580) a fresh preloaded process that says so
        launch_line = result.stdout.splitlines()[0]
        assert "CUDA driver" not in launch_line, launch_line
        if rank["parent"][1:3] == ["-m", "torchstage.launch.zygote"]:
            assert "this one cannot be forked: 1 thread(s) kept running through fork()" in launch_line, launch_line
        else:
            assert rank["parent"][1:3] == [str(tmp_path / "program.py"), str(tmp_path)], launch_line


def test_the_driver_counts_as_initialised_only_after_cuinit(tmp_path):
    """A driver library that importing torch mapped is safe to fork; after ``cuInit`` it is not."""
    program = ("import torch\nfrom torchstage.launch.fork_safety import cuda_driver_initialised, cuda_driver_path\n"
               "print(bool(cuda_driver_path()), cuda_driver_initialised())\n"
               "torch.cuda.init()\nprint(bool(cuda_driver_path()), cuda_driver_initialised())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = result.stdout.split("\n")[:2]
    assert before.endswith("False") and after == "True True", result.stdout
