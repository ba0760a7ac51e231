"""Validation every N train batches, in the middle of an epoch (long epochs, Lightning's val_check_interval)."""
import copy
import logging

from torchstage.arguments import ArgumentError
from torchstage.callbacks.base import Callback
from torchstage.callbacks.loggers.console import format_metrics
from torchstage.callbacks.loggers.logger_base import PERIODIC, log_metrics
from torchstage.one_or_many import each
from torchstage.periods import Batch, as_periods, batch_due

logger = logging.getLogger("torchstage")


class PeriodicValidationCallback(Callback):
    """Every ``period`` (``Batch(n)``) train batches, one pass over each non-train loader, without training.

    The loss and copies of the run's metric callbacks (``runner.shared.metrics``) are computed through
    ``runner.evaluate_loader``;
    results go to ``runner.periodic_metrics[loader]``, the console, and every logger (scope PERIODIC, at the
    global batch step; TensorBoard's ``periodic/<metric>``). End-of-epoch validation is unchanged.
    """

    order = 90  # after the optimizer step and scheduler, before checkpoints and loggers
    name = "periodic_validation"

    def __init__(self, period):
        self.periods = as_periods(period, "period")
        if not self.periods or not all(isinstance(p, Batch) for p in self.periods):
            raise ArgumentError("period", f"must be Batch(n) (validation every n train batches), got {period!r}; "
                                          f"for every n epochs use valid_every=n")

    def on_stage_start(self, runner):
        runner.loop.periodic_metrics = {}

    def on_batch_end(self, runner):
        if not batch_due(self.periods, runner):
            return
        metrics = [copy.deepcopy(callback) for callback in runner.shared.metrics]
        results = {name: runner.evaluate_loader(loader, callbacks=copy.deepcopy(metrics))
                   for name, loader in runner.loop.loaders.items() if not name.startswith("train")}
        for model in each(runner.model):
            model.train(True)  # evaluation left it in eval mode; the train loader goes on
        runner.loop.periodic_metrics = results
        for loader, values in results.items():
            log_metrics(runner, values, runner.loop.global_batch_step, loader, PERIODIC)
        if runner.engine.is_main:
            parts = " | ".join(f"{name}: {format_metrics(values)}" for name, values in results.items())
            logger.info("[%s] epoch %d batch %d (global batch %d) | %s", runner.loop.stage_key, runner.loop.epoch,
                        runner.loop.batch_step, runner.loop.global_batch_step, parts)
