"""check=True smoke runs and overfit=True: how many batches run, the checkpoint round trip, the loss."""
import logging
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, CallbackOrder, CheckpointError, SupervisedRunner, load_checkpoint


class Batches(Callback):
    """Counts batches per (stage, epoch, loader) and keeps the first input row of each train batch."""

    order = CallbackOrder.Metric

    def __init__(self):
        self.counts, self.first_rows = {}, []

    def on_batch_end(self, runner):
        key = (runner.stage_key, runner.epoch, runner.loader_key)
        self.counts[key] = self.counts.get(key, 0) + 1
        if runner.is_train_loader:
            self.first_rows.append(runner.batch["features"][0].clone())


@pytest.mark.alone  # times the check run
def test_check_on_a_million_rows_runs_two_batches_for_two_epochs_per_stage(tmp_path):
    x = torch.randn(1_000_000, 10)
    y = torch.randn(1_000_000, 1)
    model, seen = nn.Linear(10, 1), Batches()
    stage = {"num_epochs": 10, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01)}
    start = time.perf_counter()
    runner = SupervisedRunner().train(
        model=model, criterion=nn.MSELoss(), check=True, logdir=str(tmp_path), callbacks=[seen],
        datasets={"batch_size": 64, "train": TensorDataset(x, y), "valid": TensorDataset(x, y)},
        stages={"warmup": stage, "main": stage})
    elapsed = time.perf_counter() - start
    assert seen.counts == {(s, e, loader): 2 for s in ("warmup", "main") for e in (1, 2) for loader in ("train", "valid")}
    assert runner.global_batch_step == 8
    assert elapsed < 10, f"check run took {elapsed:.1f}s"  # a full epoch would be 15625 batches
    checkpoint = load_checkpoint(str(tmp_path / "check" / "checkpoints" / "last.pth"))  # a scratch folder
    assert checkpoint["loop"]["stage"] == "main" and checkpoint["loop"]["epoch"] == 2
    torch.testing.assert_close(checkpoint["models"]["model"]["weight"], model.weight.detach())


class Corrupt(Callback):
    """Changes the weights after the checkpoint is written, so the reloaded checkpoint cannot match."""

    order = CallbackOrder.External + 10

    def on_epoch_end(self, runner):
        with torch.no_grad():
            runner.model.weight.add_(1.0)


def test_check_fails_when_the_written_checkpoint_does_not_hold_the_model(tmp_path):
    x, y = torch.randn(64, 10), torch.randn(64, 1)
    model = nn.Linear(10, 1)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=8),
               "valid": DataLoader(TensorDataset(x, y), batch_size=8)}
    with pytest.raises(CheckpointError, match="last.pth did not restore model 'model'"):
        SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, check=True,
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                                 logdir=str(tmp_path), callbacks=[Corrupt()])


def test_overfit_repeats_the_first_batch_and_drives_its_loss_down():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, 10, generator=g), torch.randn(512, 1, generator=g)
    torch.manual_seed(0)
    model, seen = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1)), Batches()
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
               "valid": DataLoader(TensorDataset(x, y), batch_size=16)}
    runner = SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, overfit=True,
                                      optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                                      num_epochs=60, callbacks=[seen])
    assert set(seen.counts.values()) == {1} and len(seen.counts) == 120  # one batch per loader per epoch
    assert all(torch.equal(row, seen.first_rows[0]) for row in seen.first_rows)  # the same batch every time
    assert runner.epoch_metrics["train"]["loss"] < 0.05  # random targets: only memorising gets there


def test_overfit_with_a_number_repeats_that_many_batches():
    x, y = torch.randn(64, 10), torch.randn(64, 1)
    model, seen = nn.Linear(10, 1), Batches()
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
               "valid": DataLoader(TensorDataset(x, y), batch_size=8)}
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, overfit=3, num_epochs=2,
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.01), callbacks=[seen])
    assert set(seen.counts.values()) == {3}
    assert all(torch.equal(a, b) for a, b in zip(seen.first_rows[:3], seen.first_rows[3:]))


@pytest.mark.parametrize("name, value, message", [
    ("overfit", 0, "overfit must be True/False or the number of batches to repeat, >= 1, got 0"),
    ("check", 1, "check must be True or False, got 1"),
])
def test_bad_debug_arguments(name, value, message):
    model = nn.Linear(10, 1)
    loaders = {"train": [(torch.randn(2, 10), torch.randn(2, 1))], "valid": [(torch.randn(2, 10), torch.randn(2, 1))]}
    with pytest.raises((ValueError, TypeError), match=message):
        SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders,
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.01), **{name: value})


def test_check_then_the_real_run_on_the_same_logdir(tmp_path, caplog):
    """docs/local-to-cluster.md steps 1 and 2: the check run never blocks the real one, and says where it wrote."""
    x, y = torch.randn(64, 10), torch.randn(64, 1)

    def run(**kwargs):
        model = nn.Linear(10, 1)
        loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=8),
                   "valid": DataLoader(TensorDataset(x, y), batch_size=8)}
        return SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, num_epochs=3,
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                                        logdir=str(tmp_path), **kwargs)

    with caplog.at_level(logging.INFO, logger="torchstage"):
        run(check=True)
        run(check=True)  # a second check replaces the first one's scratch files
    messages = [r.getMessage() for r in caplog.records]
    assert (f"check run: at most 2 epoch(s) per stage, a few batches per loader; checkpoints and logs go to "
            f"{tmp_path / 'check'} (a scratch folder: the real run's logdir stays untouched)") in messages
    assert any(m.startswith("[main] epoch 2/2 |") for m in messages)  # the real epoch count, not 2/3
    assert not (tmp_path / "checkpoints").exists()
    runner = run()
    assert runner.epoch == 3
    assert load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["loop"]["epoch"] == 3
