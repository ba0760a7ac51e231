"""Training on the real local SLURM cluster: srun layouts, an sbatch job from `torchstage slurm`, preemption.

- `srun -N 2 python scripts/slurm_train.py` (one task per node, TORCHSTAGE_NPROC=1: world 2) and
  `srun -N 2 --ntasks-per-node=2 ...` (world 4) train to the single-process run's metrics, with one
  set of logs and checkpoints;
- `torchstage slurm --config scripts/slurm_job.yml --submit --wait` runs a generated sbatch script that
  trains (the reference);
- the same script with --requeue, sent `scancel -s USR1` after train batch 40, writes last.pth after batch 41,
  requeues itself, and the requeued run (SLURM_RESTART_COUNT=1) resumes and ends bitwise equal to
  the reference. Both sbatch jobs run one task per node (world 2): with more than two ranks a resumed
  run matches only to rounding (the DDP gradient buckets of its first step differ), see docs/slurm.md.
About 60-75 s on 2 cores, most of it process startups.
"""
import csv
import glob
import json
import os
import re
import runpy
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.resume_helpers import ROOT, checkpoint_differences
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401 (session fixture)

TRAIN = os.path.join(ROOT, "scripts", "slurm_train.py")
JOB = os.path.join(ROOT, "scripts", "slurm_job.yml")
PREEMPTED = os.path.join(ROOT, "tests", "launch", "slurm", "scripts", "preempted_train.py")
PAUSE_AT = 40  # global train batch (of 96) after which the preempted job gets SIGUSR1
TIMEOUT_S = 240
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)


def job_fields(job_id, env) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", out))


class JobWatcher(threading.Thread):
    """Polls `scontrol show job` every 0.5 s from submission on, so the end state is seen before
    SLURM forgets the job (MinJobAge=5 s) even while the test is busy elsewhere."""

    def __init__(self, job_id, env):
        super().__init__(daemon=True)
        self.job_id, self.env, self.fields, self.restarts_seen = job_id, env, {}, set()
        self.start()

    def run(self):
        deadline = time.monotonic() + 2 * TIMEOUT_S
        while time.monotonic() < deadline:
            fields = job_fields(self.job_id, self.env)
            if not fields and self.fields:  # purged after we last saw it
                return
            if fields:
                self.fields = fields
                self.restarts_seen.add(fields.get("Restarts"))
                if fields.get("JobState") in FINISHED:
                    return
            time.sleep(0.5)

    def result(self, timeout=TIMEOUT_S) -> dict:
        self.join(timeout)
        if self.is_alive():
            pytest.fail(f"SLURM job {self.job_id} did not finish in {timeout}s: {self.fields}")
        return self.fields


