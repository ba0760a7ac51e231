"""``train(monitor=True)``: throughput, data-loader wait, peak memory and MFU per loader, to every logger."""
import resource
import sys
import time

import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.callbacks.monitoring.flops import StepFlops, device_peak_flops


class ThroughputMonitor(Callback):
    """Adds to each loader's metrics (so CSV, TensorBoard, MLflow and the console get them):

    ``samples_per_s`` (all ranks together) and ``batches_per_s`` (per rank) over the loader's wall time
    ``time_s``; ``data_wait``, the share of that time spent between batches (waiting for the data loader
    and the copy to the device); ``peak_memory_mb``, the largest peak over ranks (the CUDA allocator's
    peak during the loader on GPU, the process's peak RSS on CPU); and when the FLOPs of a step can be
    counted (``torch.utils.flop_counter``, on the first batch of each loader) ``tflops_per_s``, and ``mfu``
    (model FLOPs utilization) when the device's dense peak is known or given as ``peak_flops`` (FLOP/s
    per device). Times are host clocks read without device syncs, so nothing waits per step; on a GPU
    the host may run ahead of the device, which evens out over a loader.
    """

    order = CallbackOrder.Logging - 1  # batch start after the loop's, batch end after the optimizer step
    name = "monitor"

    def __init__(self, peak_flops: float = None, count_flops: bool = True):
        if peak_flops is not None and (isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float))
                                       or peak_flops <= 0):
            raise ValueError(f"peak_flops must be the device's peak FLOP/s (a number > 0) or None, got {peak_flops!r}")
        self.peak_flops, self.count_flops = peak_flops, count_flops
        self.flops_per_sample = {}  # loader -> FLOPs of one sample's step, counted once
        self._flops = StepFlops()

    def on_loader_start(self, runner):
        self._cuda = runner.engine.device.type == "cuda"
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(runner.engine.device)
        self._counting = False
        self._wait, self._batches, self._samples = 0.0, 0, 0
        runner.engine.barrier()  # one per loader: clocks start together, not while a rank is still setting up
        self._start = self._last = time.perf_counter()

    def on_batch_start(self, runner):
        now = time.perf_counter()
        self._wait += now - self._last
        if self.count_flops and self._batches == 0 and runner.loop.loader_key not in self.flops_per_sample:
            self._counting = True
            self._flops.start()

    def on_batch_end(self, runner):
        if self._counting:
            self._counting = False
            flops = self._flops.stop()
            self.flops_per_sample[runner.loop.loader_key] = flops / runner.loop.batch_size if flops else None
        self._batches += 1
        self._samples += runner.loop.batch_size
        self._last = time.perf_counter()

    def on_exception(self, runner):
        self._flops.abort()

    def on_loader_end(self, runner):
        elapsed = time.perf_counter() - self._start
        engine = runner.engine
        mine = float(self._samples) if engine.counts_samples else 0.0  # a model-parallel group's samples once
        summed = engine.all_reduce_(torch.tensor([mine, self._wait / max(elapsed, 1e-12)], dtype=torch.float64,
                                                 device=engine.device), "sum")
        peaks = engine.all_reduce_(torch.tensor([elapsed, self._peak_memory_mb(engine.device)], dtype=torch.float64,
                                                device=engine.device), "max")
        (samples, wait_sum), (elapsed, memory) = summed.tolist(), peaks.tolist()
        metrics = runner.loop.loader_metrics
        metrics["time_s"] = elapsed
        metrics["samples_per_s"] = samples / max(elapsed, 1e-12)
        metrics["batches_per_s"] = self._batches / max(elapsed, 1e-12)
        metrics["data_wait"] = wait_sum / engine.world_size
        metrics["peak_memory_mb"] = memory
        flops = self.flops_per_sample.get(runner.loop.loader_key)
        if flops:
            flops *= engine.model_parallel_size  # each rank of a model-parallel group computes its part of a sample
            metrics["tflops_per_s"] = flops * metrics["samples_per_s"] / 1e12
            peak = self.peak_flops or device_peak_flops(engine.device, runner.amp_dtype)
            if peak:
                metrics["mfu"] = flops * metrics["samples_per_s"] / (peak * engine.world_size)

    def _peak_memory_mb(self, device) -> float:
        if self._cuda:
            return torch.cuda.max_memory_allocated(device) / 2**20
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return rss / (2**20 if sys.platform == "darwin" else 2**10)

    def state_dict(self):
        return {"flops_per_sample": dict(self.flops_per_sample)}

    def load_state_dict(self, state):
        self.flops_per_sample = dict(state.get("flops_per_sample", {}))
