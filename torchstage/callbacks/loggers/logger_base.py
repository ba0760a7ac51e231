"""The logger protocol: what every logger (CSV, TensorBoard, MLflow...) receives, and how others reach them.

A logger is a main-rank callback. The base class turns run events into five calls a logger implements:
:meth:`LoggerCallback.log_hparams` once at the start, :meth:`~LoggerCallback.log_metrics` for loader metrics
(per epoch), train batch scalars (every ``log_period``) and mid-epoch validation, and
:meth:`~LoggerCallback.log_artifact` for files (a checkpoint, a plot, a trace). Other callbacks (monitors,
the profiler, periodic validation) report through :func:`log_metrics` and :func:`log_artifact`, which
reach every logger of the run (each registers with ``runner.shared``). A train pass a rollback ended is not logged
at its end: its batches run again. A logger's :meth:`state_dict` (e.g. a tracking run id) is kept in
checkpoints, so a resumed or requeued run continues the same tracking run.
"""
import dataclasses
import os

import torch
import yaml

from torchstage.arguments import ArgumentError
from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope
from torchstage.files.straggler_log import RANK_FIGURES
from torchstage.launch.resolve import restart_attempt
from torchstage.periods import Batch, as_periods, batch_due

#: ``scope`` of :meth:`LoggerCallback.log_metrics`: loader metrics of an epoch (step: the global epoch).
EPOCH, BATCH, PERIODIC = "epoch", "batch", "periodic"
#: ``scope`` of each rank's step times of a train loader (step: the global epoch), from the straggler detector.
RANKS = RANK_FIGURES
#: The ``loader`` of run-level values: the restart count of a restarted job.
RUN = "run"


def check_batch_period(period) -> tuple:
    """The periods of ``log_period``: only ``Batch(n)`` (epoch values are always logged); ``()`` for none."""
    if isinstance(period, tuple) and not period:
        return ()
    periods = as_periods(period, "log_period")
    if not periods or not all(isinstance(p, Batch) for p in periods):
        raise ArgumentError("log_period", f"must be Batch(n) (train batch metrics every n batches), got {period!r}")
    return periods


class LoggerCallback(Callback):
    """Base of every logger: override the ``log_*`` methods, not the events.

    ``log_period``: ``Batch(n)`` logs the train batch metrics every ``n`` train batches (one host read per
    period, shared by all loggers, never per batch); ``()`` never; ``None`` (default) follows
    ``train(log_period=...)``.
    """

    order = CallbackOrder.Logging
    scope = CallbackScope.Main

    def __init__(self, log_period=None):
        self.periods = None if log_period is None else check_batch_period(log_period)

    # ---- what a logger implements ---------------------------------------------------------
    def log_hparams(self, hparams: dict, runner) -> None:
        """The run's hyperparameters (plain values), once per process start (a resume sends them again)."""

    def log_metrics(self, metrics: dict, step: int, loader: str, scope: str, runner) -> None:
        """Float ``metrics`` of ``loader`` at ``step``: ``scope`` is EPOCH (step = global epoch), BATCH or
        PERIODIC (step = global train batch), or RANKS (each rank's step times, ``rank3/compute_ms``...; step =
        global epoch)."""

    def log_artifact(self, path: str, runner, kind: str = "file") -> None:
        """A file of the run (``kind``: "checkpoint", "plot", "trace", "summary"...) to keep with it."""

    def close(self, runner, status: str) -> None:
        """The run ended: ``status`` is "FINISHED", "STOPPED" (a graceful stop, to be resumed) or "FAILED"."""

    # ---- events ----------------------------------------------------------------------------
    def attach(self, shared) -> None:
        shared.add_logger(self)  # what every callback logs reaches it

    def handles(self, event: str) -> bool:
        if event == "on_batch_end":  # no per-batch call without a batch period
            return self.periods is None or bool(self.periods)
        return super().handles(event)

    def on_experiment_start(self, runner):
        if self.periods is None:
            self.periods = check_batch_period(runner.spec.log_period or ())
        self.log_hparams(run_hparams(runner), runner)
        attempt = restart_attempt()
        if attempt:  # a restarted job: the count, at the global epoch it goes on from, under loader "run"
            self.log_metrics({"restarts": attempt}, runner.loop.global_epoch_step, RUN, EPOCH, runner)

    def on_batch_end(self, runner):
        if self.periods and batch_due(self.periods, runner):
            loop = runner.loop
            self.log_metrics(batch_scalars(runner), loop.global_batch_step, loop.loader_key, BATCH, runner)

    def on_loader_end(self, runner):
        loop = runner.loop
        if not loop.rolling_back():  # a pass a rollback ended runs again, and is logged then
            self.log_metrics(dict(loop.loader_metrics), loop.global_epoch_step, loop.loader_key, EPOCH, runner)

    def on_experiment_end(self, runner):
        self.close(runner, "STOPPED" if runner.loop.stop_request is not None else "FINISHED")

    def on_exception(self, runner):
        self.close(runner, "FAILED")