def wait_for_file(path, timeout=TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear in {timeout}s")
        time.sleep(0.1)


def torchstage_slurm(path, output, *command, submit=False):
    """`torchstage slurm --config scripts/slurm_job.yml`, with this test's output, command and one process per node."""
    return [sys.executable, "-m", "torchstage", "slurm", "--config", JOB, "--output", str(output), "--setup",
            "export TORCHSTAGE_NPROC=1 OMP_NUM_THREADS=1", "--save", str(path)] + \
        (["--submit", "--wait"] if submit else []) + ["--", sys.executable, *map(str, command)]


def srun(env, logdir, *args):
    return subprocess.run(["srun", "-N", "2", *args, sys.executable, TRAIN, str(logdir)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("slurm_training")
    env = {**slurm_cluster, "OMP_NUM_THREADS": "1"}
    env.pop("TORCHSTAGE_NPROC", None)
    jobs, out, reference = [], {"base": base}, None
    try:
        # Both sbatch jobs take one CPU per node, so they run side by side; the sruns queue behind them.
        reference = subprocess.Popen(torchstage_slurm(base / "reference.sbatch", base / "reference.out", TRAIN,
                                                      base / "reference", submit=True),
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        jobs.append(reference.stdout.readline().strip())  # the job id, printed once sbatch has it
        subprocess.run(torchstage_slurm(base / "preempted.sbatch", base / "preempted.out", PREEMPTED,
                                        base / "preempted", PAUSE_AT),
                       env=env, check=True, capture_output=True, timeout=60)
        job = subprocess.run(["sbatch", "--parsable", str(base / "preempted.sbatch")], env=env, capture_output=True,
                             text=True, check=True, timeout=60).stdout.strip().split(";")[0]
        jobs.append(job)
        watcher = JobWatcher(job, env)
        out["single"] = runpy.run_path(TRAIN)["main"](str(base / "single"))  # this process: no SLURM here
        wait_for_file(base / "preempted" / "paused")
        out["signalled_at"] = dict(watcher.fields)
        subprocess.run(["scancel", "-s", "USR1", job], env=env, check=True, timeout=30)
        out["w2"] = srun({**env, "TORCHSTAGE_NPROC": "1"}, base / "w2")
        out["w4"] = srun(env, base / "w4", "--ntasks-per-node=2")
        out["preempted"] = watcher.result()
        ref_out, ref_err = reference.communicate(timeout=TIMEOUT_S)
        out["reference"] = subprocess.CompletedProcess(reference.args, reference.returncode, ref_out, ref_err)
    finally:
        for job in jobs:
            if job and job_fields(job, env).get("JobState", "COMPLETED") not in FINISHED:
                subprocess.run(["scancel", job], env=env, timeout=30)
        if reference is not None and reference.poll() is None:
            reference.kill()
    return out


def last_metrics(logdir) -> dict:
    with open(os.path.join(logdir, "checkpoints", "metrics.json")) as f:
        return json.load(f)["last"]["metrics"]


@pytest.mark.parametrize("name, world_size", [("w2", 2), ("w4", 4)])
def test_srun_trains_to_the_single_process_metrics(runs, name, world_size):
    proc, logdir = runs[name], runs["base"] / name
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert torch.load(logdir / "checkpoints" / "last.pth", weights_only=True)["meta"]["world_size"] == world_size
    single, metrics = last_metrics(runs["base"] / "single"), last_metrics(logdir)
    for loader in ("train", "valid"):
        assert metrics[loader]["loss"] == pytest.approx(single[loader]["loss"], abs=1e-6)
    assert metrics["valid"]["loss"] == pytest.approx(runs["single"].epoch_metrics["valid"]["loss"], abs=1e-6)
    # one set of logs and checkpoints, written by the main rank only
    files = sorted(os.path.relpath(p, logdir) for p in glob.glob(str(logdir / "**" / "*"), recursive=True)
                   if os.path.isfile(p))
    assert [f for f in files if not f.startswith("tensorboard")] == [
        "checkpoints/best.pth", "checkpoints/last.pth", "checkpoints/metrics.json",
        "logs/hparams.json", "logs/ranks.json", "logs/ranks/train.csv", "logs/train.csv", "logs/valid.csv",
        "model_summary.txt"]  # ranks*: the straggler detector's hosts and per-rank times (main rank only too)
    # one event file each for train and valid, and one for the run's hparams
    assert len([f for f in files if f.startswith("tensorboard")]) == 3
    assert (logdir / "logs" / "valid.csv").read_text().count("\nmain,") == 3
    assert proc.stdout.count("epoch 3/3") == 1  # one console log for the whole world


def test_sbatch_wait_job_from_torchstage_slurm_trains(runs):
    proc, logdir = runs["reference"], runs["base"] / "reference"
    assert proc.returncode == 0, proc.stderr[-3000:]
    script = (runs["base"] / "reference.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --requeue" in script and "#SBATCH --signal=USR1@120" in script
    checkpoint = torch.load(logdir / "checkpoints" / "last.pth", weights_only=True)
    assert checkpoint["meta"]["world_size"] == 2 and checkpoint["loop"]["epoch"] == 3
    assert last_metrics(logdir)["valid"]["loss"] == pytest.approx(
        last_metrics(runs["base"] / "single")["valid"]["loss"], abs=1e-6)


def test_usr1_requeues_the_job_and_it_resumes_to_the_same_weights(runs):
    base, fields = runs["base"], runs["preempted"]
    log = (base / "preempted.out").read_text()
    assert runs["signalled_at"]["Restarts"] == "0"
    assert (fields.get("JobState"), fields.get("Restarts"), fields.get("ExitCode")) == ("COMPLETED", "1", "0:0"), log
    # signalled after batch 40; the ranks' agreement started then is read after batch 41
    assert "graceful stop (SIGUSR1) after stage 'main' epoch 2 batch 9 (global batch 41)" in log
    assert re.search(r"requeueing SLURM job \d+ after SIGUSR1", log)
    assert log.count("epoch 3/3") == 1 and log.count("epoch 1/3") == 1  # the second run resumed in epoch 2
    # a requeued job is a restart: its CSV logs carry the count on purpose (logs/run.csv), all else is bitwise
    assert checkpoint_differences(str(base / "reference" / "checkpoints" / "last.pth"),
                                  str(base / "preempted" / "checkpoints" / "last.pth"), restarted=True) == []
    rows = list(csv.DictReader(open(base / "preempted" / "logs" / "run.csv")))
    assert [(row["restarts"], row["global_epoch"]) for row in rows] == [("1", "1")]  # a count, stopped in epoch 2
