"""scripts/slurm_train.py on one machine, the first steps of docs/local-to-cluster.md: a --check smoke run,
then TORCHSTAGE_NPROC=2 processes that train to the single-process metrics (the SLURM steps are in
tests/launch/slurm/test_slurm_training.py). About 10 s on 2 cores."""
import json
import os
import runpy
import sys

import pytest
import torch

from tests import script_server
from tests.resume_helpers import ROOT, child_env

SCRIPT = os.path.join(ROOT, "scripts", "slurm_train.py")


def run_script(*args, **env):
    env = child_env(OMP_NUM_THREADS="1", **env)
    for name in [k for k in env if k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))]:
        del env[name]
    env.setdefault("TORCHSTAGE_NPROC", "1")
    return script_server.run([sys.executable, SCRIPT, *map(str, args)], env=env, timeout=120)


def valid_loss(logdir):
    with open(os.path.join(logdir, "checkpoints", "metrics.json")) as f:
        return json.load(f)["last"]["metrics"]["valid"]["loss"]


def test_check_flag_is_a_short_smoke_run(tmp_path):
    proc = run_script(tmp_path, "--check")
    assert proc.returncode == 0, proc.stderr[-3000:]
    loop = torch.load(tmp_path / "check" / "checkpoints" / "last.pth", weights_only=True)["loop"]
    assert loop["epoch"] <= 2 and loop["global_batch_step"] < 2 * 32  # a few batches, not 3 full epochs


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_two_local_processes_train_like_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHSTAGE_NPROC", raising=False)
    single = runpy.run_path(SCRIPT)["main"](str(tmp_path / "single"))
    proc = run_script(tmp_path / "two", TORCHSTAGE_NPROC="2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert torch.load(tmp_path / "two" / "checkpoints" / "last.pth", weights_only=True)["meta"]["world_size"] == 2
    assert valid_loss(tmp_path / "two") == pytest.approx(single.epoch_metrics["valid"]["loss"], abs=1e-6)


def test_job_config_generates_the_documented_sbatch_script():
    proc = script_server.run([sys.executable, "-m", "torchstage", "slurm", "--config",
                           os.path.join(ROOT, "scripts", "slurm_job.yml")],
                             env=child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(ROOT, "scripts", "slurm_job.sbatch")) as f:
        assert proc.stdout == f.read()
