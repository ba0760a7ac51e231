"""Graceful stop and elastic restarts under two real processes (torch.distributed.run, gloo on 127.0.0.1).

A SIGTERM sent to rank 1 alone in batch 7 stops both ranks after the same batch: with ``check_every=1``
batch 8 (they agree through an all-reduce started at each batch end and read at the next one); with the
default schedule (about every 0.5 s) by the end of that epoch, batch 10 at the latest. Both exit with 143,
and resuming with two processes ends bitwise
equal to an uninterrupted two-process run. ``torchrun --max-restarts=1`` with resume='last' recovers
from a rank killed by SIGKILL on its own. About 30-60 s on 2 cores.
"""
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import script_server
from tests.resume_helpers import ROOT, checkpoint_differences, child_env
from torchstage import load_checkpoint

SCRIPT = os.path.join(ROOT, "tests", "callbacks", "safety", "scripts", "ddp_run.py")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]


def torchrun(logdir, *extra, resume=None, **env):
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *extra,
            SCRIPT, str(logdir)] + ([resume] if resume else [])
    return script_server.run(args, env=child_env(**env), timeout=300, merge=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    with ThreadPoolExecutor(max_workers=2) as pool:
        reference = pool.submit(torchrun, base / "reference")
        stopped = pool.submit(torchrun, base / "stopped", SIGNAL_AT_BATCH=7, SIGNAL_RANK=1, STOP_CHECK_EVERY=1)
        stopped, reference = stopped.result(), reference.result()
        by_default = pool.submit(torchrun, base / "by_default", SIGNAL_AT_BATCH=7, SIGNAL_RANK=1)
        survivor = load_checkpoint(str(base / "stopped" / "checkpoints" / "last.pth"))
        resumed = pool.submit(torchrun, base / "stopped", resume="last")
        elastic = pool.submit(torchrun, base / "elastic", "--max-restarts=1", resume="last",
                              KILL_AT_BATCH=8, KILL_RANK=1)
        resumed, elastic = resumed.result(), elastic.result()
        by_default = by_default.result()
        unchanged = torchrun(base / "unchanged", "--max-restarts=1", KILL_AT_BATCH=8, KILL_RANK=1)  # no resume=
    assert reference.returncode == 0, reference.stdout[-3000:]
    return {"base": base, "stopped": stopped, "survivor": survivor, "resumed": resumed, "elastic": elastic,
            "unchanged": unchanged, "by_default": by_default}


def test_sigterm_on_one_rank_stops_every_rank_after_the_same_batch(runs):
    out = runs["stopped"].stdout
    assert runs["stopped"].returncode != 0
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", out))
    # each rank exits 143 after the stop; one may instead be hit by torchrun's own SIGTERM (-15) as it exits
    assert "143" in codes and codes <= {"143", "-15"}, out[-3000:]
    # the signal came in batch 7; the agreement started at its end is read at the end of batch 8
    assert "graceful stop (SIGTERM on another rank) after stage 'main' epoch 2 batch 3 (global batch 8)" in out
    loop = runs["survivor"]["loop"]
    assert (loop["global_batch_step"], loop["epoch_done"], runs["survivor"]["meta"]["world_size"]) == (8, False, 2)
    assert len(runs["survivor"]["rng"]) == 2


def test_the_default_schedule_stops_every_rank_after_the_same_batch_by_the_epoch_end(runs):
    out = runs["by_default"].stdout
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", out))
    assert "143" in codes and codes <= {"143", "-15"}, out[-3000:]
    stops = re.findall(r"graceful stop \(SIGTERM on another rank\) after stage 'main' epoch 2 batch (\d) "
                       r"\(global batch (\d+)\)", out)
    assert len(stops) == 1, out[-3000:]
    batch = int(stops[0][1])
    assert 8 <= batch <= 10  # agreed within the epoch, or at its end at the latest
    last = load_checkpoint(str(runs["base"] / "by_default" / "checkpoints" / "last.pth"))
    assert last["loop"]["global_batch_step"] == batch


def test_resume_under_two_processes_is_bitwise_equal(runs):
    assert runs["resumed"].returncode == 0, runs["resumed"].stdout[-3000:]
    base = runs["base"]
    assert checkpoint_differences(str(base / "reference" / "checkpoints" / "last.pth"),
                                  str(base / "stopped" / "checkpoints" / "last.pth")) == []


def test_elastic_restart_resumes_from_the_last_checkpoint(runs):
    out = runs["elastic"].stdout
    assert runs["elastic"].returncode == 0, out[-3000:]
    assert "exitcode: -9" in out  # the first attempt really lost a rank
    base = runs["base"]
    assert checkpoint_differences(str(base / "reference" / "checkpoints" / "last.pth"),
                                  str(base / "elastic" / "checkpoints" / "last.pth"), restarted=True) == []


def test_torchrun_restart_of_the_unchanged_script_continues_its_own_run(runs):
    """No resume argument: the restarted workers (TORCHELASTIC_RESTART_COUNT=1) continue the logdir's run instead
    of refusing it as another run's."""
    out = runs["unchanged"].stdout
    assert runs["unchanged"].returncode == 0, out[-3000:]
    assert "exitcode: -9" in out and "already holds a run" not in out
    assert "; restart attempt 1 of this job" in out
    base = runs["base"]
    assert checkpoint_differences(str(base / "reference" / "checkpoints" / "last.pth"),
                                  str(base / "unchanged" / "checkpoints" / "last.pth"), restarted=True) == []