def loggers(runner) -> list:
    """The loggers of the current chain that run in this process (none on other ranks than the main one)."""
    return runner.shared.loggers if runner.engine.is_main else []


def log_metrics(runner, metrics: dict, step: int, loader: str, scope: str) -> None:
    """Send float ``metrics`` to every logger of the run (main rank; a no-op elsewhere, and at the end of a train
    pass a rollback ended)."""
    if runner.loop.rolling_back():
        return
    for logger in loggers(runner):
        logger.log_metrics(metrics, step, loader, scope, runner)


def log_artifact(runner, path: str, kind: str = "file") -> None:
    """Send a file to every logger of the run (main rank; a no-op elsewhere)."""
    for logger in loggers(runner):
        logger.log_artifact(os.fspath(path), runner, kind)


def batch_scalars(runner) -> dict:
    """The current batch's scalar metrics as floats, read from the device once for all loggers."""
    cached = getattr(runner, "_logged_batch", None)
    if cached is not None and cached[0] is runner.loop.batch_metrics:
        return cached[1]
    values = {k: v for k, v in runner.loop.batch_metrics.items()
              if isinstance(v, (float, int)) or (isinstance(v, torch.Tensor) and v.numel() == 1)}
    floats = torch.stack([torch.as_tensor(v).detach().reshape(()).double().cpu() for v in values.values()]) \
        if values else torch.zeros(0)
    result = dict(zip(values, floats.tolist()))
    runner._logged_batch = (runner.loop.batch_metrics, result)
    return result


def run_hparams(runner) -> dict:
    """The resolved ``train()`` arguments as plain values (objects by class name), the world's shape, and the
    flattened YAML config (``config.<path>``) of a ``torchstage run``."""
    spec, hparams = runner.spec, {}
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if field.name in _SKIPPED or value is None:
            continue
        if field.name == "stages":
            value = list(value)
        elif field.name == "callbacks":
            value = list(value) if isinstance(value, dict) else [type(cb).__name__ for cb in value]
        elif field.name == "optimizer" and hasattr(value, "param_groups"):
            hparams["lr"] = value.param_groups[0].get("lr")
        hparams[field.name] = _plain(value)
    hparams.update(world_size=runner.engine.world_size, device=runner.engine.device.type,
                   threads_per_process=torch.get_num_threads())
    if runner.shared.config_text is not None:
        hparams.update(_flatten(yaml.safe_load(runner.shared.config_text) or {}, "config."))
    return hparams


_SKIPPED = ("stage_specs", "loaders", "datasets", "resume", "overwrite", "verbose")  # not hyperparameters


def _plain(value):
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return ", ".join(map(str, value))
    if isinstance(value, dict) and all(not isinstance(v, (dict, list)) for v in value.values()):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items())
    if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)) or hasattr(value, "state_dict"):
        return type(value).__name__
    return repr(value) if len(repr(value)) <= 200 else type(value).__name__


def _flatten(tree, prefix: str) -> dict:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): _plain(tree)}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": _plain(value)})
    return flat
