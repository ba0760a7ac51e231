"""Validation every N train batches (mid-epoch) and TensorBoard batch scalars every N batches."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.callbacks.loggers.test_loggers import read_tensorboard_scalars
from torchstage import AccuracyCallback, Batch, Epoch, SupervisedRunner


def classification_run(tmp_path, **kwargs):
    torch.manual_seed(0)
    X, y = torch.randn(96, 4), torch.randint(0, 2, (96,))
    train = DataLoader(TensorDataset(X, y), batch_size=8)  # 12 train batches per epoch
    valid = DataLoader(TensorDataset(X[:40], y[:40]), batch_size=16)
    model = torch.nn.Linear(4, 2)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                      loaders={"train": train, "valid": valid}, num_epochs=2, logdir=str(tmp_path),
                                      callbacks=[AccuracyCallback()], **kwargs)
    return runner


def test_valid_period_evaluates_mid_epoch_and_logs_to_tensorboard(tmp_path, caplog):
    import logging
    caplog.set_level(logging.INFO, logger="torchstage")
    runner = classification_run(tmp_path, valid_period=Batch(5))
    lines = [r.getMessage() for r in caplog.records if "(global batch" in r.getMessage()]
    # global train batches 5, 10 (epoch 1) and 15, 20 (epoch 2)
    assert [line.split("(global batch ")[1].split(")")[0] for line in lines] == ["5", "10", "15", "20"]
    assert all("| valid: " in line and " loss=" in line and "accuracy=" in line for line in lines)
    scalars = read_tensorboard_scalars(tmp_path / "tensorboard" / "valid")
    assert [step for step, _ in scalars["periodic/loss"]] == [5, 10, 15, 20]
    assert [step for step, _ in scalars["periodic/accuracy"]] == [5, 10, 15, 20]
    # the end-of-epoch validation is unchanged, and training accuracy was not disturbed
    assert [step for step, _ in scalars["loss"]] == [1, 2]
    assert 0.0 <= runner.epoch_metrics["train"]["accuracy"] <= 1.0


def test_periodic_validation_values_equal_a_direct_evaluation(tmp_path):
    captured = {}

    class Capture(AccuracyCallback):
        order = 95  # right after periodic validation

        def on_batch_end(self, runner):
            super().on_batch_end(runner)
            if runner.is_train_loader and runner.global_batch_step == 5:
                with torch.no_grad():
                    logits = torch.cat([runner.model(x) for x, _ in runner.loaders["valid"]])
                    targets = torch.cat([t for _, t in runner.loaders["valid"]])
                captured["direct"] = torch.nn.functional.cross_entropy(logits, targets).item()
                captured["periodic"] = runner.periodic_metrics["valid"]["loss"]
                captured["training_mode"] = runner.model.training

    torch.manual_seed(0)
    X, y = torch.randn(96, 4), torch.randint(0, 2, (96,))
    loaders = {"train": DataLoader(TensorDataset(X, y), batch_size=8),
               "valid": DataLoader(TensorDataset(X[:40], y[:40]), batch_size=16)}
    model = torch.nn.Linear(4, 2)
    SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.5), loaders=loaders, num_epochs=1,
                             callbacks={"capture": Capture()}, valid_period=Batch(5))
    assert captured["periodic"] == pytest.approx(captured["direct"], rel=1e-6)
    assert captured["training_mode"] is True


def test_log_period_writes_batch_scalars_every_n_train_batches(tmp_path):
    classification_run(tmp_path, log_period=Batch(4))
    scalars = read_tensorboard_scalars(tmp_path / "tensorboard" / "train")
    assert [step for step, _ in scalars["batch/loss"]] == [4, 8, 12, 16, 20, 24]
    assert "batch/loss" not in read_tensorboard_scalars(tmp_path / "tensorboard" / "valid")


@pytest.mark.parametrize("kwargs, message", [
    ({"valid_period": Epoch(2)}, r"valid_period must be Batch\(n\) .* for every n epochs use valid_every=n"),
    ({"log_period": 3}, r"log_period must be Batch\(n\)"),
    ({"log_period": Batch(2), "logdir": None}, r"log_period=Batch\(2\) writes TensorBoard scalars and needs a logdir"),
])
def test_period_arguments_are_checked_before_training(tmp_path, kwargs, message):
    model = torch.nn.Linear(4, 1)
    args = dict(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                loaders={"train": [(torch.zeros(2, 4), torch.zeros(2, 1))], "valid": [(torch.zeros(2, 4), torch.zeros(2, 1))]},
                logdir=str(tmp_path))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        SupervisedRunner().train(**args)
