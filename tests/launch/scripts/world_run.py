"""A shuffled run of NPROC processes (distributed=True) whose samples carry their id, for the world-size tests.

Usage: python world_run.py LOGDIR NPROC [resume]
Environment: KILL_AT_BATCH=n: SIGKILL every rank after global train batch n (last.pth is then the mid-epoch
checkpoint of the batch before, Batch(2)); KILL_AT_VALID=e: SIGKILL every rank as the valid loader of global epoch e
starts (last.pth is then the checkpoint of the train pass's last batch, with no train batch left); each rank appends the ids of its train batches, with the global
epoch and batch, to LOGDIR/seen-TAG-rankR.jsonl (TAG: the environment's TAG, default "run").
"""
import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, SupervisedRunner


class Seen(Callback):
    order = 1

    def __init__(self, logdir):
        self.logdir, self.kill_at = logdir, int(os.environ.get("KILL_AT_BATCH", 0))
        self.kill_at_valid = int(os.environ.get("KILL_AT_VALID", 0))

    def on_loader_start(self, runner):
        if not runner.is_train_loader and runner.global_epoch_step == self.kill_at_valid:
            runner.file_writer.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    def on_batch_start(self, runner):
        if runner.is_train_loader:
            row = {"epoch": runner.global_epoch_step, "batch": runner.global_batch_step,
                   "ids": runner.batch[0][:, 0].long().tolist()}
            name = f"seen-{os.environ.get('TAG', 'run')}-rank{runner.engine.rank}.jsonl"
            with open(os.path.join(self.logdir, name), "a") as f:
                f.write(json.dumps(row) + "\n")

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.kill_at:
            runner.file_writer.wait()
            os.kill(os.getpid(), signal.SIGKILL)


def main(logdir, nproc, resume=None):
    os.makedirs(logdir, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.arange(40, dtype=torch.float32)[:, None], torch.randn(40, 5, generator=g)], 1)
    y = torch.randn(40, 1, generator=g)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),
               "valid": DataLoader(TensorDataset(x[:8], y[:8]), batch_size=4)}
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), 0.01),
                             loaders=loaders, callbacks=[Seen(logdir)], logdir=logdir, num_epochs=3, seed=5,
                             checkpoint_period=(Batch(2), 1), distributed=True, nprocs=int(nproc), resume=resume)


if __name__ == "__main__":
    main(*sys.argv[1:])
