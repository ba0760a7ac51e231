"""A ``get_datasets_fn`` whose data depends on the rank it runs on: torchstage must refuse it before training.

Usage: python rank_datasets_fn.py LOGDIR (TORCHSTAGE_NPROC=2).
"""
import os
import sys

import torch
from torch.utils.data import TensorDataset

from torchstage import SupervisedRunner


def datasets_fn():
    X = torch.rand(32, 4) + int(os.environ["RANK"])  # something that differs per rank
    return {"train": TensorDataset(X, X.sum(1, keepdim=True)), "valid": TensorDataset(X, X.sum(1, keepdim=True))}


model = torch.nn.Linear(4, 1)
SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         datasets={"batch_size": 8, "get_datasets_fn": datasets_fn}, logdir=sys.argv[1], num_epochs=1,
                         distributed=True)
