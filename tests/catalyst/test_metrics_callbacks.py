"""Catalyst 22's metric names on torchstage: the same numbers as Catalyst 22.04 (recorded from it on fixed inputs),
each noted once, the arguments of another version refused with both spellings."""
import logging
import math

import pytest
import torch
from torch import nn

import torchstage as dl
from torchstage import metrics

LOGITS = torch.tensor([[2., 1, 0], [0, 3, 1], [1, 0, 4], [5, 1, 0], [0, 1, 0.5], [0, 0, 1]])
CLASSES = torch.tensor([0, 1, 1, 0, 2, 2])
PREDS = torch.tensor([[1., 0, 1], [0, 1, 0], [1, 1, 0], [0.7, 0, 1]])
LABELS = torch.tensor([[1., 0, 0], [0, 1, 1], [1, 0, 0], [1, 0, 1]])


def evaluate(callbacks, outputs, targets, split=3):
    """Loader metrics of ``callbacks`` over two batches of (outputs, targets), the model an identity."""
    loader = [{"features": outputs[:split], "targets": targets[:split]},
              {"features": outputs[split:], "targets": targets[split:]}]
    return dl.SupervisedRunner(model=nn.Identity()).evaluate_loader(loader, callbacks=callbacks)


@pytest.fixture
def notes(caplog, monkeypatch):
    monkeypatch.setattr("torchstage.logging_setup._noted", set())
    with caplog.at_level(logging.INFO, logger="torchstage"):
        yield caplog


def test_additive_metric_is_catalyst_22s_running_mean_and_std(notes):
    meter = metrics.AdditiveMetric(compute_on_call=False)
    assert all(math.isnan(v) for v in meter.compute())
    for value, count in zip([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]):
        assert meter(value, count) == value  # compute_on_call=False: a call returns the value added
    assert meter.compute() == (pytest.approx(3.6666666666666665, abs=1e-15), pytest.approx(1.2909944487358058))
    meter.reset()
    assert math.isnan(meter.compute()[0]) and meter.update(7.0, 3) == 7.0 and meter.compute() == (7.0, 0.0)
    on_call = metrics.AdditiveValueMetric(compute_on_call=True, mode="torch")  # tensors, copied to the host
    results = [on_call(torch.tensor(v), n) for v, n in [(0.5, 4), (0.25, 2), (1.0, 3)]]
    assert [tuple(float(x) for x in r) for r in results] == [  # Catalyst 22.04's (float32) numbers
        (0.5, 0.0), pytest.approx((0.41666666, 0.12909944)), pytest.approx((0.6111111, 0.30900827))]
    with pytest.raises(ValueError, match=r"AdditiveMetric\(mode='jax'\): expected one of \('numpy', 'torch'\)"):
        metrics.AdditiveMetric(mode="jax")
    assert notes.text.count("metrics.AdditiveMetric(compute_on_call=...) (a host-side mean/std meter) is Catalyst "
                            "22's spelling; torchstage's is metrics.AverageMetric") == 1
    assert issubclass(metrics.AccuracyMetric, metrics.AdditiveStateMetric)  # torchstage's own base, renamed


def test_accuracy_callback_with_catalyst_22_arguments_logs_accuracy01(notes):
    values = evaluate([dl.AccuracyCallback(input_key="features", target_key="targets", num_classes=3),
                       dl.AccuracyCallback(input_key="features", target_key="targets", topk=(1, 2), prefix="one_",
                                           suffix="_x", log_on_batch=False),
                       dl.AccuracyCallback(input_key="features", target_key="targets", topk=(1, 2))], LOGITS, CLASSES)
    assert values["accuracy01"] == values["one_accuracy01_x"] == values["accuracy"] == pytest.approx(4 / 6)
    assert values["one_accuracy02_x"] == values["accuracy_top2"] == pytest.approx(5 / 6)
    assert "accuracy03" not in values  # 3 classes: Catalyst's default top-k is (1,)
    assert "AccuracyCallback(input_key, target_key, num_classes=...) (keys accuracy01, accuracy03) is Catalyst " \
           "22's spelling; torchstage's is AccuracyCallback(input_key, target_key, topk=(1, 3))" in notes.text


