"""The callback contract: event methods, the order phases, the rank scope and cancel exceptions."""
from enum import IntEnum

EVENTS = (
    "on_experiment_start", "on_stage_start", "on_epoch_start", "on_loader_start", "on_batch_start",
    "on_batch_end", "on_loader_end", "on_epoch_end", "on_stage_end", "on_experiment_end",
    "on_exception",
)


class CallbackOrder(IntEnum):
    """Phases of the chain; callbacks run in ascending order for every event (a stable sort)."""

    Internal = 0
    Metric = 20
    MetricAggregation = 40
    Backward = 50
    Optimizer = 60
    Scheduler = 80
    Checkpoint = 100
    Logging = 120
    External = 200


class CallbackScope(IntEnum):
    """Where a callback runs: on every rank, or on the main rank only (loggers, progress, writes)."""

    All = 0
    Main = 1
    #: Every rank of a run of several processes, none of a single-process run (the hang watchdog, the
    #: even-batches check): such a run pays nothing for them.
    Distributed = 3

    def runs_on(self, engine) -> bool:
        """Whether a callback of this scope runs in the process of ``engine``."""
        if self is CallbackScope.Main:
            return engine.is_main
        return self is CallbackScope.All or engine.is_distributed


class EventMethods:
    """The event methods, each a no-op called with the runner; callbacks override them."""

    def on_experiment_start(self, runner): pass
    def on_stage_start(self, runner): pass
    def on_epoch_start(self, runner): pass
    def on_loader_start(self, runner): pass
    def on_batch_start(self, runner): pass
    def on_batch_end(self, runner): pass
    def on_loader_end(self, runner): pass
    def on_epoch_end(self, runner): pass
    def on_stage_end(self, runner): pass
    def on_experiment_end(self, runner): pass
    def on_exception(self, runner): pass


class Callback(EventMethods):
    """Base class: override any ``on_*`` method; each receives the runner and reads/writes its state."""

    order: int = CallbackOrder.External
    scope: CallbackScope = CallbackScope.All
    #: True if :meth:`state_dict` differs between ranks: checkpoints then keep one state per rank.
    state_per_rank: bool = False
    #: True if its ``on_batch_start``/``on_batch_end`` act on train loaders only: the runner leaves it out of
    #: the batch events of other loaders (a subclass that acts on every loader sets it back to False).
    train_batches_only: bool = False

    def __init__(self, order: int = None, scope: CallbackScope = None):
        """Optional instance settings: ``Callback(CallbackOrder.Metric, CallbackScope.Main)``; subclasses may also
        set class attributes instead."""
        owner = type(self).__name__
        if order is not None:
            if isinstance(order, bool) or not isinstance(order, int):
                raise TypeError(f"{owner}(): order must be an int such as CallbackOrder.Metric, got {order!r}")
            self.order = order
        if scope is not None:
            if not isinstance(scope, CallbackScope):
                raise TypeError(f"{owner}(): scope must be CallbackScope.All, .Main or .Distributed (which ranks "
                                f"run the callback), got {scope!r}")
            self.scope = scope

    def state_dict(self) -> dict:
        """State worth resuming (best score, patience...); empty for stateless callbacks."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    def merge_rank_states(self, states: list) -> dict:
        """For ``state_per_rank`` callbacks: one state holding what the ranks' states held, for a run resumed
        mid-loader on another number of processes (loaded on its main rank); TypeError where it cannot be."""
        raise TypeError(f"{type(self).__name__} keeps a state per rank and cannot merge them")

    def empty_rank_state(self, merged: dict) -> dict:
        """What the other ranks load beside the main rank's :meth:`merge_rank_states`: nothing by default; a callback
        whose loader-end collective follows the keys it holds returns them with nothing counted, so that every rank
        takes part in it alike, even one whose part of the resumed loader has no batch left."""
        return {}

    @property
    def produces(self) -> tuple:
        """Metric names this callback writes, so ``valid_metric`` can be checked before training."""
        return ()

    def needs(self, stage) -> tuple:
        """``(loader, metric)`` pairs this callback reads, so that a name nothing produces is refused before training;
        ``stage`` gives the defaults (``stage.valid_loader``, ``stage.valid_metric``)."""
        return ()

    def step_plans(self, stage) -> tuple:
        """The :class:`~torchstage.strategies.base.StepPlan` of each optimizer this callback will step in ``stage`` (a
        StageSpec: ``stage.optimizer``), declared before training so that the strategy sets up for them; none here."""
        return ()

    def attach(self, shared) -> None:
        """Offer the run what this callback does for every other one, when the runner installs its chain: register
        with ``shared`` (a :class:`~torchstage.runner.shared.Shared`) as a logger, a checkpoint writer, a check before
        each save...; callbacks reach those through ``runner.shared``, never one another. Nothing here; registering
        only (the runner may ask twice)."""

    def handles(self, event: str) -> bool:
        """True if this callback overrides ``event``; the runner skips the rest at no cost.

        Override to opt out per instance (e.g. no per-batch work without a batch period)."""
        return getattr(type(self), event) is not getattr(Callback, event)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(order={int(self.order)}, scope={self.scope.name})"


class CancelException(Exception):
    """Raised by a callback to cut a level short; the loop still fires that level's ``*_end`` event."""


class CancelBatch(CancelException):
    """Skip the rest of this batch."""


class CancelLoader(CancelException):
    """End this loader now."""


class CancelEpoch(CancelException):
    """End this epoch now (remaining loaders are skipped)."""


class CancelStage(CancelException):
    """End this stage now; the next stage starts."""


class CancelRun(CancelException):
    """End the whole run now (early stopping, a smoke run's end, a requested stop)."""


class RollBack(CancelLoader):
    """End the current train loader's pass: a rollback was asked for (``runner.rollback``, the run's
    :class:`~torchstage.runner.rollback.RollbackCallback`). The loop fires ``on_loader_end`` as for any cancel, then
    the keeper puts the run back to its snapshot of the pass, and the loader starts again from there, without the bad
    batch."""
