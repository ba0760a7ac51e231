"""Weighted means: the loss per sample (``AverageMetric``) and any per-batch function (``FunctionalMetric``)."""
from numbers import Real
from typing import Callable, Optional, Union

import torch

from torchstage.metrics.base import AdditiveStateMetric, Values

Number = Union[int, float]


class _WeightedMean(AdditiveStateMetric):
    """State ``[sum(value * count), sum(count)]``; compute gives ``{name: sum / count}``."""

    _state_size = 2

    def __init__(self, name: str, prefix: str = ""):
        if not isinstance(name, str) or not name:
            raise ValueError(f"{type(self).__name__}: name must be a non-empty str, got {name!r}")
        self.name = name
        super().__init__(prefix)

    def _accumulate(self, value, count) -> None:
        owner = type(self).__name__
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"{owner} '{self.name}': value must hold one number (a batch mean), "
                                 f"got shape {tuple(value.shape)}")
            value = value.detach().reshape(()).to(torch.float64)
            state = self._state_like(value)
        elif isinstance(value, Real) and not isinstance(value, bool):
            state = self._state_like(count if isinstance(count, torch.Tensor) else torch.empty(0))
        else:
            raise TypeError(f"{owner} '{self.name}': value must be a tensor or a number, got {type(value).__name__}")
        if isinstance(count, torch.Tensor):
            if count.numel() != 1:
                raise ValueError(f"{owner} '{self.name}': count must hold one number, got shape {tuple(count.shape)}")
            count = count.detach().reshape(()).to(device=state.device, dtype=torch.float64)
        elif isinstance(count, bool) or not isinstance(count, Real) or count < 0:
            raise ValueError(f"{owner} '{self.name}': count must be a number >= 0 or a tensor, got {count!r}")
        state[0] += value * count
        state[1] += count

    def _names(self) -> tuple:
        return (self.name,)

    def _compute(self) -> Values:
        state = self._checked_state()
        if float(state[1]) == 0.0:  # one host read, at compute time only
            raise self._empty_error()
        return {self.name: state[0] / state[1]}


class AverageMetric(_WeightedMean):
    """Mean of per-batch values weighted by a count: ``sum(value_i * count_i) / sum(count_i)``.

    Typical use: ``update(loss, batch_size)`` with the batch-mean loss gives the exact per-sample loss
    of the loader, also with uneven batches and across ranks. Result key: ``prefix + name``.
    """

    def __init__(self, name: str = "loss", prefix: str = ""):
        super().__init__(name, prefix)

    def update(self, value: Union[torch.Tensor, Number], count: Union[torch.Tensor, Number] = 1) -> None:
        """Add ``value`` (a one-element tensor or a number) with weight ``count`` (>= 0)."""
        super().update(value, count)

    def _update(self, value, count) -> None:
        self._accumulate(value, count)


class FunctionalMetric(_WeightedMean):
    """Any ``fn(outputs, targets) -> one-element tensor`` (a batch mean), averaged weighted by batch size.

    The result is ``sum(fn(batch_i) * n_i) / sum(n_i)``: the per-sample mean when ``fn`` returns a
    per-sample mean, otherwise a mean of batch values weighted by batch size. ``n_i`` is
    ``batch_size`` if given, else ``targets.shape[0]``, else ``outputs.shape[0]``. Key: ``prefix + name``.
    """

    def __init__(self, fn: Callable, name: str, prefix: str = ""):
        if not callable(fn):
            raise TypeError(f"FunctionalMetric: fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        super().__init__(name, prefix)

    def update(self, outputs, targets, batch_size: Optional[int] = None) -> None:
        """Evaluate ``fn`` on the batch and add it with weight ``batch_size``."""
        super().update(outputs, (targets, batch_size))

    def _update(self, outputs, targets_and_size) -> None:
        targets, batch_size = targets_and_size
        if batch_size is None:
            sized = next((x for x in (targets, outputs) if isinstance(x, torch.Tensor) and x.ndim > 0), None)
            if sized is None:
                raise ValueError(f"FunctionalMetric '{self.name}': cannot tell the batch size from outputs "
                                 f"({type(outputs).__name__}) and targets ({type(targets).__name__}); "
                                 "pass update(..., batch_size=n)")
            batch_size = sized.shape[0]
        with torch.no_grad():
            value = self.fn(outputs, targets)
        self._accumulate(value, batch_size)
