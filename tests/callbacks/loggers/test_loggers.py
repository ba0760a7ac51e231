"""CSV and TensorBoard logs hold exactly the epoch metrics; read back from disk."""
import csv
import glob
import json
import struct

import pytest
import torch

from tests.conftest import regression_loaders
from tests.helpers import tiny_run
from torchstage import SupervisedRunner


def read_tensorboard_scalars(folder):
    """Parse tensorboardX event files (TFRecord framing) into {tag: [(step, value)]}."""
    from tensorboardX.proto import event_pb2
    scalars = {}
    for path in sorted(glob.glob(f"{folder}/events.out.tfevents.*")):
        data = open(path, "rb").read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("run")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    stages = {"warmup": {"num_epochs": 2}, "main": {"num_epochs": 1,
                                                    "optimizer": torch.optim.SGD(model.parameters(), lr=0.01)}}
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
                             loaders=regression_loaders(), stages=stages, logdir=str(logdir))
    history = json.loads((logdir / "checkpoints" / "metrics.json").read_text())["history"]
    return logdir, history


def test_csv_rows_equal_epoch_metrics(run_dir):
    logdir, history = run_dir
    for loader in ("train", "valid"):
        rows = list(csv.DictReader(open(logdir / "logs" / f"{loader}.csv")))
        assert [(r["stage"], int(r["epoch"]), int(r["global_epoch"])) for r in rows] == \
            [("warmup", 1, 1), ("warmup", 2, 2), ("main", 1, 3)]
        for row, entry in zip(rows, history):
            assert float(row["loss"]) == pytest.approx(entry["metrics"][loader]["loss"], rel=1e-12)
    train_rows = list(csv.DictReader(open(logdir / "logs" / "train.csv")))
    assert [float(r["lr"]) for r in train_rows] == [0.05, 0.05, 0.01]


def test_csv_gains_a_column_that_appears_in_a_later_epoch_and_keeps_every_row(tmp_path):
    """Rows are appended while the columns stay; a new metric rewrites the file with the column added."""
    from torchstage import Callback, CallbackOrder

    class FromEpochTwo(Callback):
        order = CallbackOrder.MetricAggregation + 1

        def on_loader_end(self, runner):
            if runner.epoch >= 2:
                runner.loader_metrics["extra"] = float(runner.epoch)

    model = torch.nn.Linear(4, 1)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                      loaders=regression_loaders(), num_epochs=4, logdir=str(tmp_path),
                                      callbacks=[FromEpochTwo()])
    rows = list(csv.DictReader(open(tmp_path / "logs" / "valid.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert [r["extra"] for r in rows] == ["", "2.0", "3.0", "4.0"]
    assert float(rows[-1]["loss"]) == pytest.approx(runner.epoch_metrics["valid"]["loss"], rel=1e-12)


def test_resumed_run_cuts_the_csv_back_to_the_checkpoint_and_never_repeats_an_epoch(tmp_path):
    """A row written after the last checkpoint (a kill between the log and the checkpoint) is dropped on resume."""
    def train(num_epochs, **kwargs):
        return tiny_run(torch_seed=0, sgd_lr=0.05, num_epochs=num_epochs, logdir=str(tmp_path), **kwargs)

    train(2)
    path = tmp_path / "logs" / "valid.csv"
    with open(path, "a") as f:
        f.write("main,3,3,999.0\n")  # the row of an epoch whose checkpoint never landed
    runner = train(4, resume="last")
    rows = list(csv.DictReader(open(path)))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[-1]["loss"]) == pytest.approx(runner.epoch_metrics["valid"]["loss"], rel=1e-12)
    assert runner.callbacks["csv"].state_dict()["epoch_rows"] == {"train": 4, "valid": 4}


def test_tensorboard_scalars_read_back(run_dir):
    logdir, history = run_dir
    for loader in ("train", "valid"):
        scalars = read_tensorboard_scalars(logdir / "tensorboard" / loader)
        assert [step for step, _ in scalars["loss"]] == [1, 2, 3]
        for (_, value), entry in zip(scalars["loss"], history):
            assert value == pytest.approx(entry["metrics"][loader]["loss"], rel=1e-6)


def test_tensorboard_itself_reads_the_event_files(run_dir):
    """TensorBoard's own loader (which checks every record's CRC-32C) reads the scalars and the HParams session."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    logdir, history = run_dir
    for loader in ("train", "valid"):
        accumulator = EventAccumulator(str(logdir / "tensorboard" / loader)).Reload()
        events = accumulator.Scalars("loss")
        assert [e.step for e in events] == [1, 2, 3]
        assert [e.value for e in events] == pytest.approx([h["metrics"][loader]["loss"] for h in history], rel=1e-6)
    top = EventAccumulator(str(logdir / "tensorboard")).Reload()
    assert set(top.PluginTagToContent("hparams")) == {"_hparams_/experiment", "_hparams_/session_start_info",
                                                      "_hparams_/session_end_info"}


def test_console_summary_per_epoch(tmp_path, caplog):
    import logging
    caplog.set_level(logging.INFO, logger="torchstage")
    model = torch.nn.Linear(4, 1)
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                             loaders=regression_loaders(), num_epochs=2)
    lines = [r.getMessage() for r in caplog.records if "epoch" in r.getMessage()]
    assert lines[0].startswith("[main] epoch 1/2 | train: loss=") and "| valid: loss=" in lines[0]
    assert lines[1].startswith("[main] epoch 2/2")


def test_one_csv_logger_passed_to_two_runs_writes_each_logdir_whole(tmp_path):
    """The files a logger keeps open belong to one run: a second run (another logdir) starts its own files."""
    from torchstage import CSVLogger
    logger = CSVLogger()
    for name in ("first", "second"):
        model = torch.nn.Linear(4, 1)
        runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                          optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                          loaders=regression_loaders(), num_epochs=2, logdir=str(tmp_path / name),
                                          callbacks={"csv": logger})
        rows = list(csv.DictReader(open(tmp_path / name / "logs" / "valid.csv")))
        assert [int(r["epoch"]) for r in rows] == [1, 2]
        assert float(rows[-1]["loss"]) == pytest.approx(runner.epoch_metrics["valid"]["loss"], rel=1e-12)
