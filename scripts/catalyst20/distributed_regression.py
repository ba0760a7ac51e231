#!/usr/bin/env python
"""Catalyst 20.12's README "ML - Linear Regression (distributed training version)", moved by changing the import
line only (was: ``from catalyst.dl import SupervisedRunner, utils``) and the logdir (``sys.argv[1]``, was
``./logs/example_distributed_ml``). Its data is drawn without a seed inside ``datasets_fn``: torchstage calls it
after seeding every rank alike, so the ranks share one dataset.

Run: python scripts/catalyst20/distributed_regression.py [LOGDIR]   (on CPU: TORCHSTAGE_NPROC=2)
"""
import sys

import torch
from torch.utils.data import TensorDataset
from torchstage import SupervisedRunner, utils  # was: from catalyst.dl import SupervisedRunner, utils

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/example_distributed_ml"

def datasets_fn(num_features: int):
    X = torch.rand(int(1e4), num_features)
    y = torch.rand(X.shape[0])
    dataset = TensorDataset(X, y)
    return {"train": dataset, "valid": dataset}

def train():
    num_features = int(1e1)
    # model, criterion, optimizer, scheduler
    model = torch.nn.Linear(num_features, 1)
    criterion = torch.nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters())
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 6])

    runner = SupervisedRunner()
    runner.train(
        model=model,
        datasets={
            "batch_size": 32,
            "num_workers": 1,
            "get_datasets_fn": datasets_fn,
            "num_features": num_features,  # will be passed to datasets_fn
        },
        criterion=criterion,
        optimizer=optimizer,
        scheduler=scheduler,
        logdir=logdir,
        num_epochs=8,
        verbose=True,
        distributed=False,
    )

utils.distributed_cmd_run(train)
