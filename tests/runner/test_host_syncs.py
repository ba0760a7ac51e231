"""No host-device sync per batch in the default chain: torchstage's syncs do not grow with the batch count."""
import os
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchstage
from torchstage import AccuracyCallback, SupervisedRunner

PACKAGE = os.path.dirname(torchstage.__file__)
SYNCS = ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__")


@pytest.fixture
def count_syncs(monkeypatch):
    """Wrap Tensor methods that copy to the host; count only calls made from torchstage's own files."""
    counts = {}
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(PACKAGE):
                counts[_name] = counts.get(_name, 0) + 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return counts


def run(num_batches, tmp_path, verbose=False):
    X = torch.randn(num_batches * 8, 6)
    y = torch.randint(0, 3, (num_batches * 8,))
    loader = DataLoader(TensorDataset(X, y), batch_size=8)
    model = torch.nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(), optimizer=optimizer,
                             scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1),
                             loaders={"train": loader, "valid": loader}, num_epochs=2, logdir=str(tmp_path),
                             callbacks=[AccuracyCallback(topk=(1, 2))], verbose=verbose, overwrite=True)


@pytest.mark.parametrize("verbose", [False, True])
def test_syncs_do_not_grow_with_batches(tmp_path, count_syncs, verbose):
    run(5, tmp_path / "small", verbose)
    small = dict(count_syncs)
    count_syncs.clear()
    run(20, tmp_path / "large", verbose)
    large = dict(count_syncs)
    assert sum(small.values()) > 0  # the wrapper does see torchstage's loader-end reads
    # the progress bar may read the loss at most every 0.5 s: allow that bounded rate, not per batch
    slack = 4 if verbose else 0
    assert sum(large.values()) <= sum(small.values()) + slack, (small, large)
