"""A run of NPROC processes (distributed_cmd_run with max_restarts) that fails outside the training loop, where no
failure record is written, for the restart tests.

Usage: python early_fail_run.py LOGDIR MAX_RESTARTS WHERE [NPROC]
WHERE: ``script``: the function raises before it calls train() (a bad argument), on every attempt; ``flaky``: the
same, but the message names the attempt (a failure that differs between attempts); ``setup``: the datasets'
factory raises inside train()'s setup; ``resume``: the first attempt trains and is killed at global batch 5 (its
checkpoints are written every 2 batches), the next ones build a model the checkpoint does not fit and fail while
resuming. Each worker appends ``attempt job-id rank`` to LOGDIR/attempts on start.
"""
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchstage import Batch, Callback, SupervisedRunner, distributed_cmd_run

ATTEMPT = int(os.environ.get("TORCHSTAGE_RESTART_COUNT", "0"))


class KillOnFirstAttempt(Callback):
    order = 500

    def on_batch_end(self, runner):
        if ATTEMPT == 0 and runner.is_train_loader and runner.global_batch_step == 5 and runner.engine.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def unreadable_datasets():
    raise FileNotFoundError("no such file: /data/train.csv")


def main(logdir, where):
    with open(os.path.join(logdir, "attempts"), "a") as f:
        f.write(f"{ATTEMPT} {os.environ.get('TORCHSTAGE_JOB_ID')} {os.environ.get('RANK')}\n")
    if where in ("script", "flaky"):
        # every rank notes its start before one fails: a rank failing at once ends a peer still finishing its
        # process group (gloo's connections), which then never gets here
        torch.distributed.barrier()
    if where == "script":
        raise ValueError("lr must be > 0, got -1")
    if where == "flaky":
        raise RuntimeError(f"lost the connection to the node (attempt {ATTEMPT})")
    torch.manual_seed(0)
    hidden = 16 if ATTEMPT == 0 or where != "resume" else 17  # a restarted attempt that no longer fits the checkpoint
    model = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(52, 6, generator=g), torch.randn(52, 1, generator=g)
    datasets = {"batch_size": 4, "train": TensorDataset(x[:40], y[:40]), "valid": TensorDataset(x[40:], y[40:])}
    if where == "setup":
        datasets = {"batch_size": 4, "get_datasets_fn": unreadable_datasets}
    SupervisedRunner().train(
        model=model, criterion=nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
        datasets=datasets, callbacks=[KillOnFirstAttempt()], logdir=logdir, num_epochs=2, seed=5,
        checkpoint_period=(Batch(2), 1))


if __name__ == "__main__":
    logdir, max_restarts, where, nproc = (sys.argv[1:] + ["2"])[:4]
    os.makedirs(logdir, exist_ok=True)
    distributed_cmd_run(main, logdir, where, nprocs=int(nproc), max_restarts=int(max_restarts))
