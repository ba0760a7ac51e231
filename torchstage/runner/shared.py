"""What the callbacks of a chain do for one another, owned by the runner: callbacks never find or call each other.

When the runner installs a chain (:meth:`~torchstage.runner.runner.Runner.set_callbacks`) each of its callbacks that
runs in this process offers the run what it does for every other one, in its
:meth:`~torchstage.callbacks.base.Callback.attach` to a :class:`Shared`: a logger registers to receive what any callback logs, a checkpoint writer to write
``last.pth`` when a stop asks, the non-finite check to run before every save, and so on. Callbacks then reach those
through ``runner.shared`` (and the runner's own :meth:`~torchstage.runner.runner.Runner.save_checkpoint`), as
ignite's handlers reach the engine's state and never one another.
"""


class Shared:
    """The offers of the callbacks of one chain (``runner.shared``), each registered by the callback that makes it."""

    def __init__(self):
        #: loggers (``log_metrics``/``log_artifact``): what any callback logs reaches each (main rank)
        self.loggers = []
        #: ``(save_last, folder_of)`` of each checkpoint writer: ``save_last(runner) -> path`` writes ``last.pth`` now
        #: (collective), ``folder_of(logdir)`` names its folder for a run writing ``logdir`` (None: it writes none)
        self.checkpoint_writers = []
        #: ``check(runner) -> None or why``, run before every checkpoint write: a reason not to write now, or an error
        self.save_checks = []
        #: the losses (``batch_metrics`` keys) a callback back-propagates itself: their optimizer callback only steps
        self.backpropagated = set()
        #: the at most so many batches per loader that a callback lets through (``check=True``'s message)
        self.batch_limits = []
        #: the signals that already stop the run gracefully (another handler need not be installed)
        self.stop_signals = set()
        #: the metric callbacks, copied for a validation pass in the middle of an epoch
        self.metrics = []
        #: what only one callback of a chain may do -> ``(fix, [callbacks])`` (refused before training when several)
        self.claims = {}
        #: a callback may roll the run back: the runner's rollback keeper joins the chain (``rollback``)
        self.rolls_back = False
        #: the run's rollback keeper, in a chain that may roll back (``runner.rollback``)
        self.rollback = None
        #: the YAML of a config run, kept for the loggers' hyperparameters
        self.config_text = None
        #: callbacks that go on through a pass nested in the run (``evaluate_loader`` mid-epoch): the hang watchdog
        self.nested = []

    def add_logger(self, logger) -> None:
        """``logger`` receives what every callback logs (``logger_base.log_metrics``/``log_artifact``)."""
        self.loggers.append(logger)

    def add_checkpoint_writer(self, save_last, folder_of) -> None:
        """A writer of ``last.pth``: a graceful stop asks it for one (:meth:`Runner.save_last`); a resume looks in its
        folder."""
        self.checkpoint_writers.append((save_last, folder_of))

    def add_save_check(self, check) -> None:
        """``check(runner)`` runs before every checkpoint write: None lets it go on, a reason skips it (a rollback is
        under way), an error ends the run (collective: every rank runs the same checks)."""
        self.save_checks.append(check)

    def add_backward(self, metric_key: str) -> None:
        """The loss ``metric_key`` is back-propagated by the callback that registers it."""
        self.backpropagated.add(metric_key)

    def add_batch_limit(self, batches: int) -> None:
        """A callback ends every loader after ``batches`` batches."""
        self.batch_limits.append(batches)

    def add_stop_signals(self, signals) -> None:
        """``signals`` already stop the run gracefully."""
        self.stop_signals.update(signals)

    def add_metric(self, callback) -> None:
        """A metric callback, copied for each validation pass in the middle of an epoch."""
        self.metrics.append(callback)

    def claim(self, what: str, fix: str, callback) -> None:
        """``callback`` will do ``what`` (``"put their averaged weights into the model for validation"``), which only
        one callback of a chain may: several are refused before training, naming them and ``fix``."""
        self.claims.setdefault(what, (fix, []))[1].append(callback)

    def allow_rollbacks(self) -> None:
        """A callback of the chain may roll the run back: the runner keeps snapshots (its rollback keeper)."""
        self.rolls_back = True

    def add_rollback_keeper(self, keeper) -> None:
        """The run's rollback keeper (:class:`~torchstage.runner.rollback.RollbackCallback`) is in the chain."""
        self.rollback = keeper

    def keep_config(self, text: str) -> None:
        """The YAML a config run was built from, logged with the hyperparameters."""
        self.config_text = text

    def keep_in_nested_passes(self, callback) -> None:
        """``callback`` also runs through a pass nested in the run (a mid-epoch validation)."""
        self.nested.append(callback)

    def checkpoint_folders(self, logdir) -> list:
        """The folders the checkpoint writers write to for a run writing ``logdir``, each once, in chain order."""
        folders = (folder_of(logdir) for _, folder_of in self.checkpoint_writers)
        return list(dict.fromkeys(folder for folder in folders if folder is not None))


def share(callbacks) -> Shared:
    """What ``callbacks`` (those of a chain that run in this process) offer one another."""
    shared = Shared()
    for callback in callbacks:
        callback.attach(shared)
    return shared
