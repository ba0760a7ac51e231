"""A run under ``torchrun --nnodes=1:2`` (two agents on this host) whose samples carry their id, slowed so that a
node can be lost mid-run; for the elastic test.

Usage: torchrun --nnodes=1:2 --nproc-per-node=2 ... elastic_run.py LOGDIR
Each rank appends, per train batch, its global epoch and batch and the batch's sample ids to
LOGDIR/seen-ATTEMPT-RANK-WORLD.jsonl, ATTEMPT its agent's restart count; and the same with the world's round
(``phase``: the job's restart count, the world size and the master port torchrun's agents chose for it) to LOGDIR/rows-PHASE-RANK.jsonl.
The script names no resume: a restarted attempt continues by itself. Environment: EPOCHS (3), MLFLOW=1 (an
MLflowLogger too), OVERWRITE=1 (``overwrite=True``: a new launch replaces the logdir's run).
"""
import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, MLflowLogger, SupervisedRunner
from torchstage.launch.resolve import restart_attempt


class Seen(Callback):
    order = 1

    def on_batch_start(self, runner):
        if runner.is_train_loader:
            time.sleep(0.3)
            name = (f"seen-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-{runner.engine.rank}-"
                    f"{runner.engine.world_size}.jsonl")
            row = json.dumps({"epoch": runner.global_epoch_step, "batch": runner.global_batch_step,
                              "ids": runner.batch[0][:, 0].long().tolist()}) + "\n"
            phase = f"{restart_attempt()}-{runner.engine.world_size}x{os.environ.get('MASTER_PORT')}"
            for name in (name, f"rows-{phase}-{runner.engine.rank}.jsonl"):
                with open(os.path.join(sys.argv[1], name), "a") as f:
                    f.write(row)


def main(logdir):
    os.makedirs(logdir, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.arange(96, dtype=torch.float32)[:, None], torch.randn(96, 5, generator=g)], 1)
    y = torch.randn(96, 1, generator=g)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),
               "valid": DataLoader(TensorDataset(x[:8], y[:8]), batch_size=4)}
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), 0.01),
                             loaders=loaders, logdir=logdir, seed=5, num_epochs=int(os.environ.get("EPOCHS", 3)),
                             callbacks=[Seen(), MLflowLogger()] if os.environ.get("MLFLOW") else [Seen()],
                             checkpoint_period=(Batch(2), 1), overwrite=bool(os.environ.get("OVERWRITE")))


if __name__ == "__main__":
    main(sys.argv[1])
