"""Catalyst 20.12 callback arguments: same run as torchstage's spelling, the ambiguous input_key refused."""
import pytest
import torch
from torch import nn

import torchstage as dl
from tests.conftest import regression_loaders
from tests.helpers import classification_loaders
from torchstage.metrics import AccuracyMetric


def run(callbacks, loaders=None, model=None, criterion=None, **kwargs):
    torch.manual_seed(0)
    model = model or nn.Linear(6, 5)
    runner = dl.SupervisedRunner()
    runner.train(model=model, criterion=criterion or nn.CrossEntropyLoss(),
                 optimizer=torch.optim.SGD(model.parameters(), lr=0.5), loaders=loaders or classification_loaders(classes=5, labels="random"),
                 num_epochs=2, callbacks=callbacks, **kwargs)
    return runner, {k: v.clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


@pytest.mark.parametrize("make, message", [
    (lambda: dl.CriterionCallback(input_key="targets"), r"CriterionCallback\(input_key='targets'\) would compare "
                                                         r"batch\['targets'\] with itself"),
    (lambda: dl.AccuracyCallback(input_key="targets"), r"add output_key='logits'"),
    (lambda: dl.AUCCallback(input_key="targets"), r"Catalyst 20.12's input_key named the target"),
    (lambda: dl.MetricCallback(AccuracyMetric(), input_key="targets"), r"would compare"),
    (lambda: dl.CriterionCallback(input_key="targets", output_key="logits", target_key="y"),
     r"input_key=<model output>, target_key=<target> \(torchstage\) or input_key=<target>"),
    (lambda: dl.CriterionCallback(prefix="loss", metric_key="loss"), r"metric_key=... or Catalyst 20.12's prefix"),
])
def test_ambiguous_or_mixed_key_arguments_are_refused(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_catalyst_criterion_keys_give_the_same_run():
    _, catalyst = run([dl.CriterionCallback(input_key="targets", output_key="logits", prefix="loss")])
    _, torchstage = run([dl.CriterionCallback(input_key="logits", target_key="targets", metric_key="loss")])
    assert_same(catalyst, torchstage)


def test_criterion_prefix_and_multiplier_with_metric_aggregation():
    runner, weights = run([
        dl.CriterionCallback(input_key="targets", output_key="logits", prefix="loss_a", multiplier=2.0),
        dl.CriterionCallback(input_key="targets", output_key="logits", prefix="loss_b"),
        dl.MetricAggregationCallback(prefix="loss", mode="weighted_sum", metrics={"loss_a": 0.25, "loss_b": 0.5}),
    ])
    _, plain = run([])  # loss = 0.25 * 2 * ce + 0.5 * ce = ce
    for key in weights:
        torch.testing.assert_close(weights[key], plain[key])
    valid = runner.epoch_metrics["valid"]
    assert valid["loss_a"] == pytest.approx(2 * valid["loss_b"]) and valid["loss"] == pytest.approx(valid["loss_b"])


def test_accuracy_args_log_accuracy01_and_accuracy03_equal_to_topk():
    runner, _ = run([dl.AccuracyCallback(input_key="targets", output_key="logits", accuracy_args=[1, 3]),
                     dl.AccuracyCallback(topk=(1, 3), prefix="ts_")])
    valid = runner.epoch_metrics["valid"]
    assert valid["accuracy01"] == valid["ts_accuracy"] and valid["accuracy03"] == valid["ts_accuracy_top3"]
    runner, _ = run([dl.AccuracyCallback(num_classes=5)], valid_metric="accuracy03", minimize_valid_metric=False)
    assert {"accuracy01", "accuracy03"} <= set(runner.epoch_metrics["valid"])
    assert "accuracy05" not in runner.epoch_metrics["valid"]


def test_multilabel_accuracy_counts_label_pairs():
    outputs = torch.tensor([[3.0, -3.0], [3.0, 3.0]])
    targets = torch.tensor([[1, 0], [0, 1]])
    loader = [{"features": outputs, "targets": targets}]
    metric = dl.MultiLabelAccuracyCallback(input_key="targets", output_key="logits", threshold=0.5, prefix="ml")
    values = dl.SupervisedRunner(model=nn.Identity()).evaluate_loader(loader, callbacks=[metric])
    assert values == {"ml": pytest.approx(0.75)}
    values = dl.SupervisedRunner(model=nn.Identity()).evaluate_loader(
        loader, callbacks=[dl.MultiLabelAccuracyCallback(threshold=0.99, activation="Sigmoid")])
    assert values == {"multilabel_accuracy": pytest.approx(0.5)}


def test_catalyst_metric_callback_by_position_and_by_name():
    def mae(outputs, targets, scale=1.0):
        return (outputs.argmax(1) - targets).abs().float().mean() * scale

    runner, _ = run([dl.MetricCallback("mae", mae, "targets", "logits", scale=2.0),
                     dl.MetricCallback(prefix="mae1", metric_fn=mae, input_key="targets", output_key="logits"),
                     dl.FunctionalMetricCallback(mae, name="mae_ts")])
    valid = runner.epoch_metrics["valid"]
    assert valid["mae1"] == pytest.approx(valid["mae_ts"]) and valid["mae"] == pytest.approx(2 * valid["mae_ts"])


def test_grad_clip_params_and_accumulation_give_the_same_run_as_torchstage_arguments():
    _, catalyst = run([dl.OptimizerCallback(metric_key="loss", accumulation_steps=2,
                                            grad_clip_params={"func": "clip_grad_norm_", "max_norm": 0.1})])
    _, torchstage = run([], accumulation_steps=2, grad_clip_norm=0.1)
    _, unclipped = run([], accumulation_steps=2)
    assert_same(catalyst, torchstage)
    assert not torch.equal(catalyst["weight"], unclipped["weight"])
    _, by_value = run([dl.OptimizerCallback(grad_clip_params={"func": "clip_grad_value_", "clip_value": 0.01})])
    _, value = run([], grad_clip_value=0.01)
    assert_same(by_value, value)


@pytest.mark.parametrize("kwargs, message", [
    ({"grad_clip_params": {"func": "clip_grad_norm_", "max_norm": 1, "norm_type": 1}}, r"is not supported"),
    ({"grad_clip_params": {"func": "clip_grad_norm_", "max_norm": 1}, "grad_clip_norm": 1.0}, r"not both"),
    ({"decouple_weight_decay": True}, r"use torch.optim.AdamW"),
    ({"use_apex": True}, r"apex was removed"),
])
def test_catalyst_optimizer_arguments_without_a_meaning_here_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        dl.OptimizerCallback(**kwargs)


def test_early_stopping_metric_is_metric_key():
    def stopped_at(callback):
        model = nn.Linear(4, 1)
        runner = dl.SupervisedRunner()
        runner.train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                     loaders=regression_loaders(), num_epochs=10, callbacks=[callback])
        return runner.epoch

    assert stopped_at(dl.EarlyStoppingCallback(patience=2, metric="loss", minimize=True)) == 3
    assert stopped_at(dl.EarlyStoppingCallback(patience=2, metric_key="loss")) == 3
    with pytest.raises(TypeError, match="pass them by name"):
        dl.EarlyStoppingCallback(2, "loss", True)


class Count(dl.Callback):
    def __init__(self):
        super().__init__(dl.CallbackOrder.Internal + 1)
        self.counts = {}

    def on_batch_start(self, runner):
        key = (runner.epoch, runner.loader_key)
        self.counts[key] = self.counts.get(key, 0) + 1


class Firsts(dl.Callback):
    """The first input row of each batch, per (epoch, loader)."""

    def __init__(self):
        super().__init__(dl.CallbackOrder.Internal + 1)
        self.rows = {}

    def on_batch_start(self, runner):
        batch = runner.batch
        self.rows.setdefault((runner.epoch, runner.loader_key), []).append(batch[0][0].clone())


def test_check_run_callback_runs_num_batch_steps_for_num_epoch_steps():
    count = Count()
    loaders = classification_loaders(n=160, classes=5, labels="random")  # 10 batches per loader
    run([count, dl.CheckRunCallback(num_batch_steps=3, num_epoch_steps=1)], loaders=loaders)
    assert count.counts == {(1, "train"): 3, (1, "valid"): 3}
    count = Count()
    run([count, dl.CheckRunCallback()], loaders=loaders)  # 20.12's defaults: 3 batches, 2 epochs
    assert count.counts == {(e, name): 3 for e in (1, 2) for name in ("train", "valid")}


def test_batch_overfit_callback_takes_counts_and_shares_per_loader():
    count = Count()
    loaders = classification_loaders(n=160, classes=5, labels="random")
    seen = Firsts()
    run([count, seen, dl.BatchOverfitCallback(train=2, valid=0.5)], loaders=loaders)
    # Catalyst's meaning (20.12 and 22): the first 2 (train) and 5 (valid: half of 10) batches repeated for the
    # loader's whole length, in Catalyst 22.04's order (step i of n takes batch i-1 below n, then (i - n) % n)
    assert count.counts == {(e, name): 10 for e in (1, 2) for name in ("train", "valid")}
    for name, order in (("train", [0, 0, 1, 0, 1, 0, 1, 0, 1, 0]), ("valid", [0, 1, 2, 3, 0, 1, 2, 3, 4, 0])):
        firsts = [x[0] for x, _ in loaders[name]]
        assert [next(i for i, first in enumerate(firsts) if torch.equal(first, row))
                for row in seen.rows[(1, name)]] == order
    with pytest.raises(ValueError, match=r"BatchOverfitCallback\(train=0\)"):
        dl.BatchOverfitCallback(train=0)
