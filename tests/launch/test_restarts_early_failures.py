"""Restarts and failures that leave no failure record: an error in the script before ``train()``, in setup or while
resuming repeats identically, so it is not retried; one that differs between attempts is; and the output of a
failed attempt shows the first rank's traceback once, its peers' echoes as one line after it, and ends with the
restart summary.

Real processes on gloo: tests/launch/scripts/early_fail_run.py (``distributed_cmd_run`` with ``max_restarts``) and
tests/launch/scripts/restart_run.py (``train(max_restarts=...)``).
"""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import script_server
from tests.resume_helpers import ROOT, child_env

EARLY = os.path.join(ROOT, "tests", "launch", "scripts", "early_fail_run.py")
RESTART = os.path.join(ROOT, "tests", "launch", "scripts", "restart_run.py")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


def run(args, **env):
    return script_server.run([sys.executable, *map(str, args)], env=child_env(**env), timeout=600, merge=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("early")
    jobs = {where: ([EARLY, base / where, restarts, where], {}) for where, restarts in
            (("script", 4), ("setup", 4), ("resume", 4), ("flaky", 2))}
    jobs["one rank fails"] = ([RESTART, base / "one", 2, 2], {"FAIL_AT_BATCH": 3, "FAIL_RANK": 1})
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, args, **env) for name, (args, env) in jobs.items()}
        return base, {name: future.result() for name, future in futures.items()}


def attempts(base, where):
    """(attempt, job id) of each worker start, from the script's own notes."""
    lines = (base / where / "attempts").read_text().split("\n")
    return sorted((int(attempt), job) for attempt, job, _ in (line.split() for line in lines if line))


@pytest.mark.parametrize("where, error", [("script", "ValueError: lr must be > 0, got -1"),
                                          ("setup", "FileNotFoundError: no such file: /data/train.csv")])
def test_an_error_before_training_that_repeats_is_not_retried(runs, where, error):
    base, results = runs
    out = results[where].stdout
    assert results[where].returncode == 1, out[-3000:]
    started = attempts(base, where)
    assert [attempt for attempt, _ in started] == [0, 0, 1, 1], out[-3000:]  # 2 attempts of 5, 2 ranks each
    assert len({job for _, job in started}) == 1  # one job across its attempts
    assert (f"before its run recorded anything (in the script before train(), in setup or while resuming): {error}); "
            f"restarting the world") in out, out[-3000:]
    assert (f"attempt 2 of 5 failed with the same error as attempt 1 (rank ") in out, out[-3000:]
    assert f"{error}): a deterministic failure, not restarted; exit code 1" in out, out[-3000:]
    assert "attempt 3 of 5" not in out


def test_an_error_while_resuming_that_repeats_is_not_retried(runs):
    base, results = runs
    out = results["resume"].stdout
    assert results["resume"].returncode == 1, out[-3000:]
    started = attempts(base, "resume")
    assert [attempt for attempt, _ in started] == [0, 0, 1, 1, 2, 2], out[-3000:]  # killed, then the same error twice
    assert len({job for _, job in started}) == 1
    assert "attempt 1 of 5 failed (rank 1 killed by signal 9" in out, out[-3000:]
    # every restarted attempt resumes the one logdir's run, and fails there the same way
    error = (f"CheckpointError: cannot resume from {base / 'resume' / 'checkpoints' / 'last.pth'}: model 'model' "
             f"parameter '0.bias' is shape (17,) now but shape (16,) in the checkpoint")
    assert out.count(f"The first error, on rank ") == 2 and out.count(error) >= 4, out[-3000:]
    assert "attempt 3 of 5 failed with the same error as attempt 2 (rank " in out, out[-3000:]
    assert "a deterministic failure, not restarted; exit code 1" in out.splitlines()[-1], out[-3000:]
    assert "attempt 4 of 5" not in out


def test_an_error_that_differs_between_attempts_is_retried(runs):
    base, results = runs
    out = results["flaky"].stdout
    assert results["flaky"].returncode == 1, out[-3000:]
    assert [attempt for attempt, _ in attempts(base, "flaky")] == [0, 0, 1, 1, 2, 2], out[-3000:]
    assert "attempt 2 of 3 failed (rank " in out and "(attempt 1)); restarting the world" in out, out[-3000:]
    assert "not restarted" not in out
    assert "RuntimeError: lost the connection to the node (attempt 2)); no restart left: exit code 1" in out


def test_a_failed_attempt_shows_one_traceback_the_peers_echo_after_it_and_ends_with_the_summary(runs):
    _, results = runs
    out = results["one rank fails"].stdout
    assert results["one rank fails"].returncode == 1, out[-3000:]
    lines = out.splitlines()
    # one traceback per attempt (2 attempts), the failing rank's, relayed once and not repeated by the launcher
    assert out.count("Traceback (most recent call last):") == 2, out[-6000:]
    assert out.count("[rank1]: Traceback (most recent call last):") == 2, out[-6000:]
    assert out.count("RuntimeError: the data at global batch 3 cannot be read") == 2 + 2 * 2, out[-6000:]
    assert "Last error output" not in out and out.count("The traceback of rank 1 is above.") == 2, out[-6000:]
    # rank 0's error (gloo's closed connection, or none when it was stopped first) only as a marked consequence
    echoes = [line for line in lines if "Connection closed" in line or "Connection reset" in line or
              line.startswith("[rank0]: RuntimeError")]
    assert all(line.startswith("The other ranks failed after it (consequences") for line in echoes), echoes
    summary = next(i for i, line in enumerate(lines) if line.endswith("; stopped the other ranks. The first error, "
                                                                     "on rank 1 at stage 'main', epoch 1, batch 3 of "
                                                                     "loader 'train' (global batch 3): RuntimeError: "
                                                                     "the data at global batch 3 cannot be read."))
    error = lines.index("[rank1]: RuntimeError: the data at global batch 3 cannot be read")
    assert error < summary and not any(line.startswith("[rank0]") for line in lines[error:summary]), lines[:summary]
    assert lines[-1].startswith("attempt 2 of 3 failed with the same error at the same point as attempt 1 (rank 1 at "
                                "stage 'main', epoch 1, batch 3 of loader 'train'"), lines[-5:]
    assert lines[-1].endswith("a deterministic failure, not restarted; exit code 1"), lines[-5:]
