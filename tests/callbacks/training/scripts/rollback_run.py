"""A run over data with a poisoned sample (NaN features) and a spiking one (features x 1e4), for the rollback tests.

Usage: python rollback_run.py LOGDIR [rollback | reference | resume]
  rollback   NonFiniteLossCallback(mode="rollback", spike=LossSpike(...)): rolls back past the bad batches
  reference  the loaders leave out the batches of REFERENCE_DROPS (a JSON list of [global epoch, ordinal]) and the
             run stops at any bad loss (mode="stop", the same spike rule): what a rollback run must equal
  resume     as rollback, with resume="last"
Environment: NPROC=2 (two gloo processes through distributed=True), CHECK_EVERY (3), PERIOD (a batch checkpoint
period), KILL_AT=n (the main rank kills itself with SIGKILL after global batch n, its checkpoints landed, once a
rollback happened), NAN_ID / SPIKE_ID (the poisoned samples: 21 and 45; -1 for none), MAX_ROLLBACKS, EPOCHS (3),
ACCUMULATION (1), STRATEGY (ddp).
"""
import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchstage import Batch, Callback, Epoch, LossSpike, NonFiniteLossCallback, SupervisedRunner


class Poisoned(Dataset):
    """64 regression samples; sample NAN_ID has NaN features, sample SPIKE_ID features 10^4 times too large."""

    def __init__(self, n=64):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x @ torch.randn(6, 1, generator=g) + 0.3 * torch.randn(n, 1, generator=g)
        nan_id, spike_id = int(os.environ.get("NAN_ID", 21)), int(os.environ.get("SPIKE_ID", 45))
        if nan_id >= 0:
            self.x[nan_id] = float("nan")
        if spike_id >= 0:
            self.x[spike_id] *= 1e4

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Without:
    """A batch sampler less the batches at some ordinals of its pass (the reference of a rollback run)."""

    def __init__(self, inner, ordinals):
        self.inner, self.ordinals, self.sampler = inner, set(ordinals), inner.sampler

    def __iter__(self):
        return (batch for ordinal, batch in enumerate(self.inner, 1) if ordinal not in self.ordinals)

    def __len__(self):
        return len(self.inner) - len(self.ordinals)


class WithoutBatches(Callback):
    """Each train pass of global epoch e leaves out the ordinals ``drops[e]``."""

    order = 1

    def __init__(self, drops):
        self.drops, self.original = drops, None

    def on_loader_start(self, runner):
        ordinals = self.drops.get(runner.global_epoch_step)
        if runner.is_train_loader and ordinals:
            self.original = runner.loader.batch_sampler
            object.__setattr__(runner.loader, "batch_sampler", Without(self.original, ordinals))

    def on_loader_end(self, runner):
        if self.original is not None:
            object.__setattr__(runner.loader, "batch_sampler", self.original)
            self.original = None


class KillAt(Callback):
    """SIGKILL on the main rank after global train batch ``at`` once the run rolled back, its checkpoints landed."""

    order = 150  # after the checkpoint and the loggers

    def __init__(self, at):
        self.at = at

    def on_batch_end(self, runner):
        keeper = runner.callbacks.get("rollback")
        if runner.is_train_loader and runner.global_batch_step == self.at and keeper is not None \
                and keeper.rollbacks and runner.engine.is_main:
            runner.file_writer.wait()
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def main(logdir, mode="rollback"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    data = Poisoned()
    clean = [i for i in range(48, 64) if i not in (int(os.environ.get("NAN_ID", 21)),
                                                    int(os.environ.get("SPIKE_ID", 45)))]
    loaders = {"train": DataLoader(data, batch_size=4, shuffle=True),
               "valid": DataLoader(torch.utils.data.Subset(data, clean), batch_size=4)}
    spike = LossSpike(factor=10, window=8, warmup=4)
    check_every = int(os.environ.get("CHECK_EVERY", 3))
    callbacks = {}
    if mode == "reference":
        drops = {}
        for epoch, ordinal in json.loads(os.environ.get("REFERENCE_DROPS", "[]")):
            drops.setdefault(epoch, set()).add(ordinal)
        callbacks["without"] = WithoutBatches(drops)
        callbacks["nonfinite"] = NonFiniteLossCallback(mode="stop", check_every=check_every, spike=spike)
    else:
        callbacks["nonfinite"] = NonFiniteLossCallback(mode="rollback", check_every=check_every, spike=spike,
                                                       max_rollbacks=int(os.environ.get("MAX_ROLLBACKS", 10)))
    if os.environ.get("KILL_AT"):
        callbacks["kill"] = KillAt(int(os.environ["KILL_AT"]))
    nprocs = int(os.environ.get("NPROC", 1))
    period = os.environ.get("PERIOD")
    SupervisedRunner().train(
        model=model, criterion=nn.MSELoss(), optimizer=optimizer, loaders=loaders,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.8), scheduler_step="batch",
        num_epochs=int(os.environ.get("EPOCHS", 3)), logdir=logdir, callbacks=callbacks, seed=11,
        accumulation_steps=int(os.environ.get("ACCUMULATION", 1)), strategy=os.environ.get("STRATEGY", "ddp"),
        checkpoint_period=(Batch(int(period)), Epoch(1)) if period else Epoch(1),
        resume="last" if mode == "resume" else None,
        distributed=True if nprocs > 1 else None, nprocs=nprocs if nprocs > 1 else None)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
