"""A shuffled run of NPROC processes (distributed=True) with train(max_restarts=N), for the restart tests.

Usage: python restart_run.py LOGDIR MAX_RESTARTS [NPROC]
Environment: KILL_AT_BATCH=n, KILL_RANK=r: SIGKILL rank r after global train batch n, on the first attempt only
(TORCHSTAGE_RESTART_COUNT=0); FAIL_AT_BATCH=n: raise at global train batch n on every attempt (a deterministic
failure); FAIL_RANK=r: only on rank r (its peers then fail on the closed connection). The script names no
resume: a restarted attempt continues its logdir's run by itself.
"""
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchstage import Batch, Callback, SupervisedRunner


class Chaos(Callback):
    order = 500

    def __init__(self):
        env = os.environ
        self.first_attempt = env.get("TORCHSTAGE_RESTART_COUNT", "0") == "0"
        self.kill_at, self.kill_rank = int(env.get("KILL_AT_BATCH", 0)), int(env.get("KILL_RANK", 0))
        self.fail_at = int(env.get("FAIL_AT_BATCH", 0))
        self.fail_rank = int(env["FAIL_RANK"]) if env.get("FAIL_RANK") else None

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        if self.first_attempt and runner.global_batch_step == self.kill_at and runner.engine.rank == self.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if runner.global_batch_step == self.fail_at and self.fail_rank in (None, runner.engine.rank):
            raise RuntimeError(f"the data at global batch {self.fail_at} cannot be read")


def main(logdir, max_restarts, nproc=2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(52, 6, generator=g), torch.randn(52, 1, generator=g)
    SupervisedRunner().train(
        model=model, criterion=nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
        datasets={"batch_size": 4, "train": TensorDataset(x[:40], y[:40]), "valid": TensorDataset(x[40:], y[40:])},
        callbacks=[Chaos()], logdir=logdir, num_epochs=3, seed=5, checkpoint_period=(Batch(2), 1),
        distributed=True, nprocs=int(nproc), max_restarts=int(max_restarts))


if __name__ == "__main__":
    main(*sys.argv[1:])
