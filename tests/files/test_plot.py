"""Training curves from CSV logs: a real PNG with every loader's lines, and clear errors."""
import sys

import numpy as np
import pytest
import torch

import torchstage
from torchstage.data.synthetic import synthetic_regression_splits
from torchstage.files.reports.plot import plot_logs, read_logs

matplotlib_image = pytest.importorskip("matplotlib.image")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A real two-stage run, so the logs are what CSVLogger writes."""
    logdir = tmp_path_factory.mktemp("run") / "logdir"
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = {"batch_size": 50, **synthetic_regression_splits(200, 100)}
    torchstage.SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
                                        datasets=data, logdir=str(logdir),
                                        stages={"one": {"num_epochs": 3}, "two": {"num_epochs": 2}})
    return logdir


def test_read_logs_per_loader(logdir):
    logs = read_logs(str(logdir))
    assert sorted(logs) == ["train", "valid"]
    assert [(r["stage"], r["epoch"], r["global_epoch"]) for r in logs["train"]] == [
        ("one", 1, 1), ("one", 2, 2), ("one", 3, 3), ("two", 1, 4), ("two", 2, 5)]
    assert set(logs["train"][0]) == {"stage", "epoch", "global_epoch", "loss", "lr"}
    assert isinstance(logs["valid"][0]["loss"], float)


def test_plot_writes_a_png_with_curves(logdir, tmp_path):
    path = plot_logs(str(logdir), str(tmp_path / "curves.png"))
    image = matplotlib_image.imread(path)
    assert path == str(tmp_path / "curves.png")
    assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 600  # two panels: loss, lr
    assert image[..., :3].std() > 0.05  # not blank
    rgb = (image[..., :3] * 255).round()
    blue, orange = np.array([31, 119, 180]), np.array([255, 127, 14])  # first two line colours: train, valid
    assert (np.abs(rgb - blue).sum(-1) < 30).sum() > 100
    assert (np.abs(rgb - orange).sum(-1) < 30).sum() > 100


def test_default_output_is_in_the_logdir(logdir):
    assert plot_logs(str(logdir)) == str(logdir / "curves.png")
    assert (logdir / "curves.png").stat().st_size > 1000


def test_no_logs_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no CSV logs in .*logs.*<loader>\.csv"):
        plot_logs(str(tmp_path))


def test_missing_matplotlib_says_how_to_install(logdir, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'torchstage\[plot\]'"):
        plot_logs(str(logdir))
