"""A 2-rank run whose start-up is slow on purpose, for the start-up watch's tests.

Usage: python slow_start.py LOGDIR; settings from env: START_MODE (none | datasets | late), START_RANK (the slow
rank, 1), START_TIMEOUT (train's hang_timeout, 3), STRATEGY (ddp). ``datasets``: that rank writes LOGDIR/stuck-at
(the time) and sleeps while its datasets are built (``datasets={"get_datasets_fn": ...}``); ``late``: it sleeps
before calling train(). Each rank that trains prints ``rank R finished``.
"""
import os
import sys
import time

import torch
from torch.utils.data import TensorDataset

from torchstage import SupervisedRunner

logdir = sys.argv[1]
mode = os.environ.get("START_MODE", "none")
slow = os.environ.get("RANK") == os.environ.get("START_RANK", "1") and os.environ.get("TORCHSTAGE_LAUNCHED")


def sleep_far_longer_than_any_test():
    time.sleep(3600)


def make_datasets():
    if mode == "datasets" and slow:
        os.makedirs(logdir, exist_ok=True)
        with open(os.path.join(logdir, "stuck-at"), "w") as f:
            f.write(repr(time.time()))
        sleep_far_longer_than_any_test()  # the line the report names
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    return {"train": data, "valid": data}


if mode == "late" and slow:
    sleep_far_longer_than_any_test()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.AdamW(model.parameters()),
                         datasets={"batch_size": 8, "get_datasets_fn": make_datasets}, logdir=logdir, num_epochs=2,
                         distributed=True, nprocs=2, strategy=os.environ.get("STRATEGY", "ddp"),
                         hang_timeout=float(os.environ.get("START_TIMEOUT", 3)), overwrite=True)
print(f"rank {os.environ.get('RANK')} finished", flush=True)
