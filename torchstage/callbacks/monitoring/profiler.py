"""``ProfilerCallback``: torch.profiler around a window of train batches, one trace per rank, a top-ops table."""
import logging
import os
import socket

import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.callbacks.loggers.logger_base import log_artifact

logger = logging.getLogger("torchstage")


class ProfilerCallback(Callback):
    """Profiles train batches ``begin_on_batch`` to ``end_after_batch - 1`` (0-based, counted over the run).

    CPU activity, and CUDA where the run's device is a GPU. Each profiled rank writes its trace to
    ``logdir/profiler/rank-N/`` as ``*.pt.trace.json`` (TensorBoard's profiler plugin:
    ``tensorboard --logdir logdir/profiler``; or chrome://tracing, Perfetto), with spans
    ``ProfilerStep#i`` for global batch ``i``, and ``top_ops.txt``; the main rank logs its table and sends
    trace and table to the loggers. ``sync_timings`` synchronizes the GPU at each profiled batch end so
    step times are exact. ``ranks``: the ranks to profile (None: all). Outside the window it costs an
    integer comparison per batch; other keyword arguments go to ``torch.profiler.profile``
    (``record_shapes``, ``profile_memory``, ``with_stack``...).
    """

    order = CallbackOrder.External  # a profiled step ends after the optimizer step and the loggers
    name = "profiler"

    def __init__(self, begin_on_batch: int = 0, end_after_batch: int = 10, sync_timings: bool = True, ranks=None,
                 logdir: str = None, row_limit: int = 20, **profile_kwargs):
        for name, value in (("begin_on_batch", begin_on_batch), ("end_after_batch", end_after_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if end_after_batch <= begin_on_batch:
            raise ValueError(f"end_after_batch must be greater than begin_on_batch={begin_on_batch}, "
                             f"got {end_after_batch}")
        if ranks is not None and (not isinstance(ranks, (list, tuple, set)) or
                                  not all(isinstance(r, int) and r >= 0 for r in ranks)):
            raise ValueError(f"ranks must be None (all ranks) or a list of ranks >= 0, got {ranks!r}")
        self.begin, self.end, self.sync_timings = begin_on_batch, end_after_batch, sync_timings
        self.ranks = None if ranks is None else set(ranks)
        self.logdir, self.row_limit, self.profile_kwargs = logdir, row_limit, profile_kwargs
        self._profiler, self._done = None, False

    def folder(self, runner) -> str:
        return os.path.join(self.logdir or runner.spec.logdir, "profiler", f"rank-{runner.engine.rank}")

    def on_experiment_start(self, runner):
        if self.logdir is None and runner.spec.logdir is None:
            raise ValueError("ProfilerCallback writes traces under logdir/profiler/; pass logdir=... to train() "
                             "or to ProfilerCallback(logdir=...)")
        self._done = self.ranks is not None and runner.engine.rank not in self.ranks
        self._cuda = runner.engine.device.type == "cuda"

    def on_batch_start(self, runner):
        if self._done or self._profiler is not None or not runner.loop.is_train_loader:
            return
        index = runner.loop.global_batch_step - 1  # the loop callback counted this batch already
        if self.begin <= index < self.end:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self._cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            name = f"rank{runner.engine.rank}_{socket.gethostname()}_{os.getpid()}"
            self._profiler = torch.profiler.profile(
                activities=activities, schedule=_record_every_step, **self.profile_kwargs,
                on_trace_ready=torch.profiler.tensorboard_trace_handler(self.folder(runner), worker_name=name))
            self._profiler.step_num = index  # spans are named ProfilerStep#<global batch index>
            self._profiler.start()

    def on_batch_end(self, runner):
        if self._profiler is None or not runner.loop.is_train_loader:
            return
        if self.sync_timings and self._cuda:
            torch.cuda.synchronize()
        if runner.loop.global_batch_step < self.end:
            self._profiler.step()
        else:
            self._finish(runner)

    def on_experiment_end(self, runner):
        if self._profiler is not None:
            self._finish(runner)  # the run ended inside the window

    def on_exception(self, runner):
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler, self._done = None, True

    def _finish(self, runner):
        profiler, self._profiler, self._done = self._profiler, None, True
        profiler.stop()  # writes the trace
        sort = "self_cuda_time_total" if self._cuda else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=self.row_limit)
        path = os.path.join(self.folder(runner), "top_ops.txt")
        with open(path, "w") as f:
            f.write(table)
        if runner.engine.is_main:
            logger.info("profiler: top ops of train batches %d-%d on rank 0 (traces in %s):\n%s", self.begin,
                        self.end - 1, os.path.dirname(self.folder(runner)), table)
            traces = sorted(n for n in os.listdir(self.folder(runner)) if n.endswith(".pt.trace.json"))
            for name in (traces[-1:] + ["top_ops.txt"]):
                log_artifact(runner, os.path.join(self.folder(runner), name), "profiler")


def _record_every_step(step: int):
    """Record every step until stopped (a schedule also makes torch name the ``ProfilerStep#i`` spans)."""
    return torch.profiler.ProfilerAction.RECORD
