"""Checkpoint and log files land off the training thread, in order; a failed write fails the run and deletes
nothing; a log file that stalls never stalls training."""
import csv
import os
import threading
import time

import pytest
import torch

from tests.callbacks.loggers.test_loggers import read_tensorboard_scalars
from tests.resume_helpers import tiny_train_kwargs
from torchstage import Callback, CheckpointError, SupervisedRunner, load_checkpoint
from torchstage.files import atomic
from torchstage.files.writer import FileWriter
from torchstage.files.log_files import LogFiles


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
    writer, ran = FileWriter(max_pending=2), []  # room for the gate and the failing job
    gate = threading.Event()
    writer.submit(gate.wait)  # hold the thread so that all three jobs are queued before the failure runs

    def fail():
        raise CheckpointError("could not write checkpoint 'x.pth': No space left on device")
    writer.submit(fail)
    writer.submit(lambda: ran.append("after the failure"), large=False)  # as the run hands over a deletion
    gate.set()
    with pytest.raises(CheckpointError, match="No space left on device"):
        writer.wait()
    assert ran == []  # queued behind the failure: skipped (e.g. the deletion of an older top-k file)
    writer.submit(lambda: ran.append("next"))
    writer.close()
    assert ran == ["next"]


def test_large_jobs_wait_for_a_free_slot_and_small_ones_never_do():
    """At most ``max_pending`` serialized checkpoints are held (the one being written included); a log row
    handed over meanwhile is queued at once, and everything still runs in the order it was handed over."""
    writer, seen, gate = FileWriter(max_pending=2), [], threading.Event()
    writer.submit(lambda: (gate.wait(10), seen.append("large 1")))  # being written, held
    writer.submit(lambda: seen.append("large 2"))  # waits in memory
    writer.submit(lambda: seen.append("small"), large=False)  # returns at once
    third = threading.Thread(target=writer.submit, args=(lambda: seen.append("large 3"),))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # blocked: two large jobs unfinished
    gate.set()
    third.join(10)
    assert not third.is_alive()
    writer.close()
    assert seen == ["large 1", "large 2", "small", "large 3"]


def test_light_jobs_handed_to_an_idle_thread_are_held_and_land_together_ahead_of_the_next_checkpoint():
    """Log rows of a loader's end do not wake the thread one by one: they land, in order, with the checkpoint."""
    writer, seen = FileWriter(hold_seconds=60), []
    writer.submit(lambda: seen.append("train row"), large=False)
    writer.submit(lambda: seen.append("valid row"), large=False)
    time.sleep(0.3)
    assert seen == []  # held: the idle thread was not woken for them
    writer.submit(lambda: seen.append("checkpoint"))
    writer.submit(lambda: seen.append("metrics.json"), large=False)  # the thread is awake: queued at once
    writer.wait()
    assert seen == ["train row", "valid row", "checkpoint", "metrics.json"]
    writer.submit(lambda: seen.append("last row"), large=False)
    writer.close()  # a held job still lands when the run ends
    assert seen[-1] == "last row"


def test_a_held_light_job_lands_within_hold_seconds_with_nothing_else_handed_over():
    writer, landed = FileWriter(hold_seconds=0.2), threading.Event()
    threads = []
    writer.submit(lambda: (threads.append(threading.current_thread().name), landed.set()), large=False)
    assert landed.wait(10), "a held log row never landed"
    assert threads == ["torchstage-file-writer"]
    writer.close()


def test_a_light_job_handed_over_while_a_checkpoint_is_written_follows_it_without_waiting_to_be_due():
    writer, gate, landed = FileWriter(hold_seconds=60), threading.Event(), threading.Event()
    writer.submit(lambda: gate.wait(10))
    writer.submit(landed.set, large=False)
    gate.set()
    assert landed.wait(10)  # not held for 60 s: the thread was awake anyway
    writer.close()


def test_a_failure_among_held_jobs_stops_the_ones_after_it():
    writer, seen = FileWriter(hold_seconds=60), []

    def fail():
        raise OSError("No space left on device")
    for job in (lambda: seen.append(1), fail, lambda: seen.append(3)):
        writer.submit(job, large=False)
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    assert seen == [1]
    writer.close()


