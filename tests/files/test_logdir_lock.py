"""One writer per logdir: a second run on a held logdir is refused; stale and requeued locks are taken over."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.resume_helpers import start_tiny, tiny_train_kwargs
from torchstage import LogdirLocked, SupervisedRunner, load_checkpoint
from torchstage.files.lock import LOCK_NAME, LogdirLock


def _wait_for(path, proc, timeout=60):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("second_resume", [None, "last"])
def test_a_second_run_on_a_held_logdir_is_refused_and_the_first_runs_intact(tmp_path, second_resume):
    logdir = tmp_path / "run"
    go = tmp_path / "go"
    first = start_tiny(logdir, MARK_AT_BATCH=12, MARK_HOLD=go)  # waits at global batch 12 until `go` exists
    _wait_for(tmp_path / "mark-12", first)
    second = start_tiny(logdir, second_resume)
    out2, _ = second.communicate(timeout=120)
    go.touch()
    out1, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out1
    assert second.returncode != 0, out2
    holder = f"pid {first.pid} on host {socket.gethostname()}"
    assert "is being written by another run" in out2 and holder in out2, out2
    last = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))
    assert (last["loop"]["stage"], last["loop"]["epoch"], last["loop"]["epoch_done"]) == ("main", 2, True)
    assert last["loop"]["global_batch_step"] == 40  # the first run's whole run, not restarted by the second
    assert not (logdir / LOCK_NAME).exists()  # released at the end


def test_a_stale_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid,
                                                  "started": "2026-01-01T00:00:00"}))
    caplog.set_level("WARNING", logger="torchstage")
    runner = SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path), num_epochs=1))
    assert runner.global_epoch_step == 1
    assert f"taking over from pid {dead.pid}" in caplog.text and "that process is gone" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_live_holder_on_another_host_is_named_and_its_lock_kept(tmp_path):
    holder = {"host": "node-that-is-not-here", "pid": 4321, "started": "2026-01-01T00:00:00",
              "slurm_job_id": "777"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
    with pytest.raises(LogdirLocked, match="pid 4321 on host node-that-is-not-here since 2026-01-01T00:00:00, "
                                           "SLURM job 777"):
        SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path), num_epochs=1))
    assert json.loads((tmp_path / LOCK_NAME).read_text()) == holder
    assert not (tmp_path / "checkpoints").exists()  # nothing written


def test_a_requeued_slurm_job_takes_over_its_own_lock_from_another_node(tmp_path, monkeypatch):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "node-before-requeue", "pid": 4321,
                                                  "started": "2026-01-01T00:00:00", "slurm_job_id": "4242"}))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    lock = LogdirLock(str(tmp_path))
    lock.acquire()
    mine = json.loads((tmp_path / LOCK_NAME).read_text())
    assert (mine["pid"], mine["host"], mine["slurm_job_id"]) == (os.getpid(), socket.gethostname(), "4242")
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.parametrize("variable, job", [("TORCHELASTIC_RUN_ID", "torchelastic_run"),
                                           ("TORCHSTAGE_JOB_ID", "torchstage_job")])
def test_a_restarted_job_takes_over_its_own_lock_from_another_node_and_a_new_one_does_not(tmp_path, monkeypatch,
                                                                                        variable, job):
    holder = {"host": "node-before-restart", "pid": 4321, "started": "2026-01-01T00:00:00", "job": {job: "run-7"}}
    (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
    monkeypatch.setenv(variable, "run-7")
    monkeypatch.setenv("TORCHSTAGE_RESTART_COUNT", "0")  # the job's first attempt: the holder is a live other run
    with pytest.raises(LogdirLocked):
        LogdirLock(str(tmp_path)).acquire()
    monkeypatch.setenv("TORCHSTAGE_RESTART_COUNT", "1")  # restarted: its own earlier attempt held it
    lock = LogdirLock(str(tmp_path))
    lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["job"][job] == "run-7"
    lock.release()


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    kwargs = tiny_train_kwargs(str(tmp_path), num_epochs=1)

    class Boom(Exception):
        pass

    from torchstage import Callback

    class Fail(Callback):
        def on_epoch_end(self, runner):
            raise Boom()

    with pytest.raises(Boom):
        SupervisedRunner().train(**kwargs, callbacks=[Fail()])
    assert not (tmp_path / LOCK_NAME).exists()
    SupervisedRunner().train(**kwargs, resume="last")  # the same process may run there again
