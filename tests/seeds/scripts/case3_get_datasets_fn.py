"""The Catalyst distributed tutorial, "Case 3 - Best practices for distributed training", verbatim but for the
import line (was: ``from catalyst.dl import SupervisedRunner, utils``) and the logdir (was ``./logs/example_3``;
here ``sys.argv[1]``). Unseeded data made inside ``get_datasets_fn``, ``utils.distributed_cmd_run(train)``."""
import sys

import torch
from torch.utils.data import TensorDataset
from torchstage import SupervisedRunner, utils

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
            "num_features": num_features,
        },
        criterion=criterion,
        optimizer=optimizer,
        scheduler=scheduler,
        logdir=sys.argv[1],
        num_epochs=8,
        verbose=True,
        distributed=False,
    )

utils.distributed_cmd_run(train)
