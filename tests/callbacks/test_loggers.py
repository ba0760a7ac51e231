"""CSV and TensorBoard logs hold exactly the epoch metrics; read back from disk."""
import csv
import glob
import json
import struct

import pytest
import torch

from tests.conftest import regression_loaders
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


def test_tensorboard_scalars_read_back(run_dir):
    logdir, history = run_dir
    for loader in ("train", "valid"):
        scalars = read_tensorboard_scalars(logdir / "tensorboard" / loader)
        assert [step for step, _ in scalars["loss"]] == [1, 2, 3]
        for (_, value), entry in zip(scalars["loss"], history):
            assert value == pytest.approx(entry["metrics"][loader]["loss"], rel=1e-6)


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
