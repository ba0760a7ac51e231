import math

import pytest
import torch

from torchstage.metrics import AUCMetric, roc_auc
from tests.metrics.helpers import batches, binary_data, multiclass_data, ref_auc, values


@pytest.mark.parametrize("ties", [False, True])
def test_binary_matches_pairwise_reference(ties):
    scores, targets = binary_data(ties=ties)
    metric = AUCMetric(prefix="valid/")
    for s, t in batches(scores, targets):
        metric.update(s, t)
    assert values(metric) == pytest.approx({"valid/auc": ref_auc(scores, targets)}, abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_sklearn_cross_check(ties):
    skm = pytest.importorskip("sklearn.metrics")
    scores, targets = binary_data(seed=4, ties=ties)
    assert float(roc_auc(scores, targets == 1)) == pytest.approx(skm.roc_auc_score(targets, scores), abs=1e-12)


def test_multilabel_per_column_and_macro_skipping_undefined_columns():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (60, 3), generator=g).float()
    targets = torch.randint(0, 2, (60, 3), generator=g)
    targets[:, 2] = 1  # one class only: undefined
    metric = AUCMetric(class_names=["a", "b", "c"])
    for s, t in batches(scores, targets, sizes=(25, 1, 34)):
        metric.update(s, t)
    got = values(metric)
    a, b = ref_auc(scores[:, 0], targets[:, 0]), ref_auc(scores[:, 1], targets[:, 1])
    assert got["auc/a"] == pytest.approx(a) and got["auc/b"] == pytest.approx(b) and math.isnan(got["auc/c"])
    assert got["auc"] == pytest.approx((a + b) / 2)


def test_multiclass_one_vs_rest_from_class_indices():
    scores, targets = multiclass_data(classes=4)
    metric = AUCMetric(average=None)
    for s, t in batches(scores, targets):
        metric.update(s, t)
    got = values(metric)
    expected = {f"auc/{c}": ref_auc(scores[:, c], targets == c) for c in range(4)}
    assert got == pytest.approx(expected, abs=1e-12)  # no "auc" key without average


def test_reset_and_errors():
    metric = AUCMetric()
    metric.update(torch.tensor([0.1, 0.9]), torch.tensor([1, 0]))
    metric.reset()
    metric.update(torch.tensor([0.1, 0.9]), torch.tensor([0, 1]))
    assert values(metric) == {"auc": 1.0}
    with pytest.raises(ValueError, match="earlier batches had 1"):
        metric.update(torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"outputs \(4, 2\) and targets \(4, 3\)"):
        AUCMetric().update(torch.zeros(4, 2), torch.zeros(4, 3))
    with pytest.raises(ValueError):
        AUCMetric(average="micro")
    with pytest.raises(ValueError, match="no samples"):
        AUCMetric().compute()
    one_class = AUCMetric()
    one_class.update(torch.rand(5), torch.ones(5))
    assert math.isnan(values(one_class)["auc"])
