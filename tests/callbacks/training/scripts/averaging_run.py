"""A shuffled run with dropout, BatchNorm, EMA and SWA, for the weight averaging resume test.

Usage: python averaging_run.py LOGDIR [resume]; KILL_AT_BATCH=n SIGKILLs after global train batch n;
TORCHSTAGE_NPROC=2 runs 2 gloo processes.
10 train batches per epoch, 4 epochs, last.pth every 4 train batches; SWA averages from step 10 on.
"""
import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, EMACallback, Epoch, SupervisedRunner, SWACallback


class Kill(Callback):
    """SIGKILL after global train batch KILL_AT_BATCH; at the end each rank writes its averaged weights' sums."""

    order = 500

    def on_experiment_end(self, runner):
        sums = {name: [float(t.double().sum()) for t in runner.callbacks[name].averaged.state_dict().values()]
                for name in ("ema", "swa")}
        with open(os.path.join(runner.spec.logdir, f"averages-rank{runner.engine.rank}.json"), "w") as f:
            json.dump(sums, f)

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == int(os.environ.get("KILL_AT_BATCH", 0)):
            runner.file_writer.wait()  # the checkpoints handed over have landed: a kill between writes
            os.kill(os.getpid(), signal.SIGKILL)


def main(logdir, resume=None):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(56, 6, generator=g), torch.randn(56, 1, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    SupervisedRunner().train(
        model=model, criterion=nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
        loaders={"train": DataLoader(TensorDataset(x[:40], y[:40]), batch_size=4, shuffle=True),
                 "valid": DataLoader(TensorDataset(x[40:], y[40:]), batch_size=4)},
        callbacks={"ema": EMACallback(decay=0.8), "swa": SWACallback(start=10, evaluate=False, apply_on_end=False),
                   "kill": Kill()},
        num_epochs=4, logdir=logdir, resume=resume, seed=5, checkpoint_period=(Batch(4), Epoch(1)), distributed=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
