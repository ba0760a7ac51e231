"""Distributed training, form 3: a ``train()`` function run on every process by ``distributed_cmd_run``.

    python scripts/distributed_cmd_run.py [LOGDIR]     # one process per GPU; on CPU: TORCHSTAGE_NPROC=2
    torchrun --nproc-per-node=2 scripts/distributed_cmd_run.py [LOGDIR]

Datasets come from ``get_datasets_fn``, called inside each process once the process group exists.
"""
import sys

import torch
from torch.utils.data import TensorDataset

from torchstage import SupervisedRunner, distributed_cmd_run

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/distributed_cmd_run"


def datasets_fn(num_features: int):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1000, num_features, generator=generator)
    targets = (features.sum(dim=1) > 0).long()
    return {"train": TensorDataset(features, targets), "valid": TensorDataset(features, targets)}


def train():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 2)
    runner = SupervisedRunner()
    runner.train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                 datasets={"batch_size": 32, "num_workers": 1, "get_datasets_fn": datasets_fn, "num_features": 10},
                 num_epochs=2, logdir=logdir, distributed=False)
    return runner


runner = distributed_cmd_run(train)
# Only workers get here: the launching process exits inside distributed_cmd_run with the workers' code.
print(f"rank {runner.engine.rank}/{runner.engine.world_size}: trained {type(runner.model).__name__}, "
      f"valid loss {runner.epoch_metrics['valid']['loss']:.4f}")
