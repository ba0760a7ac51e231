"""Catalyst 20.12 supervised classification with its callback arguments, moved by changing the import only.

Catalyst 20.12: ``from catalyst import dl, utils``. It uses ``fp16=True`` (float32 on a CPU, as Catalyst),
``main_metric``/``minimize_metric``/``initial_seed``, Catalyst's key names (``input_key`` is the target),
gradient clipping through ``grad_clip_params`` and early stopping on ``metric=``.

Run: python scripts/catalyst20/classification.py [LOGDIR]
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl, utils
import torchstage as utils

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-classification"
utils.set_global_seed(42)

# sample data
num_samples, num_features, num_classes = 4000, 16, 6
centers = torch.randn(num_classes, num_features) * 2
y = torch.randint(0, num_classes, (num_samples,))
X = centers[y] + torch.randn(num_samples, num_features)

# pytorch loaders
loaders = {
    "train": DataLoader(TensorDataset(X[:3200], y[:3200]), batch_size=32, shuffle=True),
    "valid": DataLoader(TensorDataset(X[3200:], y[3200:]), batch_size=64),
}

# model, criterion, optimizer, scheduler
model = torch.nn.Sequential(torch.nn.Linear(num_features, 64), torch.nn.ReLU(), torch.nn.Linear(64, num_classes))
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [4])

# model training
runner = dl.SupervisedRunner(input_key="features", output_key="logits", input_target_key="targets")
runner.train(
    model=model,
    criterion=criterion,
    optimizer=optimizer,
    scheduler=scheduler,
    loaders=loaders,
    logdir=logdir,
    num_epochs=6,
    callbacks=[
        dl.CriterionCallback(input_key="targets", output_key="logits", prefix="loss"),
        dl.AccuracyCallback(input_key="targets", output_key="logits", num_classes=num_classes),
        dl.OptimizerCallback(metric_key="loss", accumulation_steps=2,
                             grad_clip_params={"func": "clip_grad_norm_", "max_norm": 1.0}),
        dl.EarlyStoppingCallback(metric="loss", patience=3, minimize=True),
    ],
    main_metric="accuracy01",
    minimize_metric=False,
    fp16=True,
    initial_seed=42,
    verbose=False,
)
metrics = runner.epoch_metrics
print(f"epochs={runner.global_epoch} valid accuracy01={metrics['valid_accuracy01']:.3f} "
      f"accuracy03={metrics['valid_accuracy03']:.3f} accuracy05={metrics['valid_accuracy05']:.3f}")
