"""The local launcher passes SIGUSR1 on to its workers (SLURM's --signal and `scancel -s USR1` reach only
the task srun started, the launcher) instead of dying of it: every rank stops after the same batch."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.resume_helpers import ROOT, child_env

pytestmark = [pytest.mark.distributed, pytest.mark.waits]  # how fast a signal stops the workers

SCRIPT = os.path.join(ROOT, "tests", "launch", "slurm", "scripts", "preempted_train.py")


@pytest.mark.timeout(120)
def test_usr1_to_the_launcher_stops_every_worker_gracefully(tmp_path):
    env = child_env(TORCHSTAGE_NPROC="2", USR1_STOPS="1", OMP_NUM_THREADS="1")
    for name in [k for k in env if k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))]:
        del env[name]
    proc = subprocess.Popen([sys.executable, SCRIPT, str(tmp_path), "5"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "paused").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no worker reached batch 5"
            time.sleep(0.1)
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGUSR1, out[-3000:]
    # the signal came after batch 5; the ranks' agreement started then is read after batch 6
    assert "graceful stop (SIGUSR1) after stage 'main' epoch 1 batch 6 (global batch 6)" in out
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)
    assert (checkpoint["loop"]["global_batch_step"], checkpoint["meta"]["world_size"]) == (6, 2)


@pytest.mark.timeout(150)
def test_double_ctrl_c_during_validation_interrupts_two_ranks_at_once_with_agreeing_exit_codes(tmp_path):
    script = os.path.join(ROOT, "tests", "launch", "scripts", "slow_valid.py")
    env = child_env(OMP_NUM_THREADS="1")
    for name in [k for k in env if k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))]:
        del env[name]
    # started as a terminal starts a command, SIGINT at its default: where the suite itself runs in the background
    # (`cmd &` in a script), its processes inherit SIGINT ignored, and the launcher leaves an ignored signal ignored
    terminal = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", terminal, sys.executable, script, str(tmp_path)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "validating").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "validation never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # the second Ctrl-C
        second = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - second
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    assert elapsed < 20, (elapsed, out[-3000:])  # not after the 20 s validation batch
    assert "exit code 143" not in out and "SIGTERM" not in out, out[-3000:]  # workers saw the launcher's SIGINT
    assert out.count("KeyboardInterrupt") >= 2, out[-3000:]  # both ranks were interrupted by the second Ctrl-C
