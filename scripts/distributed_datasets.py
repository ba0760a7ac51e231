"""Distributed training, form 2: ``datasets={...}``; each process builds its loaders over its shard.

    python scripts/distributed_datasets.py [LOGDIR]    # one process per GPU; on CPU: TORCHSTAGE_NPROC=2
    torchrun --nproc-per-node=2 scripts/distributed_datasets.py [LOGDIR]

``batch_size`` is per process: 2 processes with batch_size=32 step on 64 samples at a time.
"""
import sys

import torch
from torch.utils.data import TensorDataset

from torchstage import SupervisedRunner

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/distributed_datasets"
torch.manual_seed(0)
features = torch.randn(1000, 10)
targets = (features[:, 0] - features[:, 2] > 0).long()
dataset = TensorDataset(features, targets)

model = torch.nn.Linear(10, 2)
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
             datasets={"batch_size": 32, "num_workers": 1, "train": dataset, "valid": dataset},
             num_epochs=2, logdir=logdir, distributed=True)
print(f"rank {runner.engine.rank}/{runner.engine.world_size}: trained {type(runner.model).__name__}, "
      f"valid loss {runner.epoch_metrics['valid']['loss']:.4f}")
