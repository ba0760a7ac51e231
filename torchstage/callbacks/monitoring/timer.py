"""``train(timeit=True)``: data-loading time versus compute time per batch, as loader metrics."""
import time

import torch

from torchstage.callbacks.base import Callback, CallbackOrder


class TimerCallback(Callback):
    """Adds ``time_data``, ``time_batch`` (seconds per batch) and ``samples_per_s`` to each loader's metrics.

    ``time_data`` runs from the end of one batch to the start of the next (loader and copy to the
    device); ``time_batch`` from batch start to the end of the optimizer step. Times are host
    ``perf_counter`` readings. On CUDA the device is synchronized at each batch start and end so that
    asynchronous kernels are counted where they run: a per-batch sync, hence a diagnostic, not a
    setting for production runs.
    """

    order = CallbackOrder.Scheduler + 10  # batch end after the optimizer and scheduler, loader end before loggers
    name = "timer"

    def on_loader_start(self, runner):
        self._cuda = runner.engine.device.type == "cuda"
        self._data = self._compute = 0.0
        self._batches = self._samples = 0
        self._sync()
        self._last = time.perf_counter()

    def on_batch_start(self, runner):
        self._sync()
        self._start = time.perf_counter()
        self._data += self._start - self._last

    def on_batch_end(self, runner):
        self._sync()
        self._last = time.perf_counter()
        self._compute += self._last - self._start
        self._batches += 1
        self._samples += runner.loop.batch_size

    def on_loader_end(self, runner):
        if not self._batches:
            return
        metrics = runner.loop.loader_metrics
        metrics["time_data"] = self._data / self._batches
        metrics["time_batch"] = self._compute / self._batches
        metrics["samples_per_s"] = self._samples / max(self._data + self._compute, 1e-12)

    def _sync(self):
        if self._cuda:
            torch.cuda.synchronize()
