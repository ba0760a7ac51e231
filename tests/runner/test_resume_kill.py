"""SIGKILL at many points of a shuffled, random, two-stage run; resume='last' ends bitwise equal to no kill.

Each scenario kills a real child process (tests/runner/scripts/tiny_run.py), checks that the surviving
``last.pth`` loads, resumes it in a new process and compares the final checkpoint with an uninterrupted
run: weights, optimizer and scheduler states, loop position, metrics, callback states and RNG states.
Scenarios run two at a time (the whole module takes about 40-70 s on 2 idle cores).
"""
import json
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.resume_helpers import checkpoint_differences, run_tiny, start_tiny
from torchstage import load_checkpoint

SCENARIOS = {
    # name: environment of the first (killed) run; the global batch counts 10 train batches per epoch
    "mid-epoch between checkpoints": {"KILL_AT_BATCH": 5},
    "last train batch before validation": {"KILL_AT_BATCH": 10},
    "stage boundary": {"KILL_AT_EPOCH_END": 2},
    "mid-epoch in the second stage": {"KILL_AT_BATCH": 27},
    "inside a checkpoint write, before os.replace": {"KILL_IN_WRITE": 4},
    "inside a checkpoint write, in fsync": {"KILL_IN_FSYNC": 5},
    "SIGTERM: graceful stop": {"SIGNAL_AT_BATCH": 13},
}
EXIT_CODES = {"SIGTERM: graceful stop": 128 + signal.SIGTERM}


_EXTERNAL = "killed by the parent at a random moment"


def _kill_externally(logdir):
    """The parent kills the child at a random moment after it reached global batch 12."""
    proc = start_tiny(logdir, MARK_AT_BATCH=12)
    mark = os.path.join(os.path.dirname(logdir), "mark-12")
    deadline = time.monotonic() + 90
    while not os.path.exists(mark) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    return proc.returncode


def _scenario(base, name, env):
    logdir = os.path.join(base, name.replace(" ", "_").replace(",", ""), "logs")
    os.makedirs(os.path.dirname(logdir))
    if env is None:
        code, out = _kill_externally(logdir), ""
    else:
        killed = run_tiny(logdir, **env)
        code, out = killed.returncode, killed.stdout
    last = os.path.join(logdir, "checkpoints", "last.pth")
    survivor = load_checkpoint(last)["loop"] if os.path.exists(last) else None
    stale = [f for f in os.listdir(os.path.dirname(last)) if f.endswith(".tmp")] if survivor else []
    resumed = run_tiny(logdir, resume="last")
    return {"code": code, "out": out, "survivor": survivor, "stale": stale, "resumed": resumed, "last": last}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("kills"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        reference = pool.submit(run_tiny, os.path.join(base, "reference"))
        futures = {name: pool.submit(_scenario, base, name, env)
                   for name, env in [*SCENARIOS.items(), (_EXTERNAL, None)]}
        results = {name: f.result() for name, f in futures.items()}
        ref = reference.result()
    assert ref.returncode == 0, ref.stdout
    results["reference"] = os.path.join(base, "reference", "checkpoints", "last.pth")
    return results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [*SCENARIOS, _EXTERNAL])
def test_killed_run_resumes_bitwise_equal(runs, name):
    run = runs[name]
    assert run["code"] == EXIT_CODES.get(name, -signal.SIGKILL), run["out"][-2000:]
    assert run["survivor"] is not None, "the killed run left no loadable last.pth"
    assert run["resumed"].returncode == 0, run["resumed"].stdout[-3000:]
    assert checkpoint_differences(runs["reference"], run["last"]) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [*SCENARIOS, _EXTERNAL])
def test_every_checkpoint_file_ends_as_the_uninterrupted_run_wrote_it(runs, name):
    """Not only last.pth: best.pth, the kept epoch files and metrics.json, whatever moment the kill hit."""
    folder, reference = os.path.dirname(runs[name]["last"]), os.path.dirname(runs["reference"])
    names = sorted(f for f in os.listdir(reference) if not f.startswith("."))
    assert sorted(f for f in os.listdir(folder) if not f.startswith(".")) == names
    for file in names:
        if file.endswith(".pth"):
            assert checkpoint_differences(os.path.join(reference, file), os.path.join(folder, file)) == [], file
    with open(os.path.join(reference, "metrics.json")) as a, open(os.path.join(folder, "metrics.json")) as b:
        assert json.load(a) == json.load(b)


def test_kill_inside_a_write_leaves_the_previous_checkpoint(runs):
    # writes of a .pth: batch 3 (1), batch 6 (2), batch 9 (3), epoch 1 end best.pth (4): killed before replace
    run = runs["inside a checkpoint write, before os.replace"]
    assert run["survivor"]["global_batch_step"] == 9 and not run["survivor"]["epoch_done"]
    assert run["stale"], "the interrupted write should have left its temporary file"
    assert not [f for f in os.listdir(os.path.dirname(run["last"])) if f.endswith(".tmp")], \
        "the resumed run should have removed the stale temporary file"


def test_sigterm_stops_after_the_batch_with_a_checkpoint_and_a_log_line(runs):
    run = runs["SIGTERM: graceful stop"]
    assert run["survivor"]["global_batch_step"] == 13 and run["survivor"]["loader_batch"] == 3
    assert "graceful stop (SIGTERM) after stage 'warmup' epoch 2 batch 3 (global batch 13)" in run["out"]
    assert "resume='last'" in run["out"] and "exit code 143" in run["out"]


def test_kill_in_fsync_before_last_pth_leaves_the_previous_last(runs):
    # .pth writes: batches 3, 6, 9, then at epoch 1's end best.pth (4), epoch-0001.pth (5, killed in its fsync) and
    # last.pth (6), which goes last
    run = runs["inside a checkpoint write, in fsync"]
    assert run["survivor"]["global_batch_step"] == 9 and not run["survivor"]["epoch_done"]


def test_mid_epoch_survivor_is_the_last_batch_checkpoint(runs):
    assert runs["mid-epoch between checkpoints"]["survivor"]["global_batch_step"] == 3
    assert runs["stage boundary"]["survivor"]["stage"] == "warmup"
    assert runs["stage boundary"]["survivor"]["epoch_done"]


def test_resumed_run_logs_only_the_remaining_epochs(runs):
    out = runs["mid-epoch in the second stage"]["resumed"].stdout
    assert "[main] epoch 1/2" in out and "[main] epoch 2/2" in out
    assert "[warmup]" not in out
    assert torch.load(runs["reference"], weights_only=True)["loop"]["global_batch_step"] == 40
