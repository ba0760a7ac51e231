"""The Catalyst distributed tutorial, "Case 2 - We are going deeper", verbatim but for the import line (was:
``from catalyst.dl import SupervisedRunner``) and the logdir (was ``./logs/example_2``; here ``sys.argv[1]``).
Unseeded module-level data given as ``datasets={...}``, ``distributed=True``."""
import sys

import torch
from torch.utils.data import TensorDataset
from torchstage import SupervisedRunner

# data
num_samples, num_features = int(1e4), int(1e1)
X = torch.rand(int(1e4), num_features)
y = torch.rand(X.shape[0])
dataset = TensorDataset(X, y)

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
        "train": dataset,
        "valid": dataset,
    },
    criterion=criterion,
    optimizer=optimizer,
    logdir=sys.argv[1],
    num_epochs=8,
    verbose=True,
    distributed=True,
)
