"""A regression trained by N ranks (TORCHSTAGE_NPROC, through distributed=True) or by one process taking their
samples together (NPROC unset): each global step is the same 256 samples, so the weights and the epoch loss must
agree. CRASH_RANK=r: that rank raises at train batch 2 (and writes LOGDIR/crash-at first). Each rank writes
LOGDIR/pids/<pid>.

Usage: python many_ranks.py LOGDIR; rank 0 prints ``RESULT {"weights": [...], "loss": ...}`` at the end.
"""
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, SupervisedRunner

logdir = sys.argv[1]
nproc = int(os.environ.get("TORCHSTAGE_NPROC", 1))
crash_rank = int(os.environ.get("CRASH_RANK", -1))
GLOBAL_BATCH = 256


class Crash(Callback):
    def on_experiment_start(self, runner):
        os.makedirs(os.path.join(logdir, "pids"), exist_ok=True)
        open(os.path.join(logdir, "pids", str(os.getpid())), "w").close()

    def on_batch_start(self, runner):
        if runner.engine.rank == crash_rank and runner.is_train_loader and runner.batch_step == 2:
            with open(os.path.join(logdir, "crash-at"), "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError(f"rank {crash_rank} crashes on purpose")


g = torch.Generator().manual_seed(0)
x = torch.randn(4 * GLOBAL_BATCH, 8, generator=g, dtype=torch.float64)
y = x @ torch.linspace(-1, 1, 8, dtype=torch.float64).unsqueeze(1) + 0.1 * torch.randn(4 * GLOBAL_BATCH, 1, generator=g,
                                                                                         dtype=torch.float64)
data = TensorDataset(x, y)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1).double()
# per rank GLOBAL_BATCH / nproc samples a step: torchstage's sampler deals rank r the samples r, r + nproc, ...
loaders = {"train": DataLoader(data, batch_size=GLOBAL_BATCH // nproc), "valid": DataLoader(data, batch_size=64)}
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
             loaders=loaders, num_epochs=2, logdir=logdir, callbacks={"crash": Crash()},
             distributed=nproc > 1, seed=0, hang_timeout=120)
if int(os.environ.get("RANK", 0)) == 0:
    loss = runner.epoch_metrics["valid"]["loss"]
    print("RESULT " + json.dumps({"weights": runner.model.weight.flatten().tolist() + runner.model.bias.tolist(),
                                  "loss": loss}))
