"""The Catalyst tutorial's regression, unchanged but for the import: train a linear model for 8 epochs.

Run: python scripts/tutorial.py [LOGDIR]   (default ./logdir; an existing run there is replaced)
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import SupervisedRunner

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logdir"

X, y = torch.rand(int(1e4), 10), torch.rand(int(1e4))
loader = DataLoader(TensorDataset(X, y), batch_size=32, num_workers=1)
model = torch.nn.Linear(10, 1)
optimizer = torch.optim.Adam(model.parameters())
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
             scheduler=torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 6]),
             loaders={"train": loader, "valid": loader},
             logdir=logdir, num_epochs=8, verbose=True, overwrite=True)
