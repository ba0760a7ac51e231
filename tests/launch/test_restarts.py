"""Restarts inside the job: a rank dies, the launcher ends the world and starts it again, and the run goes on.

Real processes on gloo (tests/launch/scripts/restart_run.py, ``distributed=True`` with ``max_restarts``): the
restarted run ends bitwise equal to an uninterrupted one; a failure that repeats at the same batch is not
retried; a run killed before its first checkpoint starts over; one process is watched the same way.
"""
import csv
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import script_server
from tests.resume_helpers import ROOT, checkpoint_differences, child_env
from torchstage import load_checkpoint

SCRIPT = os.path.join(ROOT, "tests", "launch", "scripts", "restart_run.py")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def run(logdir, max_restarts, nproc=2, **env):
    return script_server.run([sys.executable, SCRIPT, str(logdir), str(max_restarts), str(nproc)], env=child_env(**env),
                             timeout=400, merge=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("restarts")
    jobs = {"reference": (0, 2, {}), "killed": (2, 2, {"KILL_AT_BATCH": 13, "KILL_RANK": 1}),
            "deterministic": (3, 2, {"FAIL_AT_BATCH": 7}), "early": (1, 2, {"KILL_AT_BATCH": 1, "KILL_RANK": 0}),
            "single reference": (0, 1, {}), "single killed": (1, 1, {"KILL_AT_BATCH": 13})}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, base / name.replace(" ", "_"), restarts, nproc, **env)
                   for name, (restarts, nproc, env) in jobs.items()}
        results = {name: future.result() for name, future in futures.items()}
    assert results["reference"].returncode == 0, results["reference"].stdout[-3000:]
    return base, results


def last(base, name):
    return str(base / name.replace(" ", "_") / "checkpoints" / "last.pth")


def test_a_rank_killed_mid_epoch_is_restarted_and_the_run_ends_bitwise_equal(runs):
    base, results = runs
    out = results["killed"].stdout
    assert results["killed"].returncode == 0, out[-3000:]
    assert "attempt 1 of 3 failed (rank 1 killed by signal 9" in out and "restarting the world from the run's " \
           "last checkpoint (attempt 2)" in out, out[-3000:]
    assert "(epoch complete); restart attempt 1 of this job" not in out  # killed mid-epoch: it goes on from there
    assert "; restart attempt 1 of this job" in out and "the run finished on attempt 2 of 3" in out
    assert checkpoint_differences(last(base, "reference"), last(base, "killed"), restarted=True) == []
    assert load_checkpoint(last(base, "killed"))["meta"]["restart_attempt"] == 1
    rows = list(csv.DictReader(open(base / "killed" / "logs" / "run.csv")))
    assert [(row["restarts"], row["global_epoch"]) for row in rows] == [("1", "2")]  # epochs done: killed in 3


def test_the_same_failure_at_the_same_batch_twice_is_not_retried(runs):
    _, results = runs
    out = results["deterministic"].stdout
    assert results["deterministic"].returncode == 1, out[-3000:]
    assert "attempt 2 of 4 failed with the same error at the same point as attempt 1 (rank " in out
    assert "RuntimeError: the data at global batch 7 cannot be read): a deterministic failure, not restarted; " \
           "exit code 1" in out
    assert "attempt 3 of 4" not in out


def test_a_run_killed_before_its_first_checkpoint_starts_over(runs):
    base, results = runs
    assert results["early"].returncode == 0, results["early"].stdout[-3000:]
    assert "no checkpoint in" in results["early"].stdout
    assert checkpoint_differences(last(base, "reference"), last(base, "early"), restarted=True) == []


def test_one_process_is_watched_and_restarted_too(runs):
    base, results = runs
    out = results["single killed"].stdout
    assert results["single killed"].returncode == 0, out[-3000:]
    assert "attempt 1 of 2 failed (rank 0 killed by signal 9" in out
    assert checkpoint_differences(last(base, "single reference"), last(base, "single killed"),
                                  restarted=True) == []
