"""A tiny, fully random two-stage run used by the resume tests; it can kill or signal itself at chosen points.

Usage: python tiny_run.py LOGDIR [resume]
Environment (all optional):
  KILL_AT_BATCH=n      SIGKILL this process after global train batch n (after every callback ran and the
                       checkpoints handed to the file writer landed: a kill between checkpoints)
  KILL_AT_EPOCH_END=n  SIGKILL at the end of global epoch n, after the checkpoints were written
  KILL_IN_WRITE=n      SIGKILL inside the n-th checkpoint write, between the temporary file and os.replace
  KILL_IN_FSYNC=n      SIGKILL inside the fsync of the n-th .pth temporary file
  SIGNAL_AT_BATCH=n    send SIGTERM to this process after global train batch n
  MARK_AT_BATCH=n      create LOGDIR/../mark-n when global batch n starts and sleep a little each batch after
  MARK_HOLD=path       after the mark, wait (at most 120 s) until the file path exists, then go on
  PERIOD=n             checkpoint every n train batches (default 3)
Shuffled data, a dataset that draws noise from the global torch RNG, dropout, momentum SGD then Adam,
and a step scheduler: every random draw and every state must be restored for a bitwise equal end.
"""
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchstage import Batch, Callback, Epoch, SupervisedRunner


class NoisyData(Dataset):
    """Random features plus fresh noise from the global RNG at every read (an augmentation)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(6), self.y[i]


class Chaos(Callback):
    """Kills or signals this process at the points the environment names."""

    order = 500

    def __init__(self):
        env = os.environ
        self.kill_at = int(env.get("KILL_AT_BATCH", 0))
        self.kill_epoch = int(env.get("KILL_AT_EPOCH_END", 0))
        self.signal_at = int(env.get("SIGNAL_AT_BATCH", 0))
        self.mark_at = int(env.get("MARK_AT_BATCH", 0))

    def on_batch_start(self, runner):
        if self.mark_at and runner.is_train_loader and runner.global_batch_step >= self.mark_at:
            if runner.global_batch_step == self.mark_at:
                open(os.path.join(os.path.dirname(runner.logdir_path), f"mark-{self.mark_at}"), "w").close()
                hold, deadline = os.environ.get("MARK_HOLD"), time.time() + 120
                while hold and not os.path.exists(hold) and time.time() < deadline:
                    time.sleep(0.05)
            time.sleep(0.05)

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        if runner.global_batch_step == self.kill_at:
            runner.file_writer.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        if runner.global_batch_step == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_epoch_end(self, runner):
        if runner.global_epoch_step == self.kill_epoch:
            runner.file_writer.wait()
            os.kill(os.getpid(), signal.SIGKILL)


def patch_writes():
    """Make the n-th checkpoint write die between its temporary file and the rename (or inside fsync)."""
    for name, real in (("KILL_IN_WRITE", os.replace), ("KILL_IN_FSYNC", os.fsync)):
        target = int(os.environ.get(name, 0))
        if not target:
            continue
        calls = [0]

        def wrapped(*args, _real=real, _target=target, _calls=calls, _name=name):
            if _name == "KILL_IN_WRITE":
                target_name = str(args[-1])  # os.replace(tmp, final)
            else:
                target_name = os.readlink(f"/proc/self/fd/{args[0]}")  # the file being fsynced
            if ".pth" in os.path.basename(target_name):
                _calls[0] += 1
                if _calls[0] == _target:
                    os.kill(os.getpid(), signal.SIGKILL)
            return _real(*args)
        setattr(os, "replace" if name == "KILL_IN_WRITE" else "fsync", wrapped)


def main(logdir, resume=None):
    patch_writes()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    train = DataLoader(NoisyData(40, 1), batch_size=4, shuffle=True)
    valid = DataLoader(NoisyData(12, 2), batch_size=4)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = SupervisedRunner()
    runner.logdir_path = logdir
    period = int(os.environ.get("PERIOD", 3))
    runner.train(model=model, criterion=nn.MSELoss(), loaders={"train": train, "valid": valid},
                 stages={"warmup": {"num_epochs": 2, "optimizer": sgd},
                         "main": {"num_epochs": 2, "optimizer": adam,
                                  "scheduler": torch.optim.lr_scheduler.StepLR(adam, 1, gamma=0.5)}},
                 callbacks=[Chaos()], logdir=logdir, resume=resume, seed=7,
                 checkpoint_period=(Batch(period), Epoch(1)), topk=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
