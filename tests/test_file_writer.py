"""Checkpoint files land off the training thread, in order; a failed write fails the run and deletes nothing."""
import os
import threading

import pytest
import torch

from tests.resume_helpers import tiny_train_kwargs
from torchstage import CheckpointError, SupervisedRunner, load_checkpoint
from torchstage import checkpoint
from torchstage.file_writer import FileWriter


def test_jobs_run_in_order_on_one_other_thread():
    writer, seen = FileWriter(max_pending=2), []
    for i in range(20):
        writer.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    writer.wait()
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"torchstage-file-writer"}
    writer.close()
    assert not any(t.name == "torchstage-file-writer" for t in threading.enumerate())


def test_a_failed_job_stops_the_queue_and_is_raised_once_in_the_caller():
    writer, ran = FileWriter(), []
    gate = threading.Event()
    writer.submit(gate.wait)  # hold the thread so that all three jobs are queued before the failure runs

    def fail():
        raise CheckpointError("could not write checkpoint 'x.pth': No space left on device")
    writer.submit(fail)
    writer.submit(lambda: ran.append("after the failure"))
    gate.set()
    with pytest.raises(CheckpointError, match="No space left on device"):
        writer.wait()
    assert ran == []  # queued behind the failure: skipped (e.g. the deletion of an older top-k file)
    writer.submit(lambda: ran.append("next"))
    writer.close()
    assert ran == ["next"]


def _recording_writes(monkeypatch, fail_at=None):
    """Record (file name, thread) of each checkpoint file write; raise like a full disk at write ``fail_at``."""
    real, writes = checkpoint.write_atomic, []

    def write_atomic(path, data, durable=True, sync_folder=True):
        writes.append((os.path.basename(path), threading.current_thread().name))
        if len(writes) == fail_at:
            raise CheckpointError(f"could not write checkpoint {path!r}: No space left on device; the previous "
                                  f"file, if any, is unchanged")
        real(path, data, durable, sync_folder)
    monkeypatch.setattr(checkpoint, "write_atomic", write_atomic)
    return writes


def test_checkpoints_are_written_by_the_file_writer_thread(tmp_path, monkeypatch):
    writes = _recording_writes(monkeypatch)
    SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path), num_epochs=3))
    assert writes and {thread for _, thread in writes} == {"torchstage-file-writer"}
    assert load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["loop"]["global_epoch_step"] == 3


def test_a_failed_checkpoint_write_fails_the_run_and_leaves_the_last_good_one(tmp_path, monkeypatch):
    writes = _recording_writes(monkeypatch)
    SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path / "probe"), num_epochs=1))
    per_epoch = len(writes)  # the files of one epoch: last, best, the kept epoch file
    SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path / "control"), num_epochs=2))
    assert not (tmp_path / "control" / "checkpoints" / "epoch-0001.pth").exists()  # epoch 2 is better: dropped
    writes = _recording_writes(monkeypatch, fail_at=per_epoch + 1)  # the first file of epoch 2
    with pytest.raises(CheckpointError, match="No space left on device"):
        SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path / "run"), num_epochs=4))
    folder = tmp_path / "run" / "checkpoints"
    assert load_checkpoint(str(folder / "last.pth"))["loop"]["global_epoch_step"] == 1
    assert (folder / "epoch-0001.pth").exists()  # nothing queued after the failure ran: no top-k file deleted
    assert not list(folder.glob(".*.tmp"))
    assert torch.load(str(folder / "last.pth"), weights_only=True)["format"] == "torchstage/1"
