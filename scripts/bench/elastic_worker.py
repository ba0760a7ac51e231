"""The training script of ``elastic_recovery.py``: a small run under ``torchrun --nnodes=1:2`` that records on rank 0
when its process started, when the run's first event came (setup done: world, data, checkpoint) and, per train
batch, the time, the world size and the global batch (LOGDIR/batches.jsonl); it sleeps 0.1 s a batch.

Usage: torchrun --nnodes=1:2 --nproc-per-node=2 ... elastic_worker.py LOGDIR EPOCHS
"""
import time

STARTED = time.time()  # before torch is imported

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, SupervisedRunner


def record(runner, **row) -> None:
    if runner.engine.is_main:
        with open(os.path.join(sys.argv[1], "batches.jsonl"), "a") as f:
            f.write(json.dumps({"t": time.time(), "world": runner.engine.world_size, **row}) + "\n")


class Record(Callback):
    order = 1

    def on_experiment_start(self, runner):
        record(runner, event="started", at=STARTED)

    def on_batch_start(self, runner):
        if runner.is_train_loader:
            time.sleep(0.1)  # the step of a larger model
            record(runner, batch=runner.global_batch_step)


if __name__ == "__main__":
    torch.manual_seed(0)
    x, y = torch.randn(512, 16), torch.randn(512, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), 0.01),
                             loaders={"train": DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)},
                             valid_loader="train", callbacks=[Record()], logdir=sys.argv[1], seed=1,
                             num_epochs=int(sys.argv[2]), checkpoint_period=(Batch(5), 1))
