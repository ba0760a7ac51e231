"""valid_every=N: non-train loaders run on epochs N, 2N, ... and on each stage's last epoch."""
import csv

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import SupervisedRunner


def test_valid_every_three_epochs(tmp_path):
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    model = nn.Linear(3, 1)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=8),
               "valid": DataLoader(TensorDataset(x, y), batch_size=8),
               "test": DataLoader(TensorDataset(x, y), batch_size=8)}
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, num_epochs=7, valid_every=3,
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.01), logdir=str(tmp_path))

    def epochs(loader):
        with open(tmp_path / "logs" / f"{loader}.csv") as f:
            return [int(row["epoch"]) for row in csv.DictReader(f)]

    assert epochs("train") == [1, 2, 3, 4, 5, 6, 7]
    assert epochs("valid") == epochs("test") == [3, 6, 7]
    history = [e.get("value") for e in __import__("json").loads(
        (tmp_path / "checkpoints" / "metrics.json").read_text())["history"]]
    assert [v is not None for v in history] == [False, False, True, False, False, True, True]


def test_valid_every_must_be_positive():
    model = nn.Linear(3, 1)
    loaders = {"train": [(torch.randn(2, 3), torch.randn(2, 1))], "valid": [(torch.randn(2, 3), torch.randn(2, 1))]}
    with pytest.raises(ValueError, match="valid_every must be an integer >= 1, got 0"):
        SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, valid_every=0,
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
