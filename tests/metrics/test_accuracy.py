import pytest
import torch

from torchstage.metrics import AccuracyMetric
from tests.metrics.helpers import batches, binary_data, multiclass_data, ref_topk_accuracy, values


def test_topk_multiclass_matches_reference_over_uneven_batches():
    scores, targets = multiclass_data(classes=6)
    metric = AccuracyMetric(topk=(1, 3, 6), prefix="valid/")
    for o, t in batches(scores, targets):
        metric.update(o, t)
    expected = {"valid/accuracy": ref_topk_accuracy(scores, targets, 1),
                "valid/accuracy_top3": ref_topk_accuracy(scores, targets, 3), "valid/accuracy_top6": 1.0}
    assert values(metric) == pytest.approx(expected, abs=1e-9)


def test_sklearn_cross_check():
    skm = pytest.importorskip("sklearn.metrics")
    scores, targets = multiclass_data(classes=6, seed=3)
    metric = AccuracyMetric(topk=2)
    for o, t in batches(scores, targets):
        metric.update(o, t)
    expected = skm.top_k_accuracy_score(targets.numpy(), scores.numpy(), k=2, labels=list(range(6)))
    assert values(metric)["accuracy_top2"] == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("from_logits", [True, False])
def test_binary_threshold_on_logits_or_probabilities(from_logits):
    logits, targets = binary_data()
    outputs = logits if from_logits else torch.sigmoid(logits)
    metric = AccuracyMetric(threshold=0.7, from_logits=from_logits)
    for o, t in batches(outputs[:, None], targets[:, None]):  # (N, 1) columns are binary too
        metric.update(o, t)
    expected = float(((torch.sigmoid(logits) > 0.7).long() == targets).double().mean())
    assert values(metric) == pytest.approx({"accuracy": expected}, abs=1e-9)


def test_reset_and_errors():
    metric = AccuracyMetric()
    metric.update(torch.tensor([[2.0, 1.0]]), torch.tensor([1]))
    metric.reset()
    metric.update(torch.tensor([[2.0, 1.0]]), torch.tensor([0]))
    assert values(metric) == {"accuracy": 1.0}
    with pytest.raises(ValueError, match=r"outputs \(4, 3\) and targets \(5,\)"):
        metric.update(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="one-hot"):
        metric.update(torch.zeros(4, 3), torch.zeros(4, 3))
    with pytest.raises(TypeError, match="integer class indices"):
        metric.update(torch.zeros(4, 3), torch.zeros(4))
    with pytest.raises(ValueError, match="exceeds"):
        AccuracyMetric(topk=(1, 5)).update(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="binary"):
        AccuracyMetric(topk=(1, 2)).update(torch.zeros(4), torch.zeros(4))
    for bad in [dict(topk=0), dict(topk=(1, 1)), dict(threshold=1.5)]:
        with pytest.raises(ValueError):
            AccuracyMetric(**bad)
    with pytest.raises(ValueError, match="no samples"):
        AccuracyMetric().compute()
