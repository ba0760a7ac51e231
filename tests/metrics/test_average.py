import pytest
import torch

from torchstage.metrics import AverageMetric, FunctionalMetric
from tests.metrics.helpers import SIZES, batches, multiclass_data, values


def test_average_weights_batch_means_by_count():
    per_sample = torch.rand(sum(SIZES), generator=torch.Generator().manual_seed(1))
    metric = AverageMetric()
    for (chunk,) in batches(per_sample):
        metric.update(chunk.mean(), len(chunk))
    assert values(metric) == pytest.approx({"loss": float(per_sample.double().mean())}, abs=1e-7)


def test_average_accepts_numbers_and_tensor_counts_and_detaches():
    metric = AverageMetric(name="err", prefix="valid/")
    w = torch.tensor(2.0, requires_grad=True)
    metric.update(w * 3, torch.tensor(3))  # 6 x 3
    metric.update(1.0, 1)
    out = metric.compute()
    assert list(out) == ["valid/err"] and not out["valid/err"].requires_grad
    assert float(out["valid/err"]) == pytest.approx(19 / 4)


def test_average_zero_count_and_bad_inputs():
    metric = AverageMetric()
    metric.update(torch.tensor(5.0), 0)
    with pytest.raises(ValueError, match="no samples"):
        metric.compute()
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        metric.update(torch.ones(3), 3)
    with pytest.raises(ValueError, match="count"):
        metric.update(torch.tensor(1.0), -1)
    with pytest.raises(TypeError):
        metric.update("x", 1)
    with pytest.raises(ValueError):
        AverageMetric(name="")


def test_functional_metric_is_a_batch_size_weighted_mean():
    scores, targets = multiclass_data()
    fn = lambda o, t: torch.nn.functional.cross_entropy(o, t)  # noqa: E731
    metric = FunctionalMetric(fn, "ce", prefix="train/")
    for o, t in batches(scores, targets):
        metric.update(o, t)
    expected = float(torch.nn.functional.cross_entropy(scores.double(), targets))
    assert values(metric) == pytest.approx({"train/ce": expected}, abs=1e-6)


def test_functional_metric_batch_size_sources():
    metric = FunctionalMetric(lambda o, t: o["x"].sum(), "s")
    with pytest.raises(ValueError, match="batch_size"):
        metric.update({"x": torch.ones(2)}, None)
    metric.update({"x": torch.ones(2)}, None, batch_size=2)  # value 2, weight 2
    metric.update({"x": torch.ones(1)}, torch.zeros(4))       # value 1, weight 4 from targets
    assert values(metric)["s"] == pytest.approx(8 / 6)
    with pytest.raises(TypeError):
        FunctionalMetric("not callable", "x")
