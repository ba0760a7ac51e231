"""A run whose loss turns NaN at one global train batch (NAN_AT_BATCH), for the non-finite loss tests.

Usage: python nan_run.py LOGDIR [skip | resume]   (resume: resume='last' without any poison)
Environment: NAN_AT_BATCH (default 10), POISON_RANK (default: every rank), PERIOD (batch checkpoint period),
NPROC=2 (two gloo processes through distributed=True), NAN_GRAD_AT_BATCH=n (instead of the loss, the gradient
of the first layer's weight turns NaN at global train batch n: the loss stays finite, the weights do not).
"""
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, CallbackOrder, Epoch, NonFiniteLossCallback, SupervisedRunner


class PoisonLoss(Callback):
    """Turns the loss NaN at global train batch ``at`` (after the criterion, before the watcher)."""

    order = CallbackOrder.Metric + 1

    def __init__(self, at, rank=None):
        self.at, self.rank = at, rank

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.at and self.rank in (None, runner.engine.rank):
            runner.batch_metrics["loss"] = runner.batch_metrics["loss"] * float("nan")


class PoisonGradient(Callback):
    """Makes the first layer's weight gradient NaN at global train batch ``at`` (the loss stays finite)."""

    order = CallbackOrder.Metric + 1

    def __init__(self, at):
        self.at, self.hooked = at, False

    def on_batch_end(self, runner):
        if not self.hooked:
            self.hooked = True
            weight = runner.unwrapped_model[0].weight
            weight.register_hook(lambda grad: grad * float("nan") if runner.global_batch_step == self.at else grad)


def main(logdir, mode="stop"):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(48, 6, generator=g), torch.randn(48, 1, generator=g)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    loaders = {"train": DataLoader(TensorDataset(x[:32], y[:32]), batch_size=4),  # 8 batches (4 per rank with 2)
               "valid": DataLoader(TensorDataset(x[32:], y[32:]), batch_size=4)}
    rank = os.environ.get("POISON_RANK")
    callbacks = {"poison": PoisonLoss(int(os.environ.get("NAN_AT_BATCH", 10)), None if rank is None else int(rank))}
    if os.environ.get("NAN_GRAD_AT_BATCH"):
        callbacks = {"poison": PoisonGradient(int(os.environ["NAN_GRAD_AT_BATCH"]))}
    if mode == "skip":
        callbacks["nonfinite"] = NonFiniteLossCallback(mode="skip")
    if mode == "resume":
        callbacks = {}
    nprocs = int(os.environ.get("NPROC", 1))
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                             loaders=loaders, num_epochs=3, logdir=logdir, callbacks=callbacks,
                             checkpoint_period=(Batch(int(os.environ.get("PERIOD", 1000))), Epoch(1)),
                             resume="last" if mode == "resume" else None,
                             distributed=True if nprocs > 1 else None, nprocs=nprocs if nprocs > 1 else None)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
