"""Hang detection: a rank stuck in user code ends the 2-rank job within hang_timeout + 10 s, named with its
place in the loop and its Python stack."""
import os
import subprocess
import sys
import time

import pytest

from tests.resume_helpers import ROOT, child_env
from torchstage.callbacks.watchdog import HangWatchdogCallback


@pytest.mark.timeout(150)
def test_a_hung_rank_ends_the_job_naming_the_rank_where_and_its_stack(tmp_path):
    env = child_env(OMP_NUM_THREADS="1")
    for name in [k for k in env if k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))]:
        del env[name]
    script = os.path.join(ROOT, "tests", "distributed", "scripts", "hang.py")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, script, str(tmp_path)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 124, out[-3000:]
    assert "torchstage hang: rank 1 made no progress for" in out and "(hang_timeout=5) and is stuck" in out, out[-3000:]
    assert "it was at stage 'main', epoch 1, loader 'train', batch 3 (in on_batch_end or later)" in out
    assert "in deep_in_user_code" in out and "time.sleep(3600)" in out  # the stuck rank's Python stack
    assert "rank 0 made no progress" not in out  # the waiting rank does not take the blame
    assert time.monotonic() - start < 90  # startup + 3 batches + 5 s + the launcher's teardown, not an hour


def test_hang_timeout_is_checked():
    with pytest.raises(ValueError, match="hang_timeout must be a number of seconds > 0 .* got 0"):
        HangWatchdogCallback(0)