@pytest.mark.parametrize("kwargs", [
    {"input_key": "logits", "target_key": "targets", "num_classes": 4, "accuracy_args": [1, 3]},
    {"input_key": "targets", "output_key": "logits", "suffix": "_x"},
    {"input_key": "targets", "output_key": "logits", "num_classes": 4, "log_on_batch": True},
])
def test_accuracy_arguments_of_20_12_and_22_together_are_refused_with_both_spellings(kwargs):
    with pytest.raises(TypeError, match=r"\(Catalyst 20.12\) with .* \(Catalyst 22\): write AccuracyCallback\("
                                        r"input_key=<target>, output_key=<model output>.*\(20.12\) or "
                                        r"AccuracyCallback\(input_key=<model output>, target_key=<target>.*\(22\), "
                                        r"not a mix"):
        dl.AccuracyCallback(**kwargs)


def test_precision_recall_f1_support_equals_catalyst_22(notes):
    values = evaluate([dl.PrecisionRecallF1SupportCallback(input_key="features", target_key="targets",
                                                           compute_per_class_metrics=True)], LOGITS, CLASSES)
    assert values == pytest.approx({  # Catalyst 22.04, the same two batches, num_classes from the logits
        "precision/_micro": 0.6666666666666667, "recall/_micro": 0.6666666666666667, "f1/_micro": 0.6666616667041664,
        "precision/_macro": 0.6666666666666666, "recall/_macro": 0.6666666666666666, "f1/_macro": 0.6666616667083329,
        "precision/_weighted": 0.6666666666666666, "recall/_weighted": 0.6666666666666666,
        "f1/_weighted": 0.6666616667083329, "precision/class_00": 1.0, "precision/class_01": 0.5,
        "precision/class_02": 0.5, "recall/class_00": 1.0, "recall/class_01": 0.5, "recall/class_02": 0.5,
        "f1/class_00": 0.9999950000249999, "f1/class_01": 0.49999500004999947, "f1/class_02": 0.49999500004999947,
        "support/class_00": 2.0, "support/class_01": 2.0, "support/class_02": 2.0}, rel=1e-12)
    assert "PrecisionRecallF1SupportCallback(input_key, target_key, ...) (keys precision/_macro, f1/_micro...) is " \
           "Catalyst 22's spelling; torchstage's is PrecisionRecallF1Callback(" in notes.text


def test_multilabel_callbacks_read_activated_outputs_as_catalyst_22(caplog):
    values = evaluate([dl.MultilabelPrecisionRecallF1SupportCallback(input_key="features", target_key="targets",
                                                                     compute_per_class_metrics=True),
                       dl.MultilabelAccuracyCallback(input_key="features", target_key="targets", threshold=0.6),
                       dl.MultilabelAccuracyCallback(input_key="features", target_key="targets", threshold=0.8,
                                                     prefix="high_")],
                      PREDS, LABELS, split=2)
    # Catalyst 22.04: 0.7 is not a predicted label (it counts outputs equal to 1), so class 0's recall is 2/3
    assert values["recall/class_00"] == pytest.approx(0.6666666666666667)
    assert values["f1/_macro"] == pytest.approx(0.6555508074435503, rel=1e-12)
    assert values["precision/_weighted"] == pytest.approx(0.75) and values["support/class_00"] == 3.0
    assert "MultilabelPrecisionRecallF1SupportCallback: 1 outputs were neither 0 nor 1; as in Catalyst 22 only " \
           "outputs equal to 1 count as predicted labels" in caplog.text
    assert values["accuracy"] == pytest.approx(0.75)  # Catalyst 22.04: (outputs > 0.6) == targets, no sigmoid
    assert values["high_accuracy"] == pytest.approx(8 / 12)
    sigmoid = evaluate([dl.MultiLabelAccuracyCallback(input_key="features", target_key="targets", threshold=0.8)],
                       PREDS, LABELS, split=2)
    assert sigmoid["multilabel_accuracy"] == pytest.approx(6 / 12)  # torchstage's class applies a sigmoid first


