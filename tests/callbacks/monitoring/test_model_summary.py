"""The model summary: exact parameter counts per top-level child, in the logdir and (verbose) on the console."""
import logging

import torch

from tests.conftest import regression_loaders
from torchstage import SupervisedRunner
from torchstage.callbacks.monitoring.model_summary import summarize


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16))
        self.head = torch.nn.Linear(16, 1)
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.body[0].requires_grad_(False)

    def forward(self, x):
        return self.head(self.body(x)) * self.scale


def test_counts_per_child_and_total():
    rows = {name: (kind, params, trainable, mb) for name, kind, params, trainable, mb in summarize(Net())}
    assert rows["body"][:3] == ("Sequential", 4 * 16 + 16 + 32, 32)
    assert rows["head"][:3] == ("Linear", 17, 17)
    assert rows["(own parameters)"][1:3] == (1, 1)
    assert rows["total"][:3] == ("Net", 80 + 32 + 17 + 1, 32 + 17 + 1)
    # float32 parameters and buffers (BatchNorm's running mean/var and the int64 batch counter)
    assert rows["total"][3] == (130 * 4 + 32 * 4 + 8) / 2**20


def run(tmp_path, verbose):
    model = Net()
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders=regression_loaders(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.01), logdir=str(tmp_path),
                             verbose=verbose)


def test_written_to_the_logdir_and_logged_when_verbose(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="torchstage")
    run(tmp_path / "quiet", verbose=False)
    text = (tmp_path / "quiet" / "model_summary.txt").read_text()
    lines = [line.split() for line in text.splitlines()]
    assert ["body", "Sequential", "112", "32", "0.001"] in lines and ["total", "Net", "130", "50", "0.001"] in lines
    assert not any("Sequential" in r.getMessage() for r in caplog.records)
    run(tmp_path / "verbose", verbose=True)
    assert any(r.getMessage() == text.rstrip() for r in caplog.records)
