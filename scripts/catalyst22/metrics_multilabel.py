"""Catalyst 22's README multi-label classification, moved by changing the import only.

``BatchTransformCallback`` writes ``scores = sigmoid(logits)`` (the transform named by its import path) and
``preds`` (0/1); ``MultilabelAccuracyCallback`` reads the scores as they are (no second sigmoid) and logs
``accuracy``; ``MultilabelPrecisionRecallF1SupportCallback`` reads the 0/1 predictions.

Run: python scripts/catalyst22/metrics_multilabel.py [LOGDIR]
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl
from metrics_report import report

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-metrics-multilabel"
torch.manual_seed(0)

# sample data: label k is mostly present when feature k is above 0.5
num_samples, num_features, num_classes = 2000, 10, 4
X = torch.rand(num_samples, num_features)
y = ((X[:, :num_classes] + 0.3 * torch.randn(num_samples, num_classes)) > 0.5).to(torch.float32)

# pytorch loaders
dataset = TensorDataset(X, y)
loader = DataLoader(dataset, batch_size=32)
loaders = {"train": loader, "valid": loader}

# model, criterion, optimizer, scheduler
model = torch.nn.Linear(num_features, num_classes)
criterion = torch.nn.BCEWithLogitsLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [2])


def binarize(scores):
    return (scores > 0.5).to(scores.dtype)


# model training
runner = dl.SupervisedRunner(input_key="features", output_key="logits", target_key="targets", loss_key="loss")
runner.train(
    model=model,
    criterion=criterion,
    optimizer=optimizer,
    scheduler=scheduler,
    loaders=loaders,
    logdir=logdir,
    num_epochs=3,
    valid_loader="valid",
    valid_metric="accuracy",
    minimize_valid_metric=False,
    verbose=False,
    callbacks=[
        dl.BatchTransformCallback(transform="torch.sigmoid", scope="on_batch_end", input_key="logits",
                                  output_key="scores"),
        dl.BatchTransformCallback(transform=binarize, scope="on_batch_end", input_key="scores", output_key="preds"),
        dl.MultilabelAccuracyCallback(input_key="scores", target_key="targets", threshold=0.5),
        dl.MultilabelPrecisionRecallF1SupportCallback(input_key="preds", target_key="targets"),
    ],
)
valid = runner.epoch_metrics["valid"]
keys = ["loss", "accuracy", "precision/_micro", "recall/_micro", "f1/_micro", "precision/_macro", "f1/_macro",
        "f1/_weighted"]
report({key: valid[key] for key in keys}, model)
