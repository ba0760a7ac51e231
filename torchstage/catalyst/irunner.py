"""Catalyst 22's low-level runner API, ``dl.IRunner``: a subclass gives its parts through ``get_*`` methods and
starts with ``run()``, which becomes one ``train(...)`` call (its arguments checked before training, as always)."""
from torchstage.logging_setup import note_alias
from torchstage.rng import set_seed
from torchstage.catalyst.runners import Runner


class IRunner(Runner):
    """Catalyst 22's ``IRunner``: override ``get_loaders()``, ``get_model()`` and ``handle_batch(batch)``, and as
    needed ``get_engine()``, ``get_loggers()``, ``get_criterion()``, ``get_optimizer(model)``,
    ``get_scheduler(optimizer)``, ``get_callbacks()``, the ``num_epochs``, ``seed`` and ``hparams`` properties;
    then ``runner.run()``. The seed is set before the loaders and again before the other parts are made, as
    Catalyst did. torchstage's spelling is ``Runner.train(model=..., loaders=..., ...)``.

    On an IRunner, a class only Catalyst 22 scripts use, ``runner.batch_step`` has Catalyst 22's meaning (the
    batches of every loader so far in the run) and ``runner.loader_batch_step`` is the batch within the loader
    (counted from 1); on other runners ``batch_step`` is torchstage's batch within the loader.
    """

    _catalyst_epochs = 1
    catalyst22_batch_step = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "num_epochs" in cls.__dict__:  # Catalyst's property; the loop keeps runner.num_epochs itself
            cls._catalyst_epochs = cls.__dict__["num_epochs"]
            cls.num_epochs = Runner.num_epochs

    def __init__(self, model=None, engine=None):
        super().__init__(model=model, engine=engine)
        self._running = False

    @property
    def batch_step(self) -> int:
        """Catalyst 22's: batches of every loader so far in this process's run (``runner.loop.run_batch_step``)."""
        return self.loop.run_batch_step

    @property
    def loader_batch_step(self) -> int:
        """Catalyst 22's: the batch within the current loader, counted from 1 (torchstage's ``loop.batch_step``)."""
        return self.loop.batch_step

    @property
    def seed(self) -> int:
        """The experiment's seed (42, as Catalyst's)."""
        return 42

    @property
    def hparams(self) -> dict:
        """Hyperparameters of the run (logged by Catalyst's loggers; kept here for a subclass to read)."""
        return {}

    def get_engine(self):
        """The engine of the run (None: torchstage's default for this machine)."""
        return self.engine

    def get_loaders(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} must override get_loaders() (dl.IRunner)")

    def get_model(self):
        raise NotImplementedError(f"{type(self).__name__} must override get_model() (dl.IRunner)")

    def get_criterion(self):
        return None

    def get_optimizer(self, model):
        return None

    def get_scheduler(self, optimizer):
        return None

    def get_callbacks(self) -> dict:
        return {}

    def run(self) -> "Runner":
        """Catalyst 22's entry point: the ``get_*`` parts as one ``train(...)`` call. (Inside that call, ``run`` is
        the runner's loop, as for every runner.)"""
        if self._running:
            return super().run()
        note_alias(f"{type(self).__name__}(dl.IRunner).run()", "Runner().train(model=..., loaders=..., ...)",
                   version="22")
        epochs = self._catalyst_epochs
        epochs = epochs.__get__(self) if hasattr(epochs, "__get__") else epochs
        set_seed(self.seed)
        loaders = self.get_loaders()
        set_seed(self.seed)
        model = self.get_model()
        criterion = self.get_criterion()
        optimizer = self.get_optimizer(model=model)
        scheduler = self.get_scheduler(optimizer=optimizer)
        set_seed(self.seed)
        callbacks = self.get_callbacks()
        self._running = True
        try:
            return self.train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                              loaders=loaders, callbacks=callbacks, engine=self.get_engine(), num_epochs=epochs,
                              seed=self.seed)
        finally:
            self._running = False
