"""The runnable example of docs/checkpoints.md's "Never stop" section (scripts/examples/never_stop.py): a killed
rank is restarted and the run finishes; a graceful stop is not restarted; one process finishes what two began."""
import os
import sys

import pytest

from tests import script_server
from tests.resume_helpers import ROOT, child_env
from torchstage import load_checkpoint

EXAMPLE = os.path.join(ROOT, "scripts", "examples", "never_stop.py")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def example(*args):
    return script_server.run([sys.executable, EXAMPLE, *map(str, args)], env=child_env(), timeout=300, merge=True)


def test_a_killed_rank_is_restarted_and_the_run_finishes(tmp_path):
    run = example(tmp_path / "run", "--kill-at-batch", 10)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "attempt 1 of 3 failed (rank 1 killed by signal 9" in run.stdout
    assert "the run finished on attempt 2 of 3" in run.stdout
    last = load_checkpoint(str(tmp_path / "run" / "checkpoints" / "last.pth"))
    assert last["loop"]["global_epoch_step"] == 3 and last["loop"]["epoch_done"]
    assert last["meta"]["restart_attempt"] == 1


def test_a_graceful_stop_is_not_restarted_and_one_process_finishes_the_run_of_two(tmp_path):
    logdir = tmp_path / "run"
    stopped = example(logdir, "--stop-at-batch", 6)
    assert stopped.returncode == 1, stopped.stdout[-3000:]
    assert "attempt 1 of 3 ended by a graceful stop: not restarted" in stopped.stdout
    assert "attempt 2" not in stopped.stdout
    at_stop = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))
    # asked in batch 6; the ranks' agreement started at its end is read after batch 7, where both stop
    assert at_stop["loop"]["global_batch_step"] == 7 and at_stop["meta"]["world_size"] == 2
    assert at_stop["loop"]["global_sample_step"] == 7 * 16  # the samples of one process, as in Catalyst
    finished = example(logdir, "--nprocs", 1)
    assert finished.returncode == 0, finished.stdout[-3000:]
    assert "written by 2 process(es), resumed by 1; the global batch size is 16 now (16 per process), 32 before" \
        in finished.stdout
    assert "was interrupted after 224 samples of its epoch's order by 2 process(es); the 224 left are dealt out " \
           "to 1" in finished.stdout
    last = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))
    assert last["meta"]["world_size"] == 1 and last["loop"]["global_epoch_step"] == 3
    # one process's 7 batches of 16 before the stop, then the 224 samples left of epoch 1, then 2 whole epochs
    assert last["loop"]["global_sample_step"] == 7 * 16 + 224 + 2 * 448
