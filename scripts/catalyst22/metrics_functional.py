"""Catalyst 22's FunctionalMetricCallback, BatchTransformCallback and MetricAggregationCallback(metric_key=...),
moved by changing the import only.

The loss is an aggregate of two criterion callbacks (``loss = loss_ce + 0.5 * loss_smooth``, weighted sum);
``probs = softmax(logits, dim=1)`` comes from a transform with ``transform_kwargs``; two functional metrics read
it, one given by name and one by position (Catalyst 22's argument order).

Run: python scripts/catalyst22/metrics_functional.py [LOGDIR]
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl
from metrics_report import report

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-metrics-functional"
torch.manual_seed(0)

num_samples, num_features, num_classes = 1600, 10, 5
X = torch.rand(num_samples, num_features)
y = X[:, :num_classes].argmax(1)
loader = DataLoader(TensorDataset(X, y), batch_size=32)
loaders = {"train": loader, "valid": loader}

model = torch.nn.Linear(num_features, num_classes)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


def top1(probs, targets):
    return (probs.argmax(1) == targets).float().mean()


def true_class_probability(probs, targets):
    return probs.gather(1, targets[:, None]).mean()


runner = dl.SupervisedRunner(input_key="features", output_key="logits", target_key="targets", loss_key="loss")
runner.train(
    model=model,
    criterion={"ce": torch.nn.CrossEntropyLoss(), "smooth": torch.nn.CrossEntropyLoss(label_smoothing=0.2)},
    optimizer=optimizer,
    loaders=loaders,
    logdir=logdir,
    num_epochs=3,
    valid_loader="valid",
    valid_metric="top1",
    minimize_valid_metric=False,
    verbose=False,
    callbacks=[
        dl.BatchTransformCallback(transform=torch.softmax, scope="on_batch_end", input_key="logits",
                                  output_key="probs", transform_kwargs={"dim": 1}),
        dl.CriterionCallback(input_key="logits", target_key="targets", metric_key="loss_ce", criterion_key="ce"),
        dl.CriterionCallback(input_key="logits", target_key="targets", metric_key="loss_smooth",
                             criterion_key="smooth"),
        dl.MetricAggregationCallback(metric_key="loss", metrics={"loss_ce": 1.0, "loss_smooth": 0.5},
                                     mode="weighted_sum"),
        dl.FunctionalMetricCallback(input_key="probs", target_key="targets", metric_fn=top1, metric_key="top1"),
        dl.FunctionalMetricCallback("probs", "targets", true_class_probability, "p_true"),
    ],
)
valid = runner.epoch_metrics["valid"]
report({key: valid[key] for key in ["loss", "loss_ce", "loss_smooth", "top1", "p_true"]}, model)
