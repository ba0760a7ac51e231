"""Distributed training, form 1: loaders built in the script, ``train(..., distributed=True)``.

    python scripts/distributed_loaders.py [LOGDIR]     # one process per GPU; on CPU: TORCHSTAGE_NPROC=2
    torchrun --nproc-per-node=2 scripts/distributed_loaders.py [LOGDIR]

The whole script runs once per process, so its data must be the same in every process (seeded here).
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import SupervisedRunner

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/distributed_loaders"
torch.manual_seed(0)
features = torch.randn(1000, 10)
targets = (features[:, 0] + features[:, 1] > 0).long()
dataset = TensorDataset(features, targets)
loaders = {"train": DataLoader(dataset, batch_size=32, shuffle=True), "valid": DataLoader(dataset, batch_size=32)}

model = torch.nn.Linear(10, 2)
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
             loaders=loaders, num_epochs=2, logdir=logdir, distributed=True)
# Runs in every worker (never in the launching process); runner.model is the plain, trained module.
print(f"rank {runner.engine.rank}/{runner.engine.world_size}: trained {type(runner.model).__name__}, "
      f"valid loss {runner.epoch_metrics['valid']['loss']:.4f}")
