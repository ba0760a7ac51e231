"""Catalyst 22's ``metrics.AdditiveMetric``: a running mean and standard deviation of host numbers, each weighted by
its sample count, as Catalyst 22 runners kept one per metric in ``self.meters``.

torchstage's spelling is :class:`torchstage.metrics.AverageMetric` (``update(value, count)`` on the device, exact
across ranks) or a value in ``runner.batch_metrics``, which the loop averages per loader by batch size.
"""
import math

import numpy as np

from torchstage.logging_setup import note_alias

_MODES = ("numpy", "torch")


class AdditiveMetric:
    """``update(value, num_samples)`` per batch, ``compute()`` -> ``(mean, std)``, ``reset()``; Catalyst 22.04's
    numbers: the mean weighted by ``num_samples``, the std from its weighted running sum of squares (NaN before
    the first update, 0.0 after one). ``mode="torch"`` takes tensors (copied to the host at each update)."""

    def __init__(self, compute_on_call: bool = True, mode: str = "numpy"):
        if mode not in _MODES:
            raise ValueError(f"AdditiveMetric(mode={mode!r}): expected one of {_MODES}")
        note_alias("metrics.AdditiveMetric(compute_on_call=...) (a host-side mean/std meter)",
                   "metrics.AverageMetric(name) with update(value, count) on the device, or a value in "
                   "runner.batch_metrics (averaged per loader by batch size)", version="22")
        self.compute_on_call, self.mode = compute_on_call, mode
        self.reset()

    def reset(self) -> None:
        """Forget every value: mean and std are NaN again."""
        self.n, self.num_samples, self.value = 0, 0, 0.0
        self.mean, self.std = math.nan, math.nan
        self._previous_mean, self._squares = 0.0, 0.0

    def update(self, value, num_samples: int):
        """Add ``value`` (the mean of ``num_samples`` samples); returns ``value``."""
        if self.mode == "torch":
            value = value.detach().cpu().numpy()
        self.value, self.n = value, self.n + 1
        self.num_samples += num_samples
        if self.n == 1:
            self.mean, self.std, self._squares = 0.0 + value, 0.0, 0.0  # 0.0 + value: a copy, not the caller's
        else:
            delta = value - self._previous_mean
            self.mean = self._previous_mean + delta * num_samples / float(self.num_samples)
            self._squares += delta * (value - self.mean) * num_samples
            self.std = np.sqrt(self._squares / (self.num_samples - 1.0))
        self._previous_mean = self.mean
        return value

    def compute(self) -> tuple:
        """``(mean, std)`` of everything added since the last ``reset``."""
        return self.mean, self.std

    def __call__(self, *args, **kwargs):
        """``update(...)``, then ``compute()`` if ``compute_on_call`` else the value added."""
        value = self.update(*args, **kwargs)
        return self.compute() if self.compute_on_call else value
