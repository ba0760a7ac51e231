"""train(requeue=...): argument checks and the automatic resume of a requeued SLURM job; scontrol's answers
about real jobs on the local cluster (an srun step is no batch job, so requeue=True fails before training)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import regression_loaders
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401 (session fixture)
from torchstage import SupervisedRunner
from torchstage.launch.slurm.requeue import check_requeue_arg, restart_count


def test_requeued_job_resumes_from_last_unless_told_otherwise():
    restarted = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}
    assert check_requeue_arg(None, None, restarted) == "last"
    assert check_requeue_arg(True, None, restarted) == "last"
    assert check_requeue_arg(None, "other.pth", restarted) == "other.pth"  # an explicit resume wins
    assert check_requeue_arg(False, None, restarted) is None
    assert check_requeue_arg(None, None, {"SLURM_JOB_ID": "7"}) is None  # first run of the job
    assert check_requeue_arg(None, None, {}) is None
    assert restart_count({"SLURM_RESTART_COUNT": "3"}) == 3 and restart_count({}) == 0


def test_bad_requeue_arguments_raise_before_training(monkeypatch, tmp_path):
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    model = torch.nn.Linear(4, 1)
    kwargs = dict(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  loaders=regression_loaders(), logdir=str(tmp_path))
    with pytest.raises(TypeError, match="requeue must be None .* True or False, got 'yes'"):
        SupervisedRunner().train(**kwargs, requeue="yes")
    with pytest.raises(ValueError, match=r"requeue=True needs a SLURM batch job \(SLURM_JOB_ID is not set\)"):
        SupervisedRunner().train(**kwargs, requeue=True)
    assert not os.listdir(tmp_path)  # nothing trained, nothing written
    runner = SupervisedRunner().train(**kwargs, requeue=None)  # outside SLURM: no requeue callback at all
    assert "requeue" not in runner.callbacks


PROBE = textwrap.dedent("""
    import torch
    from tests.conftest import regression_loaders
    from torchstage import SupervisedRunner
    from torchstage.launch.slurm.requeue import requeue_blocker, slurm_job_id
    print("blocker:", requeue_blocker(slurm_job_id()))
    model = torch.nn.Linear(4, 1)
    try:
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders=regression_loaders(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1), requeue=True)
    except ValueError as e:
        print("error:", e)
""")


def test_srun_job_is_not_requeueable(slurm_cluster):  # noqa: F811
    out = subprocess.run(["srun", "-N", "1", sys.executable, "-c", PROBE], env=slurm_cluster, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "blocker: SLURM job" in out.stdout and "is not a batch job (srun/salloc)" in out.stdout
    assert "error: requeue=True cannot work: SLURM job" in out.stdout
    assert "epoch 1/1" not in out.stdout + out.stderr  # refused before the first epoch
