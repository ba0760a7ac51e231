"""The Catalyst distributed tutorial, "Stage 1 - I just want distributed", verbatim but for the import line
(was: ``from catalyst.dl import SupervisedRunner``) and the logdir (was ``./logs/example_1``; here ``sys.argv[1]``).
Unseeded module-level data, ``distributed=True``."""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchstage import SupervisedRunner

# data
num_samples, num_features = int(1e4), int(1e1)
X, y = torch.rand(num_samples, num_features), torch.rand(num_samples)
dataset = TensorDataset(X, y)
loader = DataLoader(dataset, batch_size=32, num_workers=1)
loaders = {"train": loader, "valid": loader}

# model, criterion, optimizer, scheduler
model = torch.nn.Linear(num_features, 1)
criterion = torch.nn.MSELoss()
optimizer = torch.optim.Adam(model.parameters())
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 6])

# model training
runner = SupervisedRunner()
runner.train(
    model=model,
    criterion=criterion,
    optimizer=optimizer,
    scheduler=scheduler,
    loaders=loaders,
    logdir=sys.argv[1],
    num_epochs=8,
    verbose=True,
    distributed=True,
)
