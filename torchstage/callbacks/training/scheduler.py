"""Learning-rate schedulers stepped per epoch (default) or per train batch; plateau ones get the valid metric."""
from torch.optim.lr_scheduler import ReduceLROnPlateau

from torchstage.arguments import ArgumentError
from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.one_or_many import each


class SchedulerCallback(Callback):
    """Steps ``runner.scheduler`` (or one of a dict, by ``scheduler_key``) at epoch end or after each train batch."""

    order = CallbackOrder.Scheduler
    name = "scheduler"

    def __init__(self, mode: str = "epoch", scheduler_key: str = None):
        if mode not in ("epoch", "batch"):
            raise ArgumentError("mode", f"must be 'epoch' or 'batch', got {mode!r}")
        self.mode, self.scheduler_key = mode, scheduler_key

    def _schedulers(self, runner):
        if self.scheduler_key is not None and isinstance(runner.scheduler, dict):
            return [runner.scheduler[self.scheduler_key]]
        return each(runner.scheduler)

    def handles(self, event: str) -> bool:
        if event == "on_batch_end":  # no per-batch call for a per-epoch schedule
            return self.mode == "batch"
        return super().handles(event)

    def on_batch_end(self, runner):
        if self.mode == "batch" and runner.loop.is_train_loader:
            for scheduler in self._schedulers(runner):
                scheduler.step()

    def on_epoch_end(self, runner):
        if self.mode != "epoch":
            return
        for scheduler in self._schedulers(runner):
            if isinstance(scheduler, ReduceLROnPlateau):
                value = runner.loop.epoch_metrics.get(runner.valid_loader, {}).get(runner.valid_metric)
                if value is not None:
                    scheduler.step(value)
            else:
                scheduler.step()
