import pytest
import torch

from torchstage.metrics import PrecisionRecallF1Metric
from tests.metrics.helpers import batches, binary_data, multiclass_data, ref_prf, values


def _run(metric, outputs, targets):
    for o, t in batches(outputs, targets):
        metric.update(o, t)
    return values(metric)


@pytest.mark.parametrize("average", ["macro", "micro"])
def test_multiclass_matches_reference(average):
    scores, targets = multiclass_data(classes=7)  # 100 samples, 7 classes: some F1 terms are 0/0
    got = _run(PrecisionRecallF1Metric(num_classes=7, average=average), scores, targets)
    p, r, f = ref_prf(scores.argmax(1).tolist(), targets.tolist(), range(7), average)
    assert got == pytest.approx({"precision": p, "recall": r, "f1": f}, abs=1e-9)


def test_multiclass_absent_class_counts_as_zero():
    scores = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [5.0, 0, 0]])
    got = _run(PrecisionRecallF1Metric(num_classes=3), scores, torch.tensor([0, 1, 1]))
    # class 2 is neither predicted nor present: contributes 0 to every macro mean
    assert got == pytest.approx({"precision": (0.5 + 1 + 0) / 3, "recall": (1 + 0.5 + 0) / 3,
                                 "f1": (2 / 3 + 2 / 3 + 0) / 3})


@pytest.mark.parametrize("from_logits", [True, False])
def test_binary_matches_reference(from_logits):
    logits, targets = binary_data(seed=2)
    outputs = logits if from_logits else torch.sigmoid(logits)
    got = _run(PrecisionRecallF1Metric(threshold=0.4, from_logits=from_logits, prefix="v_"), outputs, targets)
    pred = (torch.sigmoid(logits) > 0.4).long().tolist()
    p, r, f = ref_prf(pred, targets.tolist(), [1], "macro")
    assert got == pytest.approx({"v_precision": p, "v_recall": r, "v_f1": f}, abs=1e-9)


def test_binary_zero_division_is_zero():
    metric = PrecisionRecallF1Metric()
    metric.update(torch.full((4,), -10.0), torch.zeros(4))  # nothing predicted, nothing positive
    assert values(metric) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


@pytest.mark.parametrize("average", ["macro", "micro"])
def test_sklearn_cross_check(average):
    skm = pytest.importorskip("sklearn.metrics")
    scores, targets = multiclass_data(classes=7, seed=5)
    got = _run(PrecisionRecallF1Metric(num_classes=7, average=average), scores, targets)
    p, r, f, _ = skm.precision_recall_fscore_support(targets.numpy(), scores.argmax(1).numpy(), labels=range(7),
                                                     average=average, zero_division=0)
    assert got == pytest.approx({"precision": p, "recall": r, "f1": f}, abs=1e-9)


def test_reset_and_errors():
    metric = PrecisionRecallF1Metric(num_classes=3)
    metric.update(torch.eye(3), torch.tensor([2, 2, 2]))
    metric.reset()
    metric.update(torch.eye(3), torch.tensor([0, 1, 2]))
    assert values(metric) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    with pytest.raises(ValueError, match=r"num_classes=3 but outputs have shape \(2, 4\)"):
        metric.update(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"outputs \(3,\) and targets \(3, 2\)"):
        PrecisionRecallF1Metric().update(torch.zeros(3), torch.zeros(3, 2))
    for bad in [dict(average="macro"), dict(num_classes=1), dict(num_classes=3, average="weighted")]:
        with pytest.raises(ValueError):
            PrecisionRecallF1Metric(**bad)
    with pytest.raises(ValueError, match="no samples"):
        PrecisionRecallF1Metric().compute()
