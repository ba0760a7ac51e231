"""Catalyst 20.12 on the runner: train() argument names, fp16=, attribute names and the _handle_batch override."""
import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl
from tests.conftest import regression_loaders
from tests.helpers import classification_loaders


def trained_weights(runner_cls=dl.SupervisedRunner, runner_kwargs=None, **train_kwargs):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    runner = runner_cls(**(runner_kwargs or {}))
    kwargs = dict(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  loaders=regression_loaders(), num_epochs=2)
    kwargs.update(train_kwargs)
    runner.train(**kwargs)
    return runner, {k: v.clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_renamed_train_arguments_give_the_same_run_as_torchstage_names():
    _, catalyst = trained_weights(main_metric="loss", minimize_metric=True, initial_seed=7, fp16=False)
    _, torchstage = trained_weights(valid_metric="loss", minimize_valid_metric=True, seed=7, amp=None)
    assert_same(catalyst, torchstage)
    runner, _ = trained_weights(initial_seed=7)
    assert runner.spec.seed == 7 and runner.main_metric == "loss" and runner.minimize_metric is True


def test_input_target_key_is_target_key():
    def dict_loaders():
        x, y = regression_loaders()["train"].dataset.tensors
        batches = [{"features": x[i:i + 16], "y": y[i:i + 16]} for i in range(0, 64, 16)]
        return {"train": batches, "valid": batches}

    runner_a, catalyst = trained_weights(runner_kwargs={"input_target_key": "y"}, loaders=dict_loaders())
    _, torchstage = trained_weights(runner_kwargs={"target_key": "y"}, loaders=dict_loaders())
    assert runner_a.target_key == "y"
    assert_same(catalyst, torchstage)
    with pytest.raises(TypeError, match="target_key=... or Catalyst 20.12's input_target_key=..., not both"):
        dl.SupervisedRunner(target_key="a", input_target_key="b")


class Dtypes(dl.Callback):
    def __init__(self):
        super().__init__(dl.CallbackOrder.Metric + 1)
        self.seen = set()

    def on_batch_end(self, runner):
        self.seen.add(runner.batch["logits"].dtype)


def test_fp16_true_on_cpu_trains_in_full_precision_as_catalyst_did_and_says_so(caplog, monkeypatch):
    """Catalyst (20.12 and 22) trained in float32 where float16 cannot run: the same weights as amp=None."""
    monkeypatch.setattr("torchstage.logging_setup._noted", set())  # notes are once per process
    dtypes = Dtypes()
    with caplog.at_level(logging.INFO, logger="torchstage"):
        runner, weights = trained_weights(fp16=True, callbacks=[dtypes])
    assert runner.amp_dtype is None and runner.scaler is None
    assert dtypes.seen == {torch.float32}
    assert "fp16=True (amp='fp16-or-full'): float16 needs CUDA; this run on cpu trains in full precision " \
           "(float32), as Catalyst did" in caplog.text
    assert "train(fp16=...) is Catalyst 20.12's spelling" in caplog.text
    _, full = trained_weights(amp=None)
    assert_same(weights, full)
    _, bf16 = trained_weights(amp="bf16")  # what torchstage did before: not Catalyst's result
    assert not torch.equal(weights["weight"], bf16["weight"])


@pytest.mark.parametrize("fp16, amp", [({"amp": True}, "fp16-or-full"), ({"opt_level": "O1"}, "fp16-or-full"),
                                       ({"apex": True}, "fp16-or-full"), ({"opt_level": "O0"}, None), ({}, None),
                                       (False, None), (None, None), (True, "fp16-or-full")])
def test_fp16_values_map_to_amp(fp16, amp):
    from torchstage.catalyst.runner import fp16_to_amp
    assert fp16_to_amp(fp16) == amp


@pytest.mark.parametrize("fp16, message", [
    ({"opt_level": "O2"}, r"opt_level 'O2': apex was removed from torchstage"),
    ({"apex": True, "opt_level": "O3"}, r"opt_level 'O3': apex was removed"),
    ({"amp": True, "loss_scale": "dynamic"}, r"keys \['loss_scale'\] are apex settings"),
    ("O1", r"fp16 must be True, False or a dict"),
])
def test_apex_settings_are_refused_before_training(fp16, message):
    with pytest.raises((ValueError, TypeError), match=message):
        trained_weights(fp16=fp16, callbacks=[NeverRuns()])


class NeverRuns(dl.Callback):
    def on_experiment_start(self, runner):
        raise AssertionError("training started")


@pytest.mark.parametrize("kwargs, message", [
    ({"fp16": True, "amp": "bf16"}, r"both fp16= \(Catalyst 20.12's name\) and amp="),
    ({"main_metric": "loss", "valid_metric": "loss"}, r"both main_metric= .* and valid_metric="),
    ({"checkpoint_data": {"a": 1}}, r"train\(checkpoint_data=...\) is Catalyst 20.12's and has no torchstage"),
    ({"stage_kwargs": {}}, r"stages=\{'name'"),
])
def test_conflicting_or_gone_arguments_fail_before_training(kwargs, message):
    with pytest.raises(TypeError, match=message):
        trained_weights(callbacks=[NeverRuns()], **kwargs)


def test_empty_loader_raises_runner_exception():
    empty = DataLoader(TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1)))
    with pytest.raises(dl.RunnerException, match=r"loaders\['valid'\] is empty"):
        trained_weights(loaders={"train": regression_loaders()["train"], "valid": empty}, callbacks=[NeverRuns()])
    assert issubclass(dl.RunnerException, ValueError)


