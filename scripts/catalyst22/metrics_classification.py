"""Catalyst 22's README multi-class classification with its metric callbacks, moved by changing the imports only.

``AccuracyCallback(input_key="logits", target_key="targets", num_classes=4)`` logs ``accuracy01`` and
``accuracy03``; ``PrecisionRecallF1SupportCallback`` logs ``precision/_micro``, ``f1/_macro``...; then
``evaluate_loader`` with ``topk=(1, 3)`` and a ``metrics.AdditiveMetric`` meter over the predictions.
Fewer samples than the README, so that it runs in seconds.

Run: python scripts/catalyst22/metrics_classification.py [LOGDIR]
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl, metrics
from torchstage import metrics  # was: pass
from metrics_report import report

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-metrics-classification"
torch.manual_seed(0)

# sample data
num_samples, num_features, num_classes = 2000, 10, 4
X = torch.rand(num_samples, num_features)
y = (X[:, :num_classes].argmax(1) + (torch.rand(num_samples) < 0.2) * torch.randint(0, num_classes, (num_samples,))) % 4

# pytorch loaders
dataset = TensorDataset(X, y)
loader = DataLoader(dataset, batch_size=32)
loaders = {"train": loader, "valid": loader}

# model, criterion, optimizer, scheduler
model = torch.nn.Linear(num_features, num_classes)
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [2])

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
    valid_metric="accuracy03",
    minimize_valid_metric=False,
    verbose=False,
    callbacks=[
        dl.AccuracyCallback(input_key="logits", target_key="targets", num_classes=num_classes),
        dl.PrecisionRecallF1SupportCallback(input_key="logits", target_key="targets", num_classes=num_classes),
    ],
)
valid = runner.epoch_metrics["valid"]

# model evaluation
evaluated = runner.evaluate_loader(
    loader=loaders["valid"],
    callbacks=[dl.AccuracyCallback(input_key="logits", target_key="targets", topk=(1, 3), suffix="_eval")],
)

# a running meter over the predictions
meter = metrics.AdditiveMetric(compute_on_call=False)
model.eval()
with torch.no_grad():
    for features, targets in loader:
        meter.update((model(features).argmax(1) == targets).float().mean().item(), len(targets))
mean, std = meter.compute()

keys = ["loss", "accuracy01", "accuracy03", "precision/_micro", "precision/_macro", "recall/_macro", "f1/_micro",
        "f1/_macro", "f1/_weighted"]
report({**{key: valid[key] for key in keys}, "eval_accuracy01": evaluated["accuracy01_eval"],
        "eval_accuracy03": evaluated["accuracy03_eval"], "meter_mean": mean, "meter_std": std}, model)
