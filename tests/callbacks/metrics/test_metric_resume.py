"""Metric callbacks keep their partial state in mid-epoch checkpoints: a resumed epoch's metrics equal the
uninterrupted run's (loss, accuracy, AUC, a functional metric)."""
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import (AccuracyCallback, AUCCallback, Batch, Callback, Epoch, FunctionalMetricCallback, RunStopped,
                        SupervisedRunner, request_stop)


class StopAt(Callback):
    def __init__(self, at):
        self.at = at

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.at:
            request_stop("test")


def _train(logdir, extra=None, resume=None):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(52, 6, generator=g)
    y = (x[:, :1] + 0.5 * torch.randn(52, 1, generator=g) > 0).float()
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    callbacks = {"accuracy": AccuracyCallback(), "auc": AUCCallback(),
                 "mae": FunctionalMetricCallback(lambda o, t: (torch.sigmoid(o) - t).abs().mean(), name="mae"),
                 **(extra or {})}
    return SupervisedRunner().train(
        model=model, criterion=nn.BCEWithLogitsLoss(), optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
        loaders={"train": DataLoader(TensorDataset(x[:40], y[:40]), batch_size=4, shuffle=True),
                 "valid": DataLoader(TensorDataset(x[40:], y[40:]), batch_size=4)},
        logdir=str(logdir), num_epochs=2, seed=3, callbacks=callbacks, resume=resume,
        checkpoint_period=(Batch(3), Epoch(1)))


def _history(logdir):
    return json.loads((logdir / "checkpoints" / "metrics.json").read_text())["history"]


@pytest.mark.parametrize("stop_at", [7, 14])  # mid-epoch 1 (batch 7 of 10), mid-epoch 2 (batch 4)
def test_every_metric_of_a_resumed_epoch_equals_the_uninterrupted_run(tmp_path, stop_at):
    _train(tmp_path / "straight")
    with pytest.raises(RunStopped):
        _train(tmp_path / "resumed", extra={"stop_at": StopAt(stop_at)})
    _train(tmp_path / "resumed", resume="last")
    straight, resumed = _history(tmp_path / "straight"), _history(tmp_path / "resumed")
    assert [e["metrics"] for e in resumed] == [e["metrics"] for e in straight]
    assert set(straight[0]["metrics"]["train"]) >= {"loss", "accuracy", "auc", "mae"}
