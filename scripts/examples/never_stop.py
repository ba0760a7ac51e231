"""A job that never stops: a rank dies and the world is restarted from the last checkpoint; a run stopped under
two processes goes on under one.

    python scripts/examples/never_stop.py /tmp/never-stop --kill-at-batch 10    # rank 1 dies; restarted; finishes
    python scripts/examples/never_stop.py /tmp/resharded --stop-at-batch 6      # two processes stop mid-epoch...
    python scripts/examples/never_stop.py /tmp/resharded --nprocs 1             # ...and one process finishes the run

A restarted attempt continues its own run by itself; ``resume="last"`` lets a later command continue it too,
on any number of processes.
"""
import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, Epoch, StopCallback, SupervisedRunner, request_stop


class Trouble(Callback):
    """Stands in for what ends jobs: a node lost (SIGKILL of rank 1, on the first attempt only) or a time limit
    (a graceful stop of every rank)."""

    order = 500

    def __init__(self, kill_at: int, stop_at: int):
        self.kill_at, self.stop_at = kill_at, stop_at

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        first_attempt = os.environ.get("TORCHSTAGE_RESTART_COUNT", "0") == "0"
        if first_attempt and runner.global_batch_step == self.kill_at and runner.engine.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if runner.global_batch_step == self.stop_at:
            request_stop(f"demo stop at batch {self.stop_at}")


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(512, 1, generator=g)
    return {"train": DataLoader(TensorDataset(x[:448], y[:448]), batch_size=16, shuffle=True),
            "valid": DataLoader(TensorDataset(x[448:], y[448:]), batch_size=16)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--kill-at-batch", type=int, default=0)
    parser.add_argument("--stop-at-batch", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    SupervisedRunner().train(
        model=model, criterion=nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
        loaders=data(), num_epochs=3, logdir=args.logdir,
        distributed=True, nprocs=args.nprocs,     # one process per rank, on gloo here
        max_restarts=2,                           # a dead rank: end the world, start it again, at most twice
        resume="last",                            # a new command on this logdir continues its run
        checkpoint_period=(Batch(4), Epoch(1)),   # last.pth every 4 train batches: little is lost
        # the ranks agree on a stop after every batch, so the demo's stop lands one batch after it is asked
        # (by default they agree about every 0.5 s, within the epoch or at its end)
        callbacks=[Trouble(args.kill_at_batch, args.stop_at_batch), StopCallback(check_every=1)])


if __name__ == "__main__":
    main()