def test_flat_epoch_metrics_keys_read_the_nested_values():
    runner, _ = trained_weights()
    assert runner.epoch_metrics["train_loss"] == runner.epoch_metrics["train"]["loss"]
    assert runner.epoch_metrics.get("valid_loss") == runner.epoch_metrics["valid"]["loss"]
    assert runner.epoch_metrics.get("valid_nothing", -1) == -1
    with pytest.raises(KeyError):
        runner.epoch_metrics["test_loss"]
    assert runner.valid_metrics == runner.epoch_metrics["valid"]


class Catalyst20Attributes(dl.Callback):
    """Reads the runner the way Catalyst 20.12 callbacks did."""

    def __init__(self):
        super().__init__(dl.CallbackOrder.External, node=dl.CallbackNode.all)
        self.rows = []

    def on_batch_end(self, runner):
        self.rows.append((runner.stage, runner.global_epoch, runner.loader_name, runner.loader_batch_step,
                          runner.loader_len, runner.is_valid_loader, runner.is_infer_loader, runner.device.type,
                          runner.distributed_rank, runner.is_distributed_master, runner.state is runner,
                          sorted(runner.input), sorted(runner.output)))


def test_catalyst_runner_attributes_read_torchstage_state():
    seen = Catalyst20Attributes()
    trained_weights(callbacks=[seen])
    assert len(seen.rows) == 16
    assert seen.rows[0] == ("main", 1, "train", 0, 4, False, False, "cpu", 0, True, True,
                            ["features", "logits", "targets"], ["features", "logits", "targets"])
    assert seen.rows[-1][:6] == ("main", 2, "valid", 3, 4, True)


def test_setting_need_early_stop_says_what_to_raise_instead():
    class Stopper(dl.Callback):
        def on_epoch_end(self, runner):
            runner.need_early_stop = True

    with pytest.raises(AttributeError, match=r"raise torchstage.CancelLoader\(\).*CancelStage\(\)"):
        trained_weights(callbacks=[Stopper()])


class Catalyst20Runner(dl.Runner):
    """A custom runner written for Catalyst 20.12: it overrides _handle_batch and fills self.output."""

    def _handle_batch(self, batch):
        x, y = batch
        logits = self.model(x.to(self.device))
        self.output = {"logits": logits}
        self.input = {"features": x, "targets": y}
        loss = F.cross_entropy(logits, y)
        self.batch_metrics.update({"loss": loss, "epoch": float(self.global_epoch)})
        if self.is_train_loader:
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()

    def predict_batch(self, batch):
        return self.model(batch[0].to(self.device))


class ReadsInputOutput(dl.Callback):
    """A Catalyst-style metric callback: accuracy from runner.input/runner.output into batch_metrics."""

    def __init__(self):
        super().__init__(order=dl.CallbackOrder.metric)

    def on_batch_end(self, runner):
        hit = runner.output["logits"].argmax(1) == runner.input["targets"]
        runner.batch_metrics["my_accuracy"] = hit.float().mean()


def test_a_catalyst_style_custom_runner_trains_with_callbacks_reading_input_and_output():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    runner = Catalyst20Runner()
    runner.train(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05), num_epochs=6,
                 loaders=classification_loaders(), callbacks=[ReadsInputOutput(), dl.AccuracyCallback(
                     input_key="targets", output_key="logits", accuracy_args=[1, 2])],
                 main_metric="my_accuracy", minimize_metric=False)
    assert {"reads_input_output", "accuracy"} <= set(runner.callbacks)
    last = runner.epoch_metrics["valid"]
    assert last["my_accuracy"] == pytest.approx(last["accuracy01"])
    assert last["accuracy01"] > 0.8 and last["accuracy02"] >= last["accuracy01"]
    assert last["epoch"] == 6.0
    predictions = torch.cat(list(runner.predict_loader(loader=classification_loaders()["valid"])))
    assert predictions.shape == (96, 3)


def test_catalyst_handle_batch_of_a_supervised_runner_gets_the_batch_as_a_dict():
    class Scaled(dl.SupervisedRunner):
        def _handle_batch(self, batch):
            self.output = {"logits": self.model(batch["features"]) * 1.0}

    runner, weights = trained_weights(runner_cls=Scaled)
    _, plain = trained_weights()
    assert_same(weights, plain)


def test_a_runner_defining_both_override_points_is_refused():
    with pytest.raises(TypeError, match="defines both handle_batch .* and _handle_batch"):
        class Both(dl.Runner):
            def handle_batch(self, batch): pass
            def _handle_batch(self, batch): pass


def test_runner_device_argument_builds_the_engine():
    runner = dl.SupervisedRunner(device="cpu")
    assert runner.engine.device == torch.device("cpu") and runner.device == torch.device("cpu")
    assert dl.Runner(None, "cpu").engine.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16 autocast with a grad scaler needs CUDA")
def test_fp16_true_on_cuda_trains_under_float16_with_a_grad_scaler():
    dtypes = Dtypes()
    runner, weights = trained_weights(fp16=True, callbacks=[dtypes])
    assert runner.amp_dtype is torch.float16 and runner.scaler is not None
    assert dtypes.seen == {torch.float16}
    assert all(torch.isfinite(v).all() for v in weights.values())
