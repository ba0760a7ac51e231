"""TensorBoard scalars through tensorboardX: ``logdir/tensorboard/<loader>/``, per epoch and per N batches."""
import os

import torch

from torchstage.arguments import ArgumentError
from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope
from torchstage.periods import Batch, as_periods, batch_due


def _batch_periods(period) -> tuple:
    """The periods of ``batch_period``: only ``Batch(n)`` (epoch values are always logged)."""
    periods = as_periods(period, "batch_period")
    if not periods or not all(isinstance(p, Batch) for p in periods):
        raise ArgumentError("batch_period", f"must be Batch(n) (train batch metrics every n batches), got {period!r}")
    return periods


class TensorBoardLogger(Callback):
    """Adds every loader metric as a scalar at the global epoch step (tensorboardX is imported lazily).

    With ``batch_period=Batch(n)`` the train batch metrics are also written every ``n`` train batches as
    ``batch/<metric>`` at the global batch step (one host read per period, never per batch), and
    mid-epoch validation results (``valid_period``) as ``periodic/<metric>``.
    """

    order = CallbackOrder.Logging
    scope = CallbackScope.Main
    name = "tensorboard"

    def __init__(self, logdir: str = None, batch_period=None, periodic_validation: bool = False):
        self.logdir, self.writers, self.periodic_validation = logdir, {}, periodic_validation
        self.periods = _batch_periods(batch_period) if batch_period is not None else ()

    def _writer(self, runner, loader: str):
        writer = self.writers.get(loader)
        if writer is None:
            from tensorboardX import SummaryWriter
            folder = os.path.join(self.logdir or runner.spec.logdir, "tensorboard", loader)
            writer = self.writers[loader] = SummaryWriter(folder)
        return writer

    def handles(self, event: str) -> bool:
        if event == "on_batch_end":
            return bool(self.periods) or self.periodic_validation
        return super().handles(event)

    def on_batch_end(self, runner):
        step = runner.global_batch_step
        if batch_due(self.periods, runner):
            values = {k: v for k, v in runner.batch_metrics.items() if isinstance(v, (torch.Tensor, float, int))}
            floats = torch.stack([torch.as_tensor(v).detach().reshape(()).double().cpu() for v in values.values()])
            writer = self._writer(runner, runner.loader_key)
            for key, value in zip(values, floats.tolist()):
                writer.add_scalar(f"batch/{key}", value, step)
        if runner.periodic_step == step and runner.is_train_loader:
            for loader, metrics in runner.periodic_metrics.items():
                for key, value in metrics.items():
                    self._writer(runner, loader).add_scalar(f"periodic/{key}", value, step)

    def on_loader_end(self, runner):
        writer = self._writer(runner, runner.loader_key)
        for key, value in runner.loader_metrics.items():
            writer.add_scalar(key, value, runner.global_epoch_step)
        writer.flush()

    def on_experiment_end(self, runner):
        self.close()

    def on_exception(self, runner):
        self.close()

    def close(self):
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
