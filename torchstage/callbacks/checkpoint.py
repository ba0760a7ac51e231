"""Checkpoints at epoch end: ``last.pth``, ``best.pth`` by the valid metric, and ``metrics.json``."""
import json
import math
import os

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.checkpoint import serialize, write_atomic


class CheckpointCallback(Callback):
    """Writes ``logdir/checkpoints/{last,best}.pth`` atomically on the main rank; every rank decides "best".

    The best score is tracked per stage (a new stage may optimise another loss); ``metrics.json``
    keeps the valid metric of every epoch and the best and last entries.
    """

    order = CallbackOrder.Checkpoint
    name = "checkpoint"

    def __init__(self, logdir: str = None):
        self.logdir = logdir
        self.best, self.history = None, []

    def on_stage_start(self, runner):
        if self.best is not None and self.best.get("stage") != runner.stage_key:
            self.best = None

    def on_epoch_end(self, runner):
        folder = os.path.join(self.logdir or runner.spec.logdir, "checkpoints")
        entry = {"stage": runner.stage_key, "epoch": runner.epoch, "global_epoch": runner.global_epoch_step,
                 "metrics": {k: dict(v) for k, v in runner.epoch_metrics.items()}}
        value = self._valid_value(runner)
        is_best = value is not None and (self.best is None or self._better(runner, value, self.best["value"]))
        if value is not None:
            entry["value"] = value
        self.history.append(entry)
        if is_best:
            self.best = entry
        data = serialize(runner.state_dict())  # collective: every rank takes part
        if not runner.engine.is_main:
            return
        write_atomic(os.path.join(folder, "last.pth"), data)
        if is_best:
            write_atomic(os.path.join(folder, "best.pth"), data)
        summary = {"valid_loader": runner.valid_loader, "valid_metric": runner.valid_metric,
                   "minimize_valid_metric": runner.minimize_valid_metric, "best": self.best,
                   "last": entry, "history": self.history}
        write_atomic(os.path.join(folder, "metrics.json"), json.dumps(summary, indent=2).encode())

    @staticmethod
    def _valid_value(runner):
        metrics = runner.epoch_metrics.get(runner.valid_loader)
        if metrics is None:
            return None  # validation did not run this epoch
        if runner.valid_metric not in metrics:
            raise KeyError(f"valid_metric={runner.valid_metric!r} was not produced on loader "
                           f"{runner.valid_loader!r}; it produced {sorted(metrics)}")
        value = metrics[runner.valid_metric]
        return None if math.isnan(value) else value

    @staticmethod
    def _better(runner, value, best) -> bool:
        return value < best if runner.minimize_valid_metric else value > best

    def state_dict(self):
        return {"best": self.best, "history": self.history}

    def load_state_dict(self, state):
        self.best, self.history = state["best"], state["history"]
