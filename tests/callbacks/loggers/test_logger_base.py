"""The logger protocol: what every logger receives, batch rows kept exact across a resume, hparams in TensorBoard."""
import csv
import glob
import json
import struct

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.callbacks.loggers.test_loggers import read_tensorboard_scalars
from tests.helpers import tiny_run
from torchstage import Batch, Callback, LoggerCallback
from torchstage.callbacks.checkpoints.config_saver import ConfigSaver
from torchstage.callbacks.loggers.logger_base import BATCH, EPOCH, PERIODIC


class Recorder(LoggerCallback):
    """Keeps every call it receives."""

    def __init__(self, log_period=None):
        super().__init__(log_period)
        self.hparams, self.metrics, self.artifacts, self.closed = [], [], [], []

    def log_hparams(self, hparams, runner):
        self.hparams.append(hparams)

    def log_metrics(self, metrics, step, loader, scope, runner):
        self.metrics.append((scope, loader, step, dict(metrics)))

    def log_artifact(self, path, runner, kind="file"):
        self.artifacts.append((kind, path))

    def close(self, runner, status):
        self.closed.append(status)


def train(logdir, callbacks, num_epochs=2, **kwargs):
    torch.manual_seed(0)
    x, y = torch.randn(80, 4), torch.randn(80, 1)
    return tiny_run(sgd_lr=0.05, num_epochs=num_epochs, logdir=str(logdir), callbacks=callbacks,
                    loaders={"train": DataLoader(TensorDataset(x, y), batch_size=8),
                             "valid": DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8)}, **kwargs)


def test_a_logger_receives_hparams_metrics_batches_periodic_and_artifacts(tmp_path):
    follows, own = Recorder(), Recorder(log_period=Batch(5))
    runner = train(tmp_path, {"a": follows, "b": own}, log_period=Batch(4), valid_period=Batch(10))
    (hparams,) = follows.hparams
    assert hparams["num_epochs"] == 2 and hparams["lr"] == 0.05 and hparams["world_size"] == 1
    assert hparams["log_period"] == "Batch(4)" and hparams["optimizer"] == "SGD" and "loaders" not in hparams
    epochs = [(loader, step, m) for scope, loader, step, m in follows.metrics if scope == EPOCH]
    assert epochs == [("train", 1, epochs[0][2]), ("valid", 1, epochs[1][2]), ("train", 2, runner.epoch_metrics["train"]),
                      ("valid", 2, runner.epoch_metrics["valid"])]
    assert [step for scope, _, step, _ in follows.metrics if scope == BATCH] == [4, 8, 12, 16, 20]
    assert [step for scope, _, step, _ in own.metrics if scope == BATCH] == [5, 10, 15, 20]
    assert all(isinstance(m["loss"], float) for scope, _, _, m in follows.metrics if scope == BATCH)
    assert [(loader, step) for scope, loader, step, _ in follows.metrics if scope == PERIODIC] == \
        [("valid", 10), ("valid", 20)]
    assert follows.artifacts == [("summary", str(tmp_path / "model_summary.txt"))]
    assert follows.closed == own.closed == ["FINISHED"]


class FailAt(Callback):
    order = 500

    def __init__(self, step):
        self.step = step

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.step:
            raise RuntimeError("boom")


def test_csv_batch_rows_are_cut_back_to_the_checkpoint_on_resume(tmp_path):
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        train(tmp_path, {"fail": FailAt(25), "rec": recorder}, num_epochs=3, log_period=Batch(2))
    assert recorder.closed == ["FAILED"]
    rows = list(csv.DictReader(open(tmp_path / "logs" / "batch" / "train.csv")))
    assert [int(r["step"]) for r in rows] == list(range(2, 25, 2))  # 22 and 24 come after the epoch-2 checkpoint
    train(tmp_path, None, num_epochs=3, log_period=Batch(2), resume="last")
    rows = list(csv.DictReader(open(tmp_path / "logs" / "batch" / "train.csv")))
    assert [int(r["step"]) for r in rows] == list(range(2, 31, 2))
    assert [r["epoch"] for r in rows] == ["1"] * 5 + ["2"] * 5 + ["3"] * 5
    tb = read_tensorboard_scalars(tmp_path / "tensorboard" / "train")["batch/loss"]
    by_step = dict(tb)  # TensorBoard keeps both writes of steps 22 and 24; the resumed values are the last
    assert [float(r["loss"]) for r in rows] == pytest.approx([by_step[s] for s in range(2, 31, 2)], rel=1e-6)


def read_hparams_plugin(folder):
    from tensorboardX.proto import event_pb2
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    found = {}
    for path in glob.glob(f"{folder}/events.out.tfevents.*"):
        data, offset = open(path, "rb").read(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    found[value.tag] = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    return found


def test_tensorboard_and_csv_get_the_hparams_and_the_config(tmp_path):
    train(tmp_path, {"config": ConfigSaver("num_epochs: 2\noptimizer:\n  _target_: torch.optim.SGD\n  lr: 0.05\n")})
    plugin = read_hparams_plugin(tmp_path / "tensorboard")
    start = plugin["_hparams_/session_start_info"].session_start_info.hparams
    assert start["num_epochs"].number_value == 2 and start["lr"].number_value == 0.05
    assert start["optimizer"].string_value == "SGD" and start["config.optimizer.lr"].number_value == 0.05
    (metric,) = plugin["_hparams_/experiment"].experiment.metric_infos
    assert (metric.name.group, metric.name.tag) == ("valid", "loss")
    assert plugin["_hparams_/session_end_info"].session_end_info.status == 1  # STATUS_SUCCESS
    saved = json.load(open(tmp_path / "logs" / "hparams.json"))
    assert saved["config.optimizer._target_"] == "torch.optim.SGD" and saved["world_size"] == 1


def test_a_graceful_stop_closes_loggers_as_stopped(tmp_path):
    from torchstage import RunStopped, request_stop

    class StopAt(Callback):
        order = 500

        def on_batch_end(self, runner):
            if runner.is_train_loader and runner.global_batch_step == 13:
                request_stop("time limit")

    recorder = Recorder()
    with pytest.raises(RunStopped):
        train(tmp_path, {"stop_at": StopAt(), "rec": recorder}, num_epochs=3)
    assert recorder.closed == ["STOPPED"]
    resumed = Recorder()
    train(tmp_path, {"rec": resumed}, num_epochs=3, resume="last")
    assert resumed.closed == ["FINISHED"] and len(resumed.hparams) == 1
    assert [step for scope, loader, step, _ in resumed.metrics if scope == EPOCH and loader == "valid"] == [2, 3]
