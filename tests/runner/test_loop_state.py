"""LoopState: the loop's fields are runner attributes, and evaluate_loader swaps the state instead of copying it."""
import dataclasses

import torch

from tests.conftest import regression_loaders
from torchstage import SupervisedRunner
from torchstage.runner.loop_state import LOOP_FIELDS, LoopState


def test_every_loop_field_is_a_runner_attribute_backed_by_runner_loop():
    runner = SupervisedRunner()
    assert isinstance(runner.loop, LoopState)
    for name in LOOP_FIELDS:
        assert getattr(runner, name) == getattr(runner.loop, name)
    runner.epoch, runner.global_batch_step = 3, 17
    assert (runner.loop.epoch, runner.loop.global_batch_step) == (3, 17)
    assert "epoch" not in vars(runner)  # no stray instance attribute shadows the declared state


def test_evaluate_loader_leaves_the_trained_runners_loop_state_as_it_was():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                                      loaders=regression_loaders(), num_epochs=2)
    before, chain = dataclasses.replace(runner.loop), dict(runner.callbacks)
    metrics = runner.evaluate_loader(regression_loaders()["valid"])
    assert set(metrics) >= {"loss"}
    assert runner.loop.global_batch_step == before.global_batch_step and runner.loop.epoch == before.epoch
    assert runner.loop.epoch_metrics == before.epoch_metrics and runner.callbacks == chain
