"""Two ranks train on a DataLoader with one forked worker; with STUCK_MARKER set, rank 1's first worker fork waits
forever inside the fork's after-child hook, before its first line (where CPython gh-112275 deadlocks one).
Prints the final weights. Usage: python stuck_worker_run.py LOGDIR"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import SupervisedRunner


def stuck_once():
    marker = os.environ.get("STUCK_MARKER")
    if marker and os.environ.get("RANK") == "1" and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(3600)  # a child that never returns from fork()


os.register_at_fork(after_in_child=stuck_once)
torch.manual_seed(0)
X, y = torch.rand(256, 4), torch.rand(256, 1)
loaders = {"train": DataLoader(TensorDataset(X, y), batch_size=16, shuffle=True, num_workers=1),
           "valid": DataLoader(TensorDataset(X, y), batch_size=16, num_workers=1)}
model = torch.nn.Linear(4, 1)
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
             loaders=loaders, logdir=sys.argv[1], num_epochs=2, distributed=True, verbose=False)
if os.environ.get("RANK") == "0":
    print("weights", [round(v, 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()])
