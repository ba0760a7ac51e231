"""EarlyStoppingCallback: stops at the expected epoch, honours min_delta and direction, resumes its count."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, CallbackOrder, EarlyStoppingCallback, SupervisedRunner, load_checkpoint

from tests.resume_helpers import tiny_train_kwargs


class Scripted(Callback):
    """Writes ``score`` = values[epoch - 1] into the valid loader's metrics, before early stopping reads it."""

    order = CallbackOrder.MetricAggregation + 1
    produces = ("score",)

    def __init__(self, values):
        self.values = values

    def on_loader_end(self, runner):
        if runner.loader_key == "valid":
            runner.loader_metrics["score"] = self.values[runner.global_epoch_step - 1]


def run(values, stopper, num_epochs=20, **kwargs):
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    model = nn.Linear(3, 1)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=8),
               "valid": DataLoader(TensorDataset(x, y), batch_size=8)}
    return SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, num_epochs=num_epochs,
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                                    callbacks=[Scripted(values), stopper], **kwargs)


SCORES = [5.0, 4.0, 3.0, 3.5, 3.2, 3.1, 2.0, 1.0, 0.5, 0.4, 0.3, 0.2]


def test_stops_after_patience_checks_without_improvement():
    stopper = EarlyStoppingCallback(patience=3, metric_key="score", minimize=True)
    runner = run(SCORES, stopper)
    assert runner.epoch == 6  # best 3.0 at epoch 3; epochs 4, 5, 6 do not beat it
    assert (stopper.best, stopper.best_epoch, stopper.wait) == (3.0, 3, 3)


def test_min_delta_counts_small_gains_as_no_improvement():
    values = [3.0, 2.99, 2.98, 2.97, 1.0] + [0.5] * 10
    assert run(values, EarlyStoppingCallback(3, metric_key="score", minimize=True)).epoch == 9  # best 0.5 at 6
    assert run(values, EarlyStoppingCallback(3, metric_key="score", minimize=True, min_delta=0.1)).epoch == 4


def test_maximizing_metric():
    values = [0.1, 0.5, 0.6, 0.55, 0.58, 0.9, 0.2, 0.3, 0.4] + [0.1] * 10
    runner = run(values, EarlyStoppingCallback(patience=2, metric_key="score", minimize=False))
    assert runner.epoch == 5


def test_default_watches_the_valid_metric():
    stopper = EarlyStoppingCallback(patience=2)
    run(SCORES, stopper, num_epochs=5, valid_metric="score", minimize_valid_metric=False)
    assert stopper._metric == "score" and stopper._minimize is False


def test_another_metric_needs_a_direction():
    with pytest.raises(ValueError, match="metric_key='score'.* needs minimize=True or False"):
        run(SCORES, EarlyStoppingCallback(patience=2, metric_key="score"))


def test_missing_metric_names_what_was_produced():
    """Found before training (it was found after the first epoch): the chain's metrics are known up front."""
    with pytest.raises(ValueError, match=r"reads metric 'acc', which no callback produces; the chain produces "
                                         r"\['loss', 'lr', 'score'\]"):
        run(SCORES, EarlyStoppingCallback(patience=2, metric_key="acc", minimize=False))


def test_state_is_checkpointed_and_resumed(tmp_path):
    stopper = EarlyStoppingCallback(patience=3, metric_key="score", minimize=True)
    run(SCORES, stopper, num_epochs=5, logdir=str(tmp_path))
    saved = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)["callbacks"]["early_stopping"]
    assert saved == {"stage": "main", "best": 3.0, "best_epoch": 3, "wait": 2, "stopped": False}  # includes epoch 5
    resumed = EarlyStoppingCallback(patience=3, metric_key="score", minimize=True)
    runner = run(SCORES, resumed, num_epochs=20, logdir=str(tmp_path), resume="last")
    assert runner.epoch == 6 and resumed.wait == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"metric_key": "los", "minimize": True},
     r"callbacks\['early_stopping'\] \(EarlyStoppingCallback\) reads metric 'los', which no callback produces; the "
     r"chain produces \['loss', 'lr'\]; did you mean 'loss'\?"),
    ({"loader_key": "vaild"},
     r"callbacks\['early_stopping'\] \(EarlyStoppingCallback\) reads loader 'vaild', which this stage does not have"),
])
def test_a_metric_or_loader_typo_is_refused_before_training(kwargs, message):
    class Trained(Callback):
        batches = 0

        def on_batch_end(self, runner):
            Trained.batches += 1

    with pytest.raises(ValueError, match=message):
        SupervisedRunner().train(**tiny_train_kwargs(None, callbacks=[EarlyStoppingCallback(2, **kwargs), Trained()]))
    assert Trained.batches == 0


def test_resuming_an_early_stopped_run_trains_nothing_more(tmp_path, caplog):
    """An early stop is the run's end, as num_epochs is: the same command again, resume='last', trains no epoch."""
    stopper = lambda: EarlyStoppingCallback(patience=1, min_delta=100.0)  # noqa: E731  no check ever improves
    runner = SupervisedRunner().train(**tiny_train_kwargs(tmp_path, num_epochs=10, callbacks=[stopper()]))
    stopped_at = runner.global_epoch_step
    assert stopped_at == 2  # epoch 1 sets the best, epoch 2 does not improve on it by 100
    last = str(tmp_path / "checkpoints" / "last.pth")
    before = load_checkpoint(last)
    caplog.set_level("WARNING", logger="torchstage")
    for _ in range(2):
        runner = SupervisedRunner().train(**tiny_train_kwargs(tmp_path, num_epochs=10, callbacks=[stopper()],
                                                              resume="last"))
        assert runner.global_epoch_step == stopped_at
    assert load_checkpoint(last)["loop"] == before["loop"]
    assert "the run stopped early at epoch 2 of stage 'main'" in caplog.text and "nothing to train" in caplog.text
