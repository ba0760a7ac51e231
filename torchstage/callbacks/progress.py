"""A tqdm bar per loader on the main rank; the loss shown is read from the device at a bounded rate."""
import time

import torch

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope


class ProgressBar(Callback):
    """Shows batches done and the latest loss; reads the loss at most every ``refresh`` seconds."""

    order = CallbackOrder.Logging
    scope = CallbackScope.Main
    name = "progress"

    def __init__(self, metric_key: str = "loss", refresh: float = 0.5):
        self.metric_key, self.refresh = metric_key, refresh
        self.bar = None

    def on_loader_start(self, runner):
        from tqdm.auto import tqdm
        total = len(runner.loader) if hasattr(runner.loader, "__len__") else None
        self.bar = tqdm(total=total, leave=True, dynamic_ncols=True,
                        desc=f"{runner.epoch}/{runner.num_epochs} * {runner.loader_key}")
        self._next = time.monotonic() + self.refresh

    def on_batch_end(self, runner):
        self.bar.update(1)
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.refresh
            value = runner.batch_metrics.get(self.metric_key)
            if isinstance(value, torch.Tensor):
                self.bar.set_postfix({self.metric_key: f"{value.item():.4g}"}, refresh=False)

    def on_loader_end(self, runner):
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in runner.loader_metrics.items()}, refresh=False)
            self.bar.close()
            self.bar = None

    on_exception = on_loader_end
