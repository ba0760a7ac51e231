"""Slow ranks: a 2-process run checked before its first epoch (``preflight=True``), in which rank 1 computes slowly in
epochs 3 and 4 (a sleep in a callback, as a throttled GPU or a busy neighbour would). The straggler detector of the
default chain names it while it trains, and says when it recovered.

Usage: python scripts/slow_ranks.py LOGDIR, then torchstage diagnose LOGDIR and torchstage report LOGDIR -o OUT
"""
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, StragglerDetector, SupervisedRunner


class SlowRank(Callback):
    """Rank 1 sleeps 10 ms after each train batch of epochs 3 and 4."""

    def on_batch_end(self, runner):
        if runner.engine.rank == 1 and runner.is_train_loader and runner.epoch in (3, 4):
            time.sleep(0.010)


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 32, generator=g)
    y = (x[:, :4].sum(1, keepdim=True) > 0).float()
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
               "valid": DataLoader(TensorDataset(x, y), batch_size=256)}
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    SupervisedRunner().train(
        model=model, criterion=nn.BCEWithLogitsLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        loaders=loaders, num_epochs=16, logdir=sys.argv[1], distributed=True, nprocs=2,
        preflight=True,  # every rank's matmul, memory and links compared before the first epoch
        callbacks={"slow_rank": SlowRank(),
                   # the default detector, spelled out: 20 % above the others' median for 3 windows of 2 s
                   "stragglers": StragglerDetector(threshold=0.2, window=2.0, patience=3, min_share=0.05)})
