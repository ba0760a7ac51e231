"""Classification with metric callbacks: accuracy (top-1, top-3), macro F1 and AUC, best checkpoint by accuracy.

Run: python scripts/classification_metrics.py [LOGDIR]
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import AccuracyCallback, AUCCallback, PrecisionRecallF1Callback, SupervisedRunner

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logdir-classification"
torch.manual_seed(0)
num_classes = 5
centers = torch.randn(num_classes, 16) * 2
y = torch.randint(0, num_classes, (3000,))
X = centers[y] + torch.randn(3000, 16)
train = DataLoader(TensorDataset(X[:2500], y[:2500]), batch_size=64, shuffle=True)
valid = DataLoader(TensorDataset(X[2500:], y[2500:]), batch_size=128)

model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, num_classes))
runner = SupervisedRunner()
runner.train(
    model=model,
    criterion=torch.nn.CrossEntropyLoss(),
    optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
    loaders={"train": train, "valid": valid},
    callbacks=[
        AccuracyCallback(topk=(1, 3)),
        PrecisionRecallF1Callback(num_classes=num_classes, average="macro"),
        AUCCallback(loaders="valid"),  # one-vs-rest AUC per class, on validation only
    ],
    valid_metric="accuracy",
    minimize_valid_metric=False,
    num_epochs=4,
    logdir=logdir,
    overwrite=True,
)
metrics = runner.epoch_metrics["valid"]
print(f"valid accuracy={metrics['accuracy']:.3f} f1={metrics['f1']:.3f} auc={metrics['auc']:.3f}")
