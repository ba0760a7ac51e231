"""Checkpoints: ``last.pth`` every period, ``best.pth`` and the top-k ``epoch-NNNN.pth`` by the valid metric.

Files live in ``logdir/checkpoints/`` with ``metrics.json``; every write is atomic and goes through the runner's
save (:meth:`~torchstage.runner.runner.Runner.save_checkpoint`), which runs the checks registered with it first.
``last.pth`` may be written after a train batch (``Batch(n)``), which resumes mid-epoch exactly; a graceful stop
asks every checkpoint callback for one (each registers as a writer of the run).
"""
import glob
import json
import math
import os

from torchstage.arguments import ArgumentError
from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.files.atomic import write_atomic
from torchstage.files.checkpoint_read import load_checkpoint
from torchstage.files.checkpoint_format import checkpoint_folder, checkpoint_path
from torchstage.files.writer import hand_over
from torchstage.periods import Batch, Epoch, as_periods, batch_due, epoch_due


class CheckpointCallback(Callback):
    """Writes checkpoints atomically on the main rank; every rank takes part and decides "best" alike.

    ``period``: when ``last.pth`` is written: ``Epoch(n)`` (default ``Epoch(1)``), ``Batch(n)`` (mid-epoch,
    every n train batches) or a tuple of both; the last epoch of each stage always writes it.
    ``topk``: how many ``epoch-NNNN.pth`` (global epoch number) to keep, the best by the valid metric; by
    default none, since the best epoch is ``best.pth`` already (one ``epoch-NNNN.pth`` would be its copy).
    ``load_best_on_end``: load ``best.pth`` weights into the model when the run ends (not after a stop).
    The best score and top-k list are tracked per stage (a new stage may optimise another loss).
    """

    order = CallbackOrder.Checkpoint
    name = "checkpoint"

    #: ``(loader, metric, minimize)`` judging the best epoch instead of the run's valid metric (None: the run's)
    loader_key = metric_key = minimize = None

    def __init__(self, logdir: str = None, period=Epoch(1), topk: int = 0, load_best_on_end: bool = False):
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
            raise ArgumentError("topk", f"must be an integer >= 0 (how many epoch-NNNN.pth to keep), got {topk!r}")
        self.logdir, self.periods = logdir, as_periods(period, "period")
        self.topk, self.load_best_on_end = topk, bool(load_best_on_end)
        self.best, self.kept = None, []
        #: each epoch's entry as a line of JSON, made once: the checkpoint and metrics.json of a long run join
        #: them instead of walking every past epoch again
        self.history = []
        self._saved_at = None

    def folder(self, runner) -> str:
        """This callback's checkpoint folder: ``<logdir>/checkpoints`` of its own logdir or the run's."""
        return self.folder_of(runner.spec.logdir)

    def folder_of(self, run_logdir) -> str:
        """The checkpoint folder for a run writing ``run_logdir``: ``<logdir>/checkpoints``, of its own or the run's
        (None without either)."""
        logdir = self.logdir or run_logdir
        return None if logdir is None else checkpoint_folder(logdir)

    def attach(self, shared) -> None:
        shared.add_checkpoint_writer(self.save_last, self.folder_of)  # a stop asks for last.pth; a resume looks here

    def needs(self, stage) -> tuple:
        return ((self.loader_key, self.metric_key),) if self.metric_key is not None else ()

    def _judged_by(self, runner) -> tuple:
        """``(loader, metric, minimize)`` that pick the best epoch: this callback's own, else the run's."""
        if self.metric_key is not None:
            return self.loader_key, self.metric_key, self.minimize
        return runner.valid_loader, runner.valid_metric, runner.minimize_valid_metric

    def on_experiment_start(self, runner):
        if runner.engine.is_main:  # temporary files of a write that a crash interrupted
            for stale in glob.glob(os.path.join(self.folder(runner), ".*.tmp")):
                os.remove(stale)

    def on_stage_start(self, runner):
        if self.best is not None and self.best.get("stage") != runner.loop.stage_key:
            self.best, self.kept = None, []

    def handles(self, event: str) -> bool:
        if event == "on_batch_end":  # only batch periods need a look after every batch
            return any(isinstance(period, Batch) for period in self.periods)
        return super().handles(event)

    def on_batch_end(self, runner):
        if batch_due(self.periods, runner):
            self.save_last(runner)

    def on_epoch_end(self, runner):
        loop = runner.loop
        entry = {"stage": loop.stage_key, "epoch": loop.epoch, "global_epoch": loop.global_epoch_step,
                 "metrics": {k: dict(v) for k, v in loop.epoch_metrics.items()}}
        value = self._valid_value(runner)
        if value is not None:
            entry["value"] = value
        is_best = value is not None and (self.best is None or self._better(runner, value, self.best["value"]))
        if is_best:
            self.best = entry
        kept, dropped = self._update_topk(runner, entry)
        self.history.append(json.dumps(entry))
        last_due = epoch_due(self.periods, runner) or runner.loop.epoch == runner.loop.num_epochs
        folder = self.folder(runner)
        # last.pth goes last, after every file it accounts for (best, the epoch file, then metrics.json and the
        # removals): a kill at any moment leaves last.pth on the previous epoch, whose resume redoes this one and
        # writes each file again, as it was
        targets = ([checkpoint_path(folder, "best")] if is_best else []) + \
                  ([os.path.join(folder, entry["file"])] if kept else []) + \
                  ([checkpoint_path(folder, "last")] if last_due else [])
        summary = self._summary(runner, folder, entry, [os.path.join(folder, old["file"]) for old in dropped]) \
            if runner.engine.is_main else None
        if targets:  # independent files, the summary written before the last of them (collective)
            written = runner.save_checkpoint(targets, before_last=summary, last_good=self._last_good(runner))
        else:
            written = True
            if runner.engine.is_main:
                hand_over(runner.file_writer, summary, large=False)
        if last_due and written:
            self._saved_at = self._position(runner)

    def _summary(self, runner, folder: str, entry: dict, dropped: list):
        """The job that removes the epoch files that left the top k and writes ``metrics.json`` (main rank): after
        this epoch's best and epoch files land, before ``last.pth`` (a failed write leaves every file in place)."""
        loader, metric, minimize = self._judged_by(runner)
        summary = metrics_json({"valid_loader": loader, "valid_metric": metric,
                                "minimize_valid_metric": minimize, "best": self.best,
                                "last": entry, "topk": self.kept, "history": self.history})

        def write():
            for path in dropped:
                if os.path.exists(path):
                    os.remove(path)
            write_atomic(checkpoint_path(folder, "metrics"), summary, durable=False)
        return write

    def save_last(self, runner) -> str:
        """Write ``last.pth`` for the current position unless already written there; collective."""
        path = checkpoint_path(self.folder(runner), "last")
        position = self._position(runner)
        if self._saved_at == position:
            return path
        if runner.save_checkpoint([path], last_good=self._last_good(runner)):
            self._saved_at = position
        return path

    def on_experiment_end(self, runner):
        if runner.file_writer is not None:  # every checkpoint on disk before anything (a logger) reads one
            runner.file_writer.wait()
        if not self.load_best_on_end or runner.loop.stop_request is not None or self.best is None:
            return
        runner.engine.barrier()  # the main rank has written best.pth
        runner.load_state_dict(load_checkpoint(checkpoint_path(self.folder(runner), "best")), weights_only=True)

    def _last_good(self, runner) -> str:
        """The checkpoint a save that finds the state not finite leaves as the last finite one, named."""
        if self._saved_at is None:
            return f"the checkpoint this run started from, if any ({checkpoint_path(self.folder(runner), 'last')})"
        stage, epoch, batch, done = self._saved_at
        return (f"{checkpoint_path(self.folder(runner), 'last')} (stage {stage!r}, epoch {epoch}"
                f"{'' if done else ' mid-epoch'}, global batch {batch})")

    def _update_topk(self, runner, entry):
        """Add ``entry`` to the kept top-k if it belongs there, and trim the list to ``topk`` (a run resumed with
        a smaller one, 0 included, drops what its checkpoint kept beyond it); return (kept it?, entries to delete)."""
        if "value" not in entry:
            return False, []
        ranked = list(self.kept)
        if self.topk:
            entry["file"] = os.path.basename(checkpoint_path("", entry["global_epoch"]))
            ranked.append({"file": entry["file"], "value": entry["value"], "stage": entry["stage"],
                           "global_epoch": entry["global_epoch"]})
        ranked.sort(key=lambda e: e["value"], reverse=not self._judged_by(runner)[2])  # stable: earlier wins ties
        self.kept, dropped = ranked[: self.topk], ranked[self.topk:]
        return any(e["file"] == entry.get("file") for e in self.kept), dropped

    @staticmethod
    def _position(runner) -> tuple:
        return runner.loop.stage_key, runner.loop.epoch, runner.loop.global_batch_step, runner.loop.epoch_done

    def _valid_value(self, runner):
        loader, metric, _ = self._judged_by(runner)
        metrics = runner.loop.epoch_metrics.get(loader)
        if metrics is None:
            return None  # validation did not run this epoch
        if metric not in metrics:
            raise KeyError(f"valid_metric={metric!r} was not produced on loader {loader!r}; it produced "
                           f"{sorted(metrics)}")
        value = metrics[metric]
        return None if math.isnan(value) else value

    def _better(self, runner, value, best) -> bool:
        return value < best if self._judged_by(runner)[2] else value > best

    def state_dict(self):
        return {"best": self.best, "history_jsonl": "\n".join(self.history), "kept": self.kept}

    def load_state_dict(self, state):
        self.best, self.kept = state["best"], state.get("kept", [])
        if "history_jsonl" in state:
            self.history = state["history_jsonl"].splitlines()
        else:  # a checkpoint written before the history was kept as JSON lines
            self.history = [json.dumps(entry) for entry in state["history"]]


def metrics_json(summary: dict) -> bytes:
    """``metrics.json``: a line per key and per history entry (``summary["history"]`` holds them as JSON
    text already); readable, and made by json's C encoder (``indent=`` turns it off)."""
    lines = []
    for key, value in summary.items():
        if key == "history" and value:
            entries = ",\n    ".join(value)
            lines.append(f'  "history": [\n    {entries}\n  ]')
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return ("{\n" + ",\n".join(lines) + "\n}\n").encode()