def test_functional_metric_callback_by_catalyst_22_name_and_position_equals_torchstage(notes):
    def mae(outputs, targets):
        return (outputs.argmax(1) - targets).abs().float().mean()

    values = evaluate([dl.FunctionalMetricCallback(input_key="features", target_key="targets", metric_fn=mae,
                                                   metric_key="mae", prefix="a_"),
                       dl.FunctionalMetricCallback("features", "targets", mae, "mae", suffix="_b"),
                       dl.FunctionalMetricCallback(mae, "mae_ts", input_key="features")], LOGITS, CLASSES)
    assert values["a_mae"] == values["mae_b"] == values["mae_ts"] == pytest.approx(2 / 6)
    assert "FunctionalMetricCallback(input_key, target_key, metric_fn, metric_key) is Catalyst 22's" in notes.text
    with pytest.raises(TypeError, match=r"give fn, name \(torchstage\) or Catalyst 22's metric_fn=, metric_key=, not"):
        dl.FunctionalMetricCallback(mae, "x", metric_fn=mae, metric_key="y")
    with pytest.raises(TypeError, match=r"needs metric_fn=<callable> and metric_key=<name>"):
        dl.FunctionalMetricCallback(input_key="logits", target_key="targets", metric_fn=mae)
    with pytest.raises(TypeError, match=r"metric_fn given by position and by name"):
        dl.FunctionalMetricCallback("logits", "targets", mae, "m", metric_fn=mae)


def test_batch_transform_callback_resolves_import_paths_and_checks_its_arguments():
    probs = evaluate([dl.BatchTransformCallback("torch.softmax", "on_batch_end", "features", "probs",
                                                transform_kwargs={"dim": 1}),
                      dl.BatchTransformCallback(lambda p, t: ((p.argmax(1) == t).float(),), "on_batch_end",
                                                ["probs", "targets"], ["hit"]),
                      dl.FunctionalMetricCallback(lambda hit, _: hit.mean(), "acc", input_key="hit")],
                     LOGITS, CLASSES)
    assert probs["acc"] == pytest.approx(4 / 6)
    start = evaluate([dl.BatchTransformCallback(lambda batch: {**batch, "features": -batch["features"]},
                                                "on_batch_start"),
                      dl.AccuracyCallback(input_key="logits", target_key="targets")], LOGITS, CLASSES)
    assert start["accuracy"] == pytest.approx(1 / 6)  # negated before the model ran: the argmin, right once
    with pytest.raises(ValueError, match=r"transform='torch.sigmoidd'\): cannot import 'torch.sigmoidd'.*did you "
                                         r"mean 'torch.sigmoid'"):
        dl.BatchTransformCallback("torch.sigmoidd", "on_batch_end", "logits")
    with pytest.raises(ValueError, match=r"scope must be one of \('on_batch_end', 'on_batch_start'\), got 'batch'"):
        dl.BatchTransformCallback(torch.sigmoid, "batch", "logits")
    with pytest.raises(TypeError, match=r"output_key=\['hit'\]\): the transform returned a Tensor, expected a tuple or "
                                        r"list of 1 value"):
        evaluate([dl.BatchTransformCallback(lambda p: p, "on_batch_end", ["features"], ["hit"])], LOGITS, CLASSES)
    with pytest.raises(TypeError, match=r"output_key needs input_key"):
        dl.BatchTransformCallback(torch.sigmoid, "on_batch_end", output_key="scores")


def test_metric_aggregation_metric_key_is_prefix():
    a = dl.MetricAggregationCallback(metric_key="loss", metrics=["l1", "l2"], mode="sum")
    assert a.prefix == "loss" and a.produces == ("loss",)
    with pytest.raises(TypeError, match=r"give prefix=... or Catalyst 22's metric_key=..., not both"):
        dl.MetricAggregationCallback("loss", metric_key="loss")


def test_optuna_pruning_callback_catalyst_22_arguments():
    callback = dl.OptunaPruningCallback(None, loader_key="valid", metric_key="accuracy01", minimize=False)
    assert (callback.loader, callback.metric, callback.minimize, callback.min_delta) == (
        "valid", "accuracy01", False, 1e-6)
    with pytest.raises(TypeError, match=r"give loader=... or Catalyst 22's loader_key=..., not both"):
        dl.OptunaPruningCallback(None, "valid", loader_key="valid")
