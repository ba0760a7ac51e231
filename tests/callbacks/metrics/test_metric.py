"""Metric callbacks publish loader-level values equal to a direct computation on the whole loader."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import (AccuracyCallback, AUCCallback, FunctionalMetricCallback, MetricCallback,
                        PrecisionRecallF1Callback, SupervisedRunner)
from torchstage.metrics import AverageMetric


def evaluate_fixed_model(callbacks, valid_metric="loss", minimize=True):
    torch.manual_seed(1)
    X, y = torch.randn(203, 5), torch.randint(0, 3, (203,))
    loader = DataLoader(TensorDataset(X, y), batch_size=32)  # uneven last batch
    model = torch.nn.Linear(5, 3)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                      loaders={"train": loader, "valid": loader}, callbacks=callbacks,
                                      valid_metric=valid_metric, minimize_valid_metric=minimize)
    with torch.no_grad():
        logits = model(X)
    return runner, logits, y


def test_accuracy_top1_top2_equal_direct_computation():
    runner, logits, y = evaluate_fixed_model([AccuracyCallback(topk=(1, 2))], "accuracy", False)
    top2 = logits.topk(2, dim=1).indices
    metrics = runner.epoch_metrics["valid"]
    assert metrics["accuracy"] == pytest.approx((logits.argmax(1) == y).double().mean().item(), abs=1e-12)
    assert metrics["accuracy_top2"] == pytest.approx((top2 == y[:, None]).any(1).double().mean().item(), abs=1e-12)


def test_macro_f1_and_per_class_auc():
    runner, logits, y = evaluate_fixed_model([PrecisionRecallF1Callback(num_classes=3, average="macro"),
                                              AUCCallback(class_names=["a", "b", "c"])], "f1", False)
    pred = logits.argmax(1)
    f1s = []
    for c in range(3):
        tp = ((pred == c) & (y == c)).sum().item()
        precision = tp / max((pred == c).sum().item(), 1)
        recall = tp / max((y == c).sum().item(), 1)
        f1s.append(0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall))
    metrics = runner.epoch_metrics["valid"]
    assert metrics["f1"] == pytest.approx(sum(f1s) / 3, abs=1e-12)
    scores = logits[:, 1]
    pos, neg = scores[y == 1], scores[y != 1]
    auc_b = ((pos[:, None] > neg[None, :]).double().mean() + 0.5 * (pos[:, None] == neg[None, :]).double().mean())
    assert metrics["auc/b"] == pytest.approx(auc_b.item(), abs=1e-12)


def test_functional_metric_and_loader_filter():
    mae = FunctionalMetricCallback(lambda out, tgt: (out.argmax(1) != tgt).float().mean(), name="error",
                                   loaders="valid")
    runner, logits, y = evaluate_fixed_model([mae], "error")
    assert runner.epoch_metrics["valid"]["error"] == pytest.approx(
        (logits.argmax(1) != y).double().mean().item(), abs=1e-7)
    assert "error" not in runner.epoch_metrics["train"]


def test_metric_callback_rejects_non_metrics():
    with pytest.raises(TypeError, match="metric must be a torchstage.metrics.Metric, got function"):
        MetricCallback(lambda a, b: a)
    assert MetricCallback(AverageMetric("x")).produces == ("x",)
