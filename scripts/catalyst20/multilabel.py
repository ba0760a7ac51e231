"""Catalyst 20.12 multi-label classification and a check run, moved by changing the import only.

Catalyst 20.12: ``from catalyst import dl``. ``MultiLabelAccuracyCallback(threshold=0.5)``, a scheduler,
then the same pipeline as a smoke run with ``CheckRunCallback`` and an overfit run with ``BatchOverfitCallback``.

Run: python scripts/catalyst20/multilabel.py [LOGDIR]
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-multilabel"
torch.manual_seed(0)

# sample data: label k is present when feature k is above 0.5
num_samples, num_features, num_classes = 2000, 10, 4
X = torch.rand(num_samples, num_features)
y = (X[:, :num_classes] > 0.5).to(torch.float32)

# pytorch loaders
dataset = TensorDataset(X, y)
loader = DataLoader(dataset, batch_size=32)
loaders = {"train": loader, "valid": loader}


def pipeline(num_epochs, callbacks, subdir):
    model = torch.nn.Linear(num_features, num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    runner = dl.SupervisedRunner()
    runner.train(
        model=model,
        criterion=torch.nn.BCEWithLogitsLoss(),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.MultiStepLR(optimizer, [2]),
        loaders=loaders,
        logdir=f"{logdir}/{subdir}",
        num_epochs=num_epochs,
        callbacks=[dl.MultiLabelAccuracyCallback(threshold=0.5)] + callbacks,
    )
    return runner


runner = pipeline(4, [], "train")
check = pipeline(8, [dl.CheckRunCallback(num_batch_steps=3, num_epoch_steps=2)], "check")
overfit = pipeline(3, [dl.BatchOverfitCallback(train=1, valid=0.1)], "overfit")
print(f"valid multilabel_accuracy={runner.epoch_metrics['valid_multilabel_accuracy']:.3f} "
      f"check batches={check.global_batch_step} overfit batches={overfit.global_batch_step}")
