"""A pipeline of 2 stages on 2 processes whose last stage stops at its third train batch: the hang watchdog names
the stage and the send/recv the first stage waits in (the pipeline hang test).

Usage: python pipeline_hang.py LOGDIR
"""
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline_run import Net  # noqa: E402
from mesh_run import LENGTH, Indexed  # noqa: E402

from torchstage import Callback, Pipeline, SupervisedRunner  # noqa: E402


class Stall(Callback):
    """The last stage stops (outside any collective) before its third train batch."""

    def __init__(self):
        super().__init__(order=0)

    def on_batch_start(self, runner):
        if runner.engine.rank == 1 and runner.is_train_loader and runner.batch_step == 3:
            time.sleep(600)


if __name__ == "__main__":
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, LENGTH, 6, generator=g), torch.randn(64, 1, generator=g)
    loader = DataLoader(Indexed(x, y), batch_size=4)
    model = Net()
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.AdamW(model.parameters()),
                             loaders={"train": loader, "valid": loader}, callbacks={"stall": Stall()},
                             logdir=sys.argv[1], num_epochs=1, distributed=True, nprocs=2, hang_timeout=8,
                             strategy=Pipeline(2, n_microbatches=2, min_params=50))
