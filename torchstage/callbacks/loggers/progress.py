"""Progress on the main rank: a tqdm bar per loader on a terminal, plain periodic lines elsewhere.

Under SLURM or CI stdout/stderr are files, where redrawn bars leave carriage-return fragments; there the
same progress is a log line every ``plain_period`` seconds and at each quarter of the loader. The loss
shown is read from the device at a bounded rate, never per batch.
"""
import logging
import sys
import time

import torch

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope

logger = logging.getLogger("torchstage")


class ProgressBar(Callback):
    """Shows batches done and the latest loss; reads the loss at most every ``refresh`` seconds.

    ``plain=None`` picks bars when stderr is a terminal and plain lines otherwise; while bars are shown,
    log records are written above them (never glued to a bar).
    """

    order = CallbackOrder.Logging
    scope = CallbackScope.Main
    name = "progress"

    def __init__(self, metric_key: str = "loss", refresh: float = 0.5, plain: bool = None,
                 plain_period: float = 30.0):
        self.metric_key, self.refresh = metric_key, refresh
        self.plain, self.plain_period = plain, plain_period
        self.bar = self._redirect = None

    def on_experiment_start(self, runner):
        if self.plain is None:
            self.plain = not _is_terminal(sys.stderr)
        if not self.plain:
            from tqdm.contrib.logging import logging_redirect_tqdm  # tqdm is imported only when bars are shown
            self._redirect = logging_redirect_tqdm([logging.getLogger(), logger])
            self._redirect.__enter__()

    def on_loader_start(self, runner):
        self.on_loader_end(runner)  # a rollback starts the loader again: its bar ends first
        self._total = len(runner.loop.loader) if hasattr(runner.loop.loader, "__len__") else None
        self._desc = f"{runner.loop.epoch}/{runner.loop.num_epochs} * {runner.loop.loader_key}"
        self._done, self._quarter, self._start = 0, 0, time.monotonic()
        self._next, self._next_line = self._start + self.refresh, self._start + self.plain_period
        if not self.plain:
            from tqdm.auto import tqdm  # tqdm is imported only when bars are shown
            self.bar = tqdm(total=self._total, leave=True, dynamic_ncols=True, desc=self._desc)

    def on_batch_end(self, runner):
        self._done += 1
        if self.bar is not None:
            self.bar.update(1)
            now = time.monotonic()
            if now >= self._next:
                self._next = now + self.refresh
                value = runner.loop.batch_metrics.get(self.metric_key)
                if isinstance(value, torch.Tensor):
                    self.bar.set_postfix({self.metric_key: f"{value.item():.4g}"}, refresh=False)
            return
        quarter = 4 * self._done // self._total if self._total else 0
        now = time.monotonic()
        if now >= self._next_line or (quarter > self._quarter and self._done < self._total):
            self._quarter, self._next_line = quarter, now + self.plain_period
            self._line(runner, now)

    def _line(self, runner, now):
        of = f"/{self._total} ({100 * self._done // self._total}%)" if self._total else ""
        value = runner.loop.batch_metrics.get(self.metric_key)
        loss = f", {self.metric_key}={value.item():.4g}" if isinstance(value, torch.Tensor) else ""
        rate = self._done / max(now - self._start, 1e-9)
        logger.info("[%s] %s: %d%s batches, %.3g batch/s%s", runner.loop.stage_key, self._desc, self._done, of, rate,
                    loss)

    def on_loader_end(self, runner):
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in runner.loop.loader_metrics.items()}, refresh=False)
            self.bar.close()
            self.bar = None

    def on_experiment_end(self, runner):
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None

    def on_exception(self, runner):
        self.on_loader_end(runner)
        self.on_experiment_end(runner)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
