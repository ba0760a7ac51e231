"""train(monitor=True): throughput, data wait, memory and MFU in every log, without per-batch host syncs."""
import csv
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tests.callbacks.loggers.test_loggers import read_tensorboard_scalars
from tests.callbacks.loggers.test_mlflow_logger import client_for, history, only_run
from tests.helpers import tiny_run
from tests.runner.test_host_syncs import count_syncs  # noqa: F401  (a fixture)
from torchstage import MLflowLogger, SupervisedRunner
from torchstage.callbacks.monitoring.monitor import ThroughputMonitor

FIGURES = ("time_s", "samples_per_s", "batches_per_s", "data_wait", "peak_memory_mb", "tflops_per_s")


class SlowData(Dataset):
    """Features and targets; each read sleeps ``delay`` seconds (a slow disk or decoder)."""

    def __init__(self, n, delay):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.delay = torch.randn(n, 64, generator=g), torch.randn(n, 32, generator=g), delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay:  # sleep(0) would still yield the CPU to the machine's other load
            time.sleep(self.delay)
        return self.x[i], self.y[i]


def train(tmp_path, delay=0.0, callbacks=None, model=None, **kwargs):
    torch.manual_seed(0)
    model = model or torch.nn.Linear(64, 32)
    loaders = {"train": DataLoader(SlowData(64, delay), batch_size=8),
               "valid": DataLoader(SlowData(32, delay), batch_size=8)}
    return tiny_run(model, loaders=loaders, num_epochs=2, sgd_lr=0.01, logdir=str(tmp_path), callbacks=callbacks,
                    overwrite=True, **kwargs)


def test_figures_reach_csv_tensorboard_and_mlflow(tmp_path):
    runner = train(tmp_path, monitor=True, callbacks={"mlflow": MLflowLogger()})
    rows = list(csv.DictReader(open(tmp_path / "logs" / "train.csv")))
    assert len(rows) == 2 and all(name in rows[0] for name in FIGURES)
    for row in rows:
        assert float(row["samples_per_s"]) == pytest.approx(64 / float(row["time_s"]), rel=1e-9)
        assert float(row["batches_per_s"]) == pytest.approx(8 / float(row["time_s"]), rel=1e-9)
        assert 0 < float(row["data_wait"]) < 1 and float(row["peak_memory_mb"]) > 10
    scalars = read_tensorboard_scalars(tmp_path / "tensorboard" / "train")
    client = client_for(tmp_path)
    run_id = only_run(client, "torchstage").info.run_id
    for name in FIGURES:
        logged = [float(row[name]) for row in rows]
        assert [v for _, v in scalars[name]] == pytest.approx(logged, rel=1e-6)
        assert [v for _, v in history(client, run_id, f"train/{name}")] == pytest.approx(logged, rel=1e-12)
    # Linear(64, 32) trained on inputs without grad: forward 2*64*32 and weight-grad 2*64*32 FLOPs per sample
    assert runner.callbacks["monitor"].flops_per_sample == {"train": 4 * 64 * 32, "valid": 2 * 64 * 32}
    assert "mfu" not in rows[0]  # a CPU has no known peak


def test_mfu_from_a_given_peak(tmp_path):
    runner = train(tmp_path, callbacks={"monitor": ThroughputMonitor(peak_flops=1e9)})
    train_metrics = runner.epoch_metrics["train"]
    assert train_metrics["mfu"] == pytest.approx(4 * 64 * 32 * train_metrics["samples_per_s"] / 1e9, rel=1e-9)
    assert train_metrics["tflops_per_s"] == pytest.approx(train_metrics["mfu"] * 1e9 / 1e12, rel=1e-9)


def test_data_wait_rises_when_the_loader_is_slow(tmp_path):
    def mlp():  # a few ms of compute per batch
        return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                   torch.nn.ReLU(), torch.nn.Linear(1024, 32))
    fast = train(tmp_path / "fast", model=mlp(), monitor=True).epoch_metrics["train"]["data_wait"]
    slow = train(tmp_path / "slow", model=mlp(), delay=0.02, monitor=True).epoch_metrics["train"]["data_wait"]
    assert slow > 0.6 and slow > fast + 0.3, (fast, slow)  # loose: the machine may be loaded


def test_monitor_argument_is_checked():
    with pytest.raises(TypeError, match="monitor must be True or False, got 'yes'"):
        train(None, monitor="yes")
    with pytest.raises(ValueError, match=r"peak_flops must be the device's peak FLOP/s .* got -1"):
        ThroughputMonitor(peak_flops=-1)


def test_no_host_sync_per_batch(tmp_path, count_syncs):  # noqa: F811
    counts = []
    for n in (5, 20):
        x, y = torch.randn(n * 8, 6), torch.randn(n * 8, 1)
        model = torch.nn.Linear(6, 1)
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), monitor=True, num_epochs=2,
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1), logdir=str(tmp_path / str(n)),
                                 loaders={"train": DataLoader(TensorDataset(x, y), batch_size=8),
                                          "valid": DataLoader(TensorDataset(x, y), batch_size=8)})
        counts.append(sum(count_syncs.values()))
        count_syncs.clear()
    assert 0 < counts[1] <= counts[0], counts
