"""The package root exports the Catalyst-capable classes under the public names; they stand for the core classes
(``isinstance`` both ways, enum members identical), so the core builds plain core objects and nothing changes."""
import logging

import pytest

import torchstage
from torchstage.callbacks import base
from torchstage.callbacks.training.optimizer import OptimizerCallback as CoreOptimizerCallback
from torchstage.runner.runner import Runner as CoreRunner
from torchstage.runner.supervised import SupervisedRunner as CoreSupervisedRunner


def test_catalysts_import_line_with_one_word_changed():
    from torchstage import dl, metrics, utils
    assert dl is torchstage and utils is torchstage
    assert dl.SupervisedRunner is torchstage.SupervisedRunner
    assert metrics.AdditiveMetric is metrics.AdditiveValueMetric


def test_compat_classes_stand_for_the_core_ones():
    assert isinstance(CoreOptimizerCallback(), torchstage.OptimizerCallback)
    assert isinstance(torchstage.OptimizerCallback(loss_key="l"), CoreOptimizerCallback)
    assert isinstance(CoreSupervisedRunner(), torchstage.Runner)
    assert isinstance(torchstage.SupervisedRunner(), CoreRunner)
    assert issubclass(torchstage.SupervisedRunner, torchstage.Runner)

    class Mine(torchstage.Callback):  # a user's subclass stands only for itself
        pass

    assert not isinstance(CoreOptimizerCallback(), Mine) and isinstance(Mine(), base.Callback)


def test_core_classes_take_no_catalyst_argument():
    with pytest.raises(TypeError):
        CoreOptimizerCallback(loss_key="loss")
    with pytest.raises(TypeError):
        base.Callback(base.CallbackOrder.Metric, None, "stage")
    assert not hasattr(CoreRunner, "loader_batch_step") and not hasattr(CoreRunner, "on_loader_end")


def test_enum_members_are_the_core_ones_and_catalyst_spellings_are_noted(caplog, monkeypatch):
    monkeypatch.setattr("torchstage.logging_setup._noted", set())
    assert torchstage.CallbackOrder.Metric is base.CallbackOrder.Metric
    assert torchstage.CallbackScope(1) is base.CallbackScope.Main
    assert isinstance(base.CallbackScope.All, torchstage.CallbackScope)
    assert list(torchstage.CallbackOrder) == list(base.CallbackOrder)
    with caplog.at_level(logging.INFO, logger="torchstage"):
        assert torchstage.CallbackOrder.external is base.CallbackOrder.External
        assert torchstage.CallbackNode.master is base.CallbackScope.Main
    assert "CallbackOrder.external is Catalyst 20.12's spelling" in caplog.text
    assert not hasattr(base.CallbackOrder, "external")
