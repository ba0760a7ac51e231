"""Loader averages are the batch-size-weighted means, across fold boundaries and a resume in the middle."""
import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, Runner
from torchstage.callbacks.metrics.averaging import FOLD


class ValueRunner(Runner):
    """Writes each batch's first feature mean and a Python float as metrics."""

    produces = ("value", "count")

    def handle_batch(self, batch):
        (x,) = batch
        self.batch_metrics["value"] = x[:, 0].mean()
        self.batch_metrics["count"] = float(len(x))


def _loader(n=3 * FOLD * 2 + 5, batch_size=3):  # more than two folds and a last batch of 2
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    return DataLoader(TensorDataset(x), batch_size=batch_size), x


def test_average_is_the_weighted_mean_over_several_folds_and_an_uneven_last_batch():
    loader, x = _loader()
    runner = ValueRunner().train(model=torch.nn.Linear(1, 1), loaders={"valid": loader}, valid_loader="valid",
                                 valid_metric="value", num_epochs=1)
    batches = [x[i:i + 3, 0] for i in range(0, len(x), 3)]
    assert len(batches) > 2 * FOLD and len(batches[-1]) == 2
    expected = math.fsum(float(b.mean()) * len(b) for b in batches) / len(x)
    assert runner.epoch_metrics["valid"]["value"] == pytest.approx(expected, rel=1e-12)
    expected_count = math.fsum(len(b) ** 2 for b in batches) / len(x)
    assert runner.epoch_metrics["valid"]["count"] == pytest.approx(expected_count, rel=1e-15)


def test_state_mid_loader_holds_the_kept_values_so_a_resumed_loader_sums_alike():
    from torchstage.callbacks.metrics.averaging import MetricsAveragingCallback
    loader, _ = _loader()
    states = {}

    class Snapshot(Callback):
        def on_batch_end(self, runner):
            if runner.batch_step == FOLD + 5:
                states["mid"] = runner.callbacks["averaging"].state_dict()

    runner = ValueRunner().train(model=torch.nn.Linear(1, 1), loaders={"valid": loader}, valid_loader="valid",
                                 valid_metric="value", num_epochs=1, callbacks=[Snapshot()])
    mid = states["mid"]
    assert mid["counts"]["value"] == 3 * FOLD and len(mid["kept"]["value"][0]) == 5
    resumed = MetricsAveragingCallback()
    resumed.load_state_dict(mid)
    resumed.on_loader_start(runner)
    assert set(resumed._kept) == {"value", "count"} and resumed._counts == mid["counts"]