def test_log_rows_and_events_are_written_by_the_file_writer_thread_and_a_stalled_log_never_stalls_training(
        tmp_path, monkeypatch):
    """The first log write blocks until epoch 2 has started: were logs written in the training thread, the
    run would never get there. Every row and event still lands, in order, before the run returns. (Epoch 2's
    checkpoint waits for epoch 1's, queued behind the stalled row: no two saves overlap.)"""
    real_append, threads, released = LogFiles._append, set(), threading.Event()

    def stalled_append(self, path, data):
        threads.add(threading.current_thread().name)
        assert released.wait(30), "training waited on a log write"
        real_append(self, path, data)
    monkeypatch.setattr(LogFiles, "_append", stalled_append)

    class ReleaseAtEpochTwo(Callback):
        def on_epoch_start(self, runner):
            if runner.epoch == 2:
                released.set()

    SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path), num_epochs=4), callbacks=[ReleaseAtEpochTwo()])
    assert threads == {"torchstage-file-writer"}
    for loader in ("train", "valid"):
        rows = list(csv.DictReader(open(tmp_path / "logs" / f"{loader}.csv")))
        assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
        scalars = read_tensorboard_scalars(tmp_path / "tensorboard" / loader)
        assert [step for step, _ in scalars["loss"]] == [1, 2, 3, 4]


def _recording_writes(monkeypatch, fail_at=None):
    """Record (file name, thread) of each checkpoint file write; raise like a full disk at write ``fail_at``."""
    real, writes = atomic._write_atomic_with, []

    def write_atomic_with(path, dump):
        writes.append((os.path.basename(path), threading.current_thread().name))
        if len(writes) == fail_at:
            raise CheckpointError(f"could not write checkpoint {path!r}: No space left on device; the previous "
                                  f"file, if any, is unchanged")
        real(path, dump)
    monkeypatch.setattr(atomic, "_write_atomic_with", write_atomic_with)
    return writes


def test_checkpoints_are_written_by_the_file_writer_thread(tmp_path, monkeypatch):
    writes = _recording_writes(monkeypatch)
    SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path), num_epochs=3))
    assert writes and {thread for _, thread in writes} == {"torchstage-file-writer"}
    assert load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["loop"]["global_epoch_step"] == 3


def test_a_failed_checkpoint_write_fails_the_run_and_leaves_the_last_good_one(tmp_path, monkeypatch):
    writes = _recording_writes(monkeypatch)
    SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path / "probe"), num_epochs=1, topk=1))
    per_epoch = len(writes)  # the files of one epoch: last, best, the kept epoch file
    SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path / "control"), num_epochs=2, topk=1))
    assert not (tmp_path / "control" / "checkpoints" / "epoch-0001.pth").exists()  # epoch 2 is better: dropped
    writes = _recording_writes(monkeypatch, fail_at=per_epoch + 1)  # the first file of epoch 2
    with pytest.raises(CheckpointError, match="No space left on device"):
        SupervisedRunner().train(**tiny_train_kwargs(str(tmp_path / "run"), num_epochs=4, topk=1))
    folder = tmp_path / "run" / "checkpoints"
    assert load_checkpoint(str(folder / "last.pth"))["loop"]["global_epoch_step"] == 1
    assert (folder / "epoch-0001.pth").exists()  # nothing queued after the failure ran: no top-k file deleted
    assert not list(folder.glob(".*.tmp"))
    assert torch.load(str(folder / "last.pth"), weights_only=True)["format"] == "torchstage/1"


def test_an_async_save_holds_the_state_of_its_moment_and_tied_weights_once(tmp_path):
    """The file holds the weights as they were when the save was handed over, though training changed them in
    place before the writer's thread ran; tied weights share one copy, as in the live state."""
    from torchstage.distributed.engine import Engine
    from torchstage.strategies.single import SingleDevice
    encoder = torch.nn.Embedding(1000, 64)
    decoder = torch.nn.Linear(64, 1000, bias=False)
    decoder.weight = encoder.weight
    model = torch.nn.ModuleDict({"encoder": encoder, "decoder": decoder})
    before = encoder.weight.detach().clone()
    writer, gate = FileWriter(), threading.Event()
    writer.submit(gate.wait, large=False)  # the thread is busy: the save waits in the queue
    paths = [str(tmp_path / "best.pth"), str(tmp_path / "last.pth")]
    strategy = SingleDevice()
    strategy.connect(Engine())
    strategy.save_checkpoint({"format": "torchstage/1", "models": {"model": model.state_dict()}}, paths, writer)
    with torch.no_grad():
        encoder.weight.add_(1.0)  # training goes on in place
    gate.set()
    writer.close()  # landed, and no writer thread left for the next test
    for path in paths:
        saved = load_checkpoint(path)["models"]["model"]
        assert torch.equal(saved["encoder.weight"], before) and torch.equal(saved["decoder.weight"], before)
    assert os.path.getsize(paths[0]) < 1000 * 64 * 4 * 1.5  # the tied weight's storage once, not twice
    assert open(paths[0], "rb").read() == open(paths[1], "rb").read()
