"""An elastic job's training script: run on every node by ``torchrun --nnodes=MIN:MAX`` (see docs/distributed.md).

Usage (each node): TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc-per-node=2 --max-restarts=3 \\
    --rdzv-backend=c10d --rdzv-endpoint=HEAD:29500 --rdzv-id=job-1 \\
    --rdzv-conf=last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3 scripts/elastic_train.py LOGDIR
torchrun starts it again in each new world (a node lost, or back): it names no resume, so a restarted attempt
continues its logdir's run. The learning rate follows the world size (the linear rule: the global batch is the
per-process batch times the processes); ``resume_lr="new"`` lets a resumed run take the rate of its world.
"""
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Epoch, SupervisedRunner

BATCH_PER_PROCESS, BASE_LR, BASE_WORLD = 32, 0.01, 4  # the rate chosen for 4 processes

torch.manual_seed(0)
x = torch.randn(4096, 16)
y = x @ torch.randn(16, 1) + 0.1 * torch.randn(4096, 1)
world = int(os.environ.get("WORLD_SIZE", 1))  # this attempt's world (torchrun sets it)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
SupervisedRunner().train(
    model=model, criterion=nn.MSELoss(),
    optimizer=torch.optim.SGD(model.parameters(), lr=BASE_LR * world / BASE_WORLD, momentum=0.9),
    loaders={"train": DataLoader(TensorDataset(x, y), batch_size=BATCH_PER_PROCESS, shuffle=True),
             "valid": DataLoader(TensorDataset(x[:512], y[:512]), batch_size=256)},
    num_epochs=int(os.environ.get("EPOCHS", 5)), logdir=sys.argv[1] if len(sys.argv) > 1 else "logs/elastic",
    checkpoint_period=(Batch(20), Epoch(1)),  # a lost node costs at most 20 batches
    resume_lr="new",
)
