"""Early stopping on any loader metric, with its patience counter saved in checkpoints."""
import logging
import math

from torchstage.callbacks.base import Callback, CallbackOrder, CancelRun

logger = logging.getLogger("torchstage")


class EarlyStoppingCallback(Callback):
    """Ends the run (:class:`~torchstage.CancelRun`) after ``patience`` checks without improvement.

    A check happens each time loader ``loader_key`` (default: the run's ``valid_loader``) ends; the
    value of ``metric_key`` (default: ``valid_metric``) improves when it beats the best so far by more
    than ``min_delta``. ``minimize`` defaults to ``minimize_valid_metric`` for the valid metric and must
    be given for any other metric. The state resets when a new stage starts. The run stops at the end
    of the epoch, after checkpoints and logs are written, and the state in those checkpoints already
    counts that epoch and says the run stopped: resuming it trains nothing, as resuming a run that reached
    ``num_epochs`` does. Every rank sees the same averaged metrics, so all ranks stop together.
    """

    order = CallbackOrder.External
    name = "early_stopping"

    def __init__(self, patience: int, metric_key: str = None, loader_key: str = None, minimize: bool = None,
                 min_delta: float = 0.0):
        for name, value in (("metric_key", metric_key), ("loader_key", loader_key)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"EarlyStoppingCallback: {name} must be a str, got {value!r} (Catalyst 20.12's "
                                f"positional order was patience, metric, minimize: pass them by name)")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
        if not isinstance(min_delta, (int, float)) or min_delta < 0:
            raise ValueError(f"min_delta must be a number >= 0, got {min_delta!r}")
        if minimize is not None and not isinstance(minimize, bool):
            raise TypeError(f"minimize must be True, False or None, got {minimize!r}")
        self.patience, self.min_delta = patience, min_delta
        self.metric_key, self.loader_key, self.minimize = metric_key, loader_key, minimize
        self.stage, self.best, self.best_epoch, self.wait = None, None, None, 0
        self.stopped = False  #: the run ended here: patience ran out (kept in checkpoints)

    def needs(self, stage) -> tuple:
        return ((self.loader_key or stage.valid_loader, self.metric_key or stage.valid_metric),)

    def on_stage_start(self, runner):
        if self.stopped and runner.loop.resume_point is None:  # a resumed run that had stopped early: it is over
            logger.warning("early stopping: the run stopped early at epoch %s of stage %r (%s/%s did not improve "
                           "for %d check(s), best %s at epoch %s); nothing to train. Raise patience to train on, or "
                           "start a new run", self.best_epoch if self.wait == 0 else runner.loop.epoch, self.stage,
                           self.loader_key or runner.valid_loader, self.metric_key or runner.valid_metric,
                           self.wait, self.best, self.best_epoch)
            raise CancelRun()
        self._metric = self.metric_key or runner.valid_metric
        self._loader = self.loader_key or runner.valid_loader
        self._minimize = self.minimize
        if self._minimize is None:
            if self._metric != runner.valid_metric:
                raise ValueError(f"EarlyStoppingCallback(metric_key={self._metric!r}) needs minimize=True or "
                                 f"False: only the valid metric ({runner.valid_metric!r}) has a known direction")
            self._minimize = runner.minimize_valid_metric
        if self.stage != runner.loop.stage_key:
            self.stage, self.best, self.best_epoch, self.wait = runner.loop.stage_key, None, None, 0

    def on_loader_end(self, runner):
        if runner.loop.loader_key != self._loader:
            return
        if self._metric not in runner.loop.loader_metrics:
            raise KeyError(f"EarlyStoppingCallback: metric {self._metric!r} was not produced on loader "
                           f"{self._loader!r}; it produced {sorted(runner.loop.loader_metrics)}")
        value = runner.loop.loader_metrics[self._metric]
        if self._improved(value):
            self.best, self.best_epoch, self.wait = value, runner.loop.epoch, 0
        else:
            self.wait += 1
        self.stopped = self.wait >= self.patience  # known now, so this epoch's checkpoints say it

    def _improved(self, value) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value < self.best - self.min_delta if self._minimize else value > self.best + self.min_delta

    def on_epoch_end(self, runner):
        if self.stopped:
            logger.info("early stopping at epoch %d: %s/%s has not improved for %d check(s); best %s at epoch %s",
                        runner.loop.epoch, self._loader, self._metric, self.wait, self.best, self.best_epoch)
            raise CancelRun()

    def state_dict(self):
        return {"stage": self.stage, "best": self.best, "best_epoch": self.best_epoch, "wait": self.wait,
                "stopped": self.stopped}

    def load_state_dict(self, state):
        self.stage, self.best, self.best_epoch, self.wait = (state["stage"], state["best"], state["best_epoch"],
                                                             state["wait"])
        self.stopped = state.get("stopped", False)
