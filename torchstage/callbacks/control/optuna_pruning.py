"""Optuna pruning: report the validation metric each epoch; end the run when the trial should be pruned.

On several processes only the main rank talks to the study (``trial`` may be None elsewhere); its
decision is broadcast, so every rank stops after the same epoch.
"""
import logging

from torchstage.callbacks.base import Callback, CallbackOrder, CancelRun

logger = logging.getLogger("torchstage")


class OptunaPruningCallback(Callback):
    """Reports ``epoch_metrics[loader][metric]`` to ``trial`` at each epoch end (step: the global epoch).

    ``loader``/``metric`` default to the run's ``valid_loader``/``valid_metric``. When the pruner says
    so, the run ends after that epoch (its checkpoints written) and ``train()`` raises
    ``optuna.TrialPruned``. ``best`` holds the best reported value (the objective of the trial), also set as
    ``trial.best_score`` at each report. ``minimize`` defaults to ``minimize_valid_metric``; a value counts as
    better when it beats the best by more than ``min_delta``.
    """

    order = CallbackOrder.External

    def __init__(self, trial=None, loader: str = None, metric: str = None, minimize: bool = None,
                 min_delta: float = 0.0):
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or min_delta < 0:
            raise ValueError(f"OptunaPruningCallback: min_delta must be a number >= 0, got {min_delta!r}")
        if minimize is not None and not isinstance(minimize, bool):
            raise TypeError(f"OptunaPruningCallback: minimize must be True, False or None, got {minimize!r}")
        self.trial, self.loader, self.metric = trial, loader, metric
        self.minimize, self.min_delta = minimize, min_delta
        self.best, self.pruned_at = None, None

    def needs(self, stage) -> tuple:
        return ((self.loader or stage.valid_loader, self.metric or stage.valid_metric),)

    def on_experiment_start(self, runner):
        self.best, self.pruned_at = None, None

    def on_epoch_end(self, runner):
        loader, metric = self.loader or runner.valid_loader, self.metric or runner.valid_metric
        metrics = runner.loop.epoch_metrics.get(loader)
        if metrics is None:
            return  # validation did not run this epoch
        value, step = metrics[metric], runner.loop.global_epoch_step
        minimize = runner.minimize_valid_metric if self.minimize is None else self.minimize
        delta = self.min_delta
        if delta:
            better = (lambda a, b: a <= b - delta) if minimize else (lambda a, b: a >= b + delta)
        else:
            better = (lambda a, b: a < b) if minimize else (lambda a, b: a > b)
        if self.best is None or better(value, self.best):
            self.best = value
        prune = None
        if self.trial is not None and runner.engine.is_main:
            self.trial.report(value, step)
            self.trial.best_score = self.best  # Catalyst 22's objective reads it
            prune = self.trial.should_prune()
        prune = runner.engine.broadcast_object(prune)  # the main rank decides for all
        if prune:
            self.pruned_at = step
            if runner.engine.is_main:
                logger.info("optuna: trial %s pruned after epoch %d (%s/%s = %.6g)",
                            getattr(self.trial, "number", "?"), step, loader, metric, value)
            raise CancelRun()

    def on_experiment_end(self, runner):
        if self.pruned_at is not None:
            import optuna  # an optional extra: pip install torchstage[optuna]
            raise optuna.TrialPruned(f"pruned after epoch {self.pruned_at}")

