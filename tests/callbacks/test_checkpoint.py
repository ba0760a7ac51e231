"""Checkpoints: last/best/metrics.json, loadable into a fresh model with weights_only, best by valid_metric."""
import json

import pytest
import torch

from tests.conftest import regression_loaders
from torchstage import CheckpointError, SupervisedRunner, load_checkpoint, load_model_weights
from torchstage.checkpoint import FORMAT, save_checkpoint


def make_net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def train(logdir, num_epochs=4, lr=0.05, **kwargs):
    torch.manual_seed(0)
    model = make_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
                                      scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 2),
                                      loaders=regression_loaders(), num_epochs=num_epochs, logdir=str(logdir), **kwargs)
    return runner, model


def test_last_and_best_load_into_fresh_model(tmp_path):
    runner, model = train(tmp_path)
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert last["format"] == FORMAT
    assert last["loop"]["epoch"] == 4 and last["loop"]["epoch_done"]
    assert set(last) >= {"models", "optimizers", "schedulers", "callbacks", "loop", "rng", "metrics", "meta"}
    fresh = make_net()
    load_model_weights(fresh, str(tmp_path / "checkpoints" / "last.pth"))
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    # the full state is plain data: weights_only loading of the raw file works
    raw = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)
    assert raw["schedulers"]["scheduler"]["last_epoch"] == 4
    assert raw["meta"]["hparams"]["num_epochs"] == 4


def test_best_follows_valid_metric_and_metrics_json(tmp_path):
    train(tmp_path, num_epochs=5, lr=0.05)
    summary = json.loads((tmp_path / "checkpoints" / "metrics.json").read_text())
    values = [entry["metrics"]["valid"]["loss"] for entry in summary["history"]]
    assert len(values) == 5
    best_epoch = min(range(5), key=values.__getitem__) + 1
    assert summary["best"]["epoch"] == best_epoch
    assert summary["best"]["value"] == pytest.approx(min(values))
    best = load_checkpoint(str(tmp_path / "checkpoints" / "best.pth"))
    assert best["loop"]["epoch"] == best_epoch
    assert best["metrics"]["valid"]["loss"] == pytest.approx(min(values))


def test_maximised_metric_picks_highest(tmp_path):
    train(tmp_path, num_epochs=3, valid_metric="loss", minimize_valid_metric=False)
    summary = json.loads((tmp_path / "checkpoints" / "metrics.json").read_text())
    values = [entry["metrics"]["valid"]["loss"] for entry in summary["history"]]
    assert summary["best"]["value"] == pytest.approx(max(values))


def test_ddp_and_compile_prefixes_are_stripped(tmp_path):
    model = make_net()
    prefixed = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    path = str(tmp_path / "wrapped.pth")
    save_checkpoint({"format": FORMAT, "models": {"model": prefixed}}, path)
    fresh = make_net()
    load_model_weights(fresh, path)
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


def test_foreign_files_are_refused_clearly(tmp_path):
    plain = tmp_path / "plain.pth"
    torch.save({"weights": torch.zeros(1)}, plain)
    with pytest.raises(CheckpointError, match=r"is not a torchstage checkpoint: format is None, expected 'torchstage/1'"):
        load_checkpoint(str(plain))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(str(tmp_path / "missing.pth"))


def test_resume_from_epoch_end_continues_to_same_weights(tmp_path):
    _, uninterrupted = train(tmp_path / "full", num_epochs=4)
    train(tmp_path / "part", num_epochs=2)
    runner, resumed = train(tmp_path / "part", num_epochs=4, resume="last")
    assert runner.global_epoch_step == 4
    for a, b in zip(resumed.state_dict().values(), uninterrupted.state_dict().values()):
        assert torch.equal(a, b)


def test_same_checkpoint_under_several_names_is_written_once(tmp_path):
    import os
    train(tmp_path, num_epochs=1)
    folder = tmp_path / "checkpoints"
    last, best, epoch = (os.stat(folder / name) for name in ("last.pth", "best.pth", "epoch-0001.pth"))
    assert last.st_ino == best.st_ino == epoch.st_ino  # hard links: one write, three names
    # a later atomic replace of one name leaves the others intact
    before = (folder / "best.pth").read_bytes()
    (folder / "last.pth").unlink()
    assert (folder / "best.pth").read_bytes() == before
