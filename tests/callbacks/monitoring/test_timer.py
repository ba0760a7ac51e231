"""timeit=True: data time and compute time per batch are measured where they are spent."""
import csv
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchstage import Callback, CallbackOrder, SupervisedRunner


class Slow(Dataset):
    """Each item takes 10 ms to load."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((4,), float(i)), torch.zeros(1)


class SlowStep(Callback):
    """Each train batch takes 30 ms more to compute."""

    order = CallbackOrder.Optimizer

    def on_batch_end(self, runner):
        if runner.is_train_loader:
            time.sleep(0.03)


def test_timeit_logs_data_and_compute_time_per_batch(tmp_path):
    model = nn.Linear(4, 1)
    loaders = {"train": DataLoader(Slow(), batch_size=2), "valid": DataLoader(Slow(), batch_size=4)}
    runner = SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, timeit=True,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                                      callbacks=[SlowStep()], logdir=str(tmp_path))
    train, valid = runner.epoch_metrics["train"], runner.epoch_metrics["valid"]
    assert 0.02 <= train["time_data"] < 0.2  # 2 items x 10 ms per batch
    assert 0.03 <= train["time_batch"] < 0.3
    assert train["samples_per_s"] <= 2 / 0.05
    assert 0.04 <= valid["time_data"]  # 4 items per batch
    assert valid["time_batch"] < train["time_batch"]  # the slow step runs on train batches only
    with open(tmp_path / "logs" / "train.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["time_data"]) == train["time_data"] and "samples_per_s" in row
