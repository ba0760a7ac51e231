"""A callback names its own parameter; the default chain reports the same mistake under the train() name."""
import pytest
import torch

from tests.conftest import regression_loaders
from torchstage import (CheckpointCallback, Epoch, LimitBatchesCallback, SchedulerCallback, SupervisedRunner,
                        TensorBoardLogger, ValidEveryCallback)
from torchstage.arguments import ArgumentError, named_as


@pytest.mark.parametrize("build, own, train_kwargs, as_train", [
    (lambda: ValidEveryCallback(0), "every must be an integer >= 1, got 0",
     {"valid_every": 0}, "valid_every must be an integer >= 1, got 0"),
    (lambda: SchedulerCallback(mode="step"), "mode must be 'epoch' or 'batch', got 'step'",
     {"scheduler_step": "step"}, "scheduler_step must be 'epoch' or 'batch', got 'step'"),
    (lambda: CheckpointCallback(period="daily"), "period must be Batch(n), Epoch(n)",
     {"checkpoint_period": "daily"}, "checkpoint_period must be Batch(n), Epoch(n)"),
    (lambda: TensorBoardLogger(log_period=Epoch(1)), "log_period must be Batch(n)",
     {"log_period": Epoch(1)}, "log_period must be Batch(n)"),
    (lambda: LimitBatchesCallback(0), "num_batches must be an integer >= 1, got 0",
     {"overfit": 0}, "overfit must be True/False or the number of batches to repeat, >= 1, got 0"),
])
def test_one_check_two_names(tmp_path, build, own, train_kwargs, as_train):
    with pytest.raises(ArgumentError) as err:
        build()
    assert str(err.value).startswith(own)
    model = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError) as err:
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders=regression_loaders(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1), logdir=str(tmp_path),
                                 **train_kwargs)
    assert str(err.value).startswith(as_train)


def test_named_as_renames_only_the_parameters_it_is_told():
    with pytest.raises(ArgumentError, match="^valid_period must"):
        with named_as(period="valid_period"):
            raise ArgumentError("period", "must be Batch(n)")
    with pytest.raises(ArgumentError, match="^topk must"):
        with named_as(period="valid_period"):
            raise ArgumentError("topk", "must be an integer >= 0")
