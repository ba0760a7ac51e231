"""Two stages: a warm-up with a frozen body and SGD, then fine-tuning everything with Adam.

Each stage inherits what it does not override (here: loaders, criterion); the weights carry over.
Run: python scripts/stages.py [LOGDIR]
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import SupervisedRunner

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logdir-stages"
torch.manual_seed(0)
X = torch.randn(2048, 8)
y = (X[:, :4].sum(1, keepdim=True) > 0).float()
loaders = {"train": DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True),
           "valid": DataLoader(TensorDataset(X[:512], y[:512]), batch_size=256)}

body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU())
head = torch.nn.Linear(32, 1)
model = torch.nn.Sequential(body, head)

runner = SupervisedRunner()
runner.train(
    model=model,
    criterion=torch.nn.BCEWithLogitsLoss(),
    loaders=loaders,
    stages={
        "warmup": {"num_epochs": 2, "optimizer": torch.optim.SGD(head.parameters(), lr=0.1)},
        "finetune": {"num_epochs": 3, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3)},
    },
    logdir=logdir,
    overwrite=True,
)
print("final valid loss:", round(runner.epoch_metrics["valid"]["loss"], 4))
