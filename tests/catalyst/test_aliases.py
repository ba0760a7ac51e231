"""Catalyst 20.12 names on torchstage itself: each resolves to torchstage's object, noted once, or is refused."""
import logging

import pytest
import torch
from torch import nn

import torchstage
import torchstage as dl
import torchstage as utils
from tests.conftest import regression_loaders


def weights_after(callbacks, seed_fn=None):
    (seed_fn or torchstage.set_seed)(3)
    model = nn.Linear(4, 1)
    dl.SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=regression_loaders(), num_epochs=2,
                                optimizer=torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks)
    return model.state_dict()


@pytest.mark.parametrize("old, new", [("CallbackNode", "CallbackScope"), ("set_global_seed", "set_seed"),
                                      ("TensorboardLogger", "TensorBoardLogger"), ("VerboseLogger", "ProgressBar"),
                                      ("BatchMetricCallback", "MetricCallback")])
def test_module_aliases_are_torchstage_objects_noted_once(old, new, caplog, monkeypatch):
    monkeypatch.setattr("torchstage.logging_setup._noted", set())
    with caplog.at_level(logging.INFO, logger="torchstage"):
        assert getattr(dl, old) is getattr(torchstage, new)
        assert getattr(utils, old) is getattr(torchstage, new)
    assert caplog.text.count(f"torchstage.{old} is Catalyst 20.12's spelling; torchstage's is torchstage.{new}") == 1
    assert old not in torchstage.__all__


def test_unknown_names_still_raise_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'SupervisedExperiment'"):
        dl.SupervisedExperiment


def test_set_global_seed_gives_the_same_weights_as_set_seed():
    a = weights_after([], seed_fn=utils.set_global_seed)
    b = weights_after([], seed_fn=torchstage.set_seed)
    for key in a:
        assert torch.equal(a[key], b[key])


class Scaled(dl.Callback):
    """Scales the loss: order and scope decide whether and when it runs."""

    def on_batch_end(self, runner):
        runner.batch_metrics["loss"] = runner.batch_metrics["loss"] * 0.5


class CatalystStyle(Scaled):
    def __init__(self):
        super().__init__(dl.CallbackOrder.metric + 1, node=dl.CallbackNode.master)


class TorchstageStyle(Scaled):
    order = dl.CallbackOrder.Metric + 1
    scope = dl.CallbackScope.Main


def test_positional_catalyst_callback_construction_gives_the_same_run():
    catalyst, torchstage_style = weights_after([CatalystStyle()]), weights_after([TorchstageStyle()])
    plain = weights_after([])
    for key in catalyst:
        assert torch.equal(catalyst[key], torchstage_style[key])
    assert not torch.equal(catalyst["weight"], plain["weight"])
    callback = CatalystStyle()
    assert callback.order == 21 and callback.scope == dl.CallbackScope.Main


@pytest.mark.parametrize("lower, member", [("internal", "Internal"), ("metric", "Metric"),
                                           ("metric_aggregation", "MetricAggregation"), ("optimizer", "Optimizer"),
                                           ("scheduler", "Scheduler"), ("logging", "Logging"),
                                           ("external", "External")])
def test_lower_case_order_members(lower, member):
    assert getattr(dl.CallbackOrder, lower) is dl.CallbackOrder[member]


@pytest.mark.parametrize("make, error, message", [
    (lambda: dl.CallbackScope.stage, AttributeError, r"lifetime across stages; torchstage has no such setting"),
    (lambda: dl.CallbackScope.experiment, AttributeError, r"Drop the scope=... argument"),
    (lambda: dl.CallbackNode.worker, AttributeError, r"no torchstage equivalent"),
    (lambda: dl.CallbackOrder.Validation, AttributeError, r"use CallbackOrder.Optimizer \+ 10"),
    (lambda: dl.Callback(20, 0, 1), TypeError, r"third positional argument is Catalyst 20.12's scope"),
    (lambda: dl.Callback(20, scope=1), TypeError, r"scope must be CallbackScope.All, .Main or .Distributed"),
    (lambda: dl.Callback(20, node=2), ValueError, r"node=2: Catalyst 20.12's CallbackNode.worker"),
    (lambda: dl.Callback(20, node=0, scope=dl.CallbackScope.All), TypeError, r"not both"),
    (lambda: dl.Callback("20"), TypeError, r"order must be an int"),
    (lambda: dl.CallbackOrder.nothing, AttributeError, r"has no attribute 'nothing'; members: Internal"),
])
def test_catalyst_scope_meaning_is_refused_with_the_reason(make, error, message):
    with pytest.raises(error, match=message):
        make()
