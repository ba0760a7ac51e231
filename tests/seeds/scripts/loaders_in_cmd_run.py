"""The tutorial's first script with its loaders built inside the function ``distributed_cmd_run`` runs on every
process (unseeded ``torch.rand``), as many users move it; only the logdir (``sys.argv[1]``) differs."""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchstage import SupervisedRunner, distributed_cmd_run


def train():
    num_samples, num_features = int(1e4), int(1e1)
    X, y = torch.rand(num_samples, num_features), torch.rand(num_samples)
    dataset = TensorDataset(X, y)
    loader = DataLoader(dataset, batch_size=32, num_workers=1)
    loaders = {"train": loader, "valid": loader}

    model = torch.nn.Linear(num_features, 1)
    criterion = torch.nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters())
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 6])

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
    )


distributed_cmd_run(train)
