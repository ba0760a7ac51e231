"""The Runner: experiment -> stages -> epochs -> loaders -> batches, each level run by one helper."""
import logging

from torchstage.callbacks.base import (EVENTS, CallbackScope, CancelBatch, CancelEpoch, CancelLoader, CancelRun,
                                       CancelStage)
from torchstage.data.prefetch import prefetch_to_device
from torchstage.files.lock import LogdirLock
from torchstage.files.writer import FileWriter
from torchstage.launch.failures import record_stop
from torchstage.one_or_many import map_named
from torchstage.rng import set_seed
from torchstage.runner import export, inference
from torchstage.runner.defaults import default_callbacks
from torchstage.runner.large_models import log_memory_plan
from torchstage.runner.failure_record import record_run_failure
from torchstage.runner.loop_state import EpochMetrics, LoopState, expose_loop_state
from torchstage.runner.resume import loader_batches, remaining_loaders
from torchstage.runner import saving
from torchstage.runner.shared import Shared, share
from torchstage.runner.snapshot import Snapshot, restore_snapshot, take_snapshot
from torchstage.runner.setup import train_in_world
from torchstage.runner.errors import shorten_user_error
from torchstage.runner.spec import TrainSpec, make_spec
from torchstage.runner.train_arguments import takes_arguments_of, train_signature
from torchstage.runner.state import load_runner_state_dict, runner_state_dict
from torchstage.stop_request import RunStopped
from torchstage.distributed.agreement import AgreementChannel
from torchstage.distributed.engine import Engine
from torchstage.strategies.precision import Precision
from torchstage.strategies.single import SingleDevice

logger = logging.getLogger("torchstage")


@expose_loop_state
class Runner:
    """Drives a run and fires every event through the callback chain.

    Subclass and override :meth:`handle_batch` for custom training steps (GANs, multi-model runs);
    :class:`~torchstage.SupervisedRunner` is the ready-made one for ``model(input) -> output`` tasks.
    The loop's position and counters live in ``runner.loop`` (a :class:`~torchstage.runner.loop_state.LoopState`),
    each field also readable and writable as an attribute (``runner.epoch``, ``runner.batch_step``...); the library
    itself spells them ``runner.loop.<field>``.
    """

    #: Metric names this runner's handle_batch writes; ``None`` means unknown until the first loader.
    produces = None
    #: ``train()`` arguments this runner cannot run without (e.g. ``("criterion", "optimizer")``).
    requires = ()
    #: A method making the loss callback that ``evaluate_loader`` adds when there is a criterion (None: no loss).
    loss_callback = None
    #: The mapping type of ``epoch_metrics``: a dict assigned to it becomes one (a subclass may read keys otherwise).
    epoch_metrics_type = EpochMetrics

    def __init__(self, model=None, engine=None, device=None):
        if device is not None:
            if engine is not None:
                raise TypeError("give engine=... or device=..., not both")
            engine = Engine(device=device)
        self.model, self.engine = model, engine
        self.strategy = SingleDevice()  #: how the model trains (placement, the step, checkpoint state): the run's
        self.channel = AgreementChannel()  #: the run's agreement channel across ranks (distributed/agreement.py)
        self.loop = LoopState()
        self.spec = self.criterion = self.optimizer = self.scheduler = None
        self.valid_loader = self.valid_metric = self.minimize_valid_metric = None
        self.stage_loaders, self.stage_callbacks = [], []
        self.exception = self.requeued = None  #: what ended the run; whether SLURM requeued the job
        self.logdir_lock = None  #: the held lock of the logdir while a run writes it
        self.file_writer = None  #: the thread writing checkpoint files while a run goes on (a FileWriter)
        self.callbacks = {}
        self._handlers = {event: [] for event in EVENTS}
        #: what the callbacks of the chain offer one another (:mod:`torchstage.runner.shared`)
        self.shared = Shared()

    # ---- override points -----------------------------------------------------------------
    def handle_batch(self, batch) -> None:
        """One step on ``batch``: write outputs to ``self.batch`` and tensors to ``self.batch_metrics``."""
        raise NotImplementedError(f"{type(self).__name__} must override handle_batch(batch)")

    def autocast(self):
        """Context for forward and loss under ``train(amp=...)``; a shared no-op context without amp."""
        return self.precision.autocast()

    @property
    def precision(self) -> Precision:
        """The strategy's precision for this run: autocast dtype and grad scaler (full precision before a run)."""
        return self.strategy.precision

    @property
    def amp_dtype(self):
        """Autocast dtype of ``train(amp=...)``; None in full precision."""
        return self.precision.dtype

    @property
    def scaler(self):
        """The float16 grad scaler of ``train(amp="fp16")`` (None otherwise); the strategy applies it."""
        return self.precision.scaler

    @scaler.setter
    def scaler(self, scaler) -> None:
        precision = self.precision
        self.strategy.precision = Precision(precision.dtype, scaler, precision.device_type)

    def predict_batch(self, batch) -> dict:
        """The model outputs for one batch, for :meth:`predict_loader`; runs ``handle_batch`` by default."""
        self.handle_batch(batch)
        return self.loop.batch

    def predict_loader(self, loader, to_cpu: bool = False, *, model=None, resume=None):
        """Yield :meth:`predict_batch` for each batch of ``loader`` (eval mode, no grad; on CPU if ``to_cpu``);
        ``model=``/``resume=`` (a checkpoint path) set the model first."""
        if model is not None or resume is not None:
            inference.use_model(self, model, resume, "predict_loader")
        return inference.predict_loader(self, loader, to_cpu=to_cpu)

    def trace(self, *, model=None, batch=None, loader=None, logdir=None, backend: str = "jit", **options):
        """The model traced through :meth:`predict_batch` on ``batch`` (or ``loader``'s first): TorchScript, or
        ``backend="export"`` for ``torch.export``; saved under ``logdir/trace/`` (see ``runner/export.py``)."""
        return export.trace(self, model=model, batch=batch, loader=loader, logdir=logdir, backend=backend, **options)

    def infer(self, *, loaders, model=None, callbacks=None, resume=None, **unsupported) -> "Runner":
        """One pass of ``handle_batch`` and ``callbacks`` over inference ``loaders`` (eval mode, no grad)."""
        return inference.infer(self, model=model, loaders=loaders, callbacks=callbacks, resume=resume, **unsupported)

    def evaluate_loader(self, loader, callbacks=None, criterion=None, *, model=None, seed: int = None) -> dict:
        """The loader metrics of one pass over ``loader`` without training (loss with ``criterion`` or the runner's);
        ``model=`` replaces the runner's model first and ``seed=`` seeds the pass (both Catalyst 22's arguments)."""
        if model is not None:
            inference.use_model(self, model, None, "evaluate_loader")
        if seed is not None:
            set_seed(seed)
        return inference.evaluate_loader(self, loader, callbacks=callbacks, criterion=criterion)

    def get_default_callbacks(self, spec: TrainSpec) -> dict:
        """Name -> callback for the default chain (:mod:`torchstage.runner.defaults`); users replace one by name."""
        return default_callbacks(self, spec)

    def get_loggers(self) -> dict:
        """Name -> logger callback of this run, added to the default chain (the same names replace the default
        ``csv``, ``tensorboard``, ``console``): ``train(loggers=...)``; a subclass may override it (Catalyst 22)."""
        return dict(self.spec.loggers or {}) if self.spec is not None else {}

    def step_callbacks(self, spec: TrainSpec, optimizer_options: dict) -> dict:
        """Name -> callback of this runner's training step, added to the default chain; none by default (a
        custom handle_batch steps its own optimizers). ``optimizer_options`` are ``train()``'s
        ``accumulation_steps``/``grad_clip_norm``/``grad_clip_value``, for an :class:`OptimizerCallback`."""
        return {}

    # ---- entry point ---------------------------------------------------------------------
    @takes_arguments_of(train_signature)
    def train(self, **given) -> "Runner":
        """Check every argument (each error names it, before training), then run all stages. The arguments are
        declared once (:func:`~torchstage.runner.train_arguments.train_signature`, this signature); docs/api.md has a
        row per argument; each part of them is checked by its own module (:mod:`torchstage.runner.spec`).

        Data and stages: ``model`` (a module or a dict of them), ``criterion``, ``optimizer``, ``scheduler``,
        ``loaders`` (name -> iterable; ``train*`` loaders train) or ``datasets`` (built in each process),
        ``callbacks`` (list or name -> callback, added to the default chain), ``num_epochs``, ``valid_loader``,
        ``valid_metric`` and ``minimize_valid_metric`` (best checkpoint, early stopping), ``stages`` (name -> these
        keys, each stage inheriting the rest).

        Optimization: ``scheduler_step`` ("epoch" or "batch"), ``accumulation_steps``, ``grad_clip_norm``,
        ``grad_clip_value``, ``amp`` ("bf16", "fp16", "auto"...), ``compile`` (``torch.compile``, True or its
        arguments), ``channels_last``.

        Checkpoints and resume: ``logdir``, ``resume`` ("last", "auto" or a path), ``overwrite``, ``resume_lr``
        ("refuse", "new", "checkpoint"), ``checkpoint_period``, ``topk``, ``load_best_on_end``, ``requeue`` (SLURM).

        Run control: ``seed``, ``deterministic``, ``verbose``, ``check`` (a 2-batch smoke run), ``overfit``,
        ``timeit``, ``monitor``, ``valid_every``, ``valid_period``, ``log_period``, ``loggers``.

        Processes and strategy: ``distributed`` (None: join a launched world; True: also launch one),
        ``nprocs``, ``strategy`` ("ddp", "fsdp", "deepspeed" or a strategy object), ``engine``, ``prefetch``,
        ``hang_timeout``, ``max_restarts``, ``preflight`` (check every rank's speed before the first epoch).

        Large models: ``init_from`` (initial weights: a .pth, a checkpoint, a Hugging Face folder), ``init_weights``
        (``fn(module)`` for a model built on the meta device), ``activation_checkpointing`` (block classes),
        ``dry_run`` (print each rank's memory plan and return without training).

        ``**more``: other libraries' names for these (Catalyst's ``fp16=``, ``main_metric=``, ``ddp=``...), which
        the runner translates; any other name is refused, with the closest accepted one.

        The arguments arrive as given (one passed at its default value counts as given: ``train(main_metric="loss",
        valid_metric="loss")`` is refused as two names for one argument). A user error found before training reaches
        the user under their own call, without torchstage's frames
        (:func:`~torchstage.runner.errors.shorten_user_error`).
        """
        try:
            spec = make_spec(self, given)
            if spec.dry_run:  # the memory plan instead of a run
                return log_memory_plan(self, spec)
            return train_in_world(self, spec)
        except Exception as exc:
            if shorten_user_error(exc, self):  # the user's error, under the user's call
                raise exc
            raise

    def translate_train_kwargs(self, kwargs: dict) -> dict:
        """``train()``'s keyword arguments as torchstage names them (here: as given); a subclass may accept other
        spellings of train() arguments. ``make_spec`` calls it first, for ``train()`` and a config alike."""
        return kwargs

    def run(self) -> "Runner":
        """Run the prepared experiment; fires ``on_exception`` (then re-raises) if anything fails.

        With a logdir, the main rank holds its lock (one writer per logdir) from here until the run ends.
        """
        if self.spec is not None and self.spec.logdir is not None:
            self.logdir_lock = LogdirLock.on_main_rank(self.spec.logdir, self.engine, take=True)
        self.file_writer = FileWriter()
        try:
            self._run_event("experiment", self._run_stages, CancelRun)
            self.file_writer.close()  # a checkpoint that failed to land fails the run
        except BaseException as exc:
            self.exception = exc
            record_run_failure(self, exc)  # for a launcher of torchstage's and `torchstage diagnose`
            for handler in self._handlers["on_exception"]:
                try:
                    handler(self)
                except Exception:
                    logger.exception("callback failed while handling an exception")
            raise
        finally:
            self._close_file_writer()
            if self.logdir_lock is not None:
                self.logdir_lock.release()
                self.logdir_lock = None
        if self.loop.stop_request is not None:
            record_stop(self.engine.rank, self.loop.stop_request.reason, self.loop_position())  # not to be restarted
            raise RunStopped(self.loop.stop_request)  # a graceful stop: checkpoint written, exit code set
        return self

    def _close_file_writer(self) -> None:
        """After a failure too, the checkpoints already handed over land before the run lets go of the logdir."""
        writer, self.file_writer = self.file_writer, None
        try:
            writer.close()
        except Exception:
            logger.exception("a checkpoint write failed while the run was ending")

    # ---- the loop ------------------------------------------------------------------------
    def _run_event(self, level: str, body, cancel) -> None:
        try:
            self._fire(_START[level])
            body()
        except cancel:
            pass
        self._fire(_END[level])

    def _fire(self, event: str) -> None:
        for handler in self._handlers[event]:
            handler(self)

    def _run_stages(self) -> None:
        for index in range(self.loop.stage_index, len(self.spec.stage_specs)):
            if index != self.loop.stage_index:
                self.enter_stage(index)
            self._run_event("stage", self._run_epochs, CancelStage)

    def _run_epochs(self) -> None:
        for self.loop.epoch in range(self.loop.epoch + 1, self.loop.num_epochs + 1):
            self._run_event("epoch", self._run_loaders, CancelEpoch)

    def _run_loaders(self) -> None:
        for self.loop.loader_key, self.loop.loader in remaining_loaders(self):
            self.loop.is_train_loader = self.loop.loader_key.startswith("train")
            self._run_loader()

    def _run_loader(self) -> None:
        # A rollback ended the pass (RollBack, a CancelLoader): the keeper puts the run back to its snapshot of it
        # and the loader starts again from there, as a run resumed there would (runner/rollback.py).
        self._run_event("loader", self._run_batches, CancelLoader)
        while self.rollback is not None and self.rollback.restore(self):
            self.loop.loader = self.loop.loaders[self.loop.loader_key]
            self._run_event("loader", self._run_batches, CancelLoader)

    def _run_batches(self) -> None:
        # A rollback run's train pass leaves out the batches rolled back past: the loader's sampler asks for them
        # as each of its passes starts (runner/rollback.py).
        skips = self._pass_skips if self.loop.train_pass is not None else None
        engine, batches = self.engine, loader_batches(self, skips)
        if engine.prefetch:
            batches = prefetch_to_device(batches, engine)
        to_device = engine.to_device if engine.moves_batches else None
        # The hot path: _run_event inlined, handler lists and loop state read once per loader, not per batch.
        loop, handle_batch = self.loop, self.handle_batch
        starts, ends = self._handlers["on_batch_start"], self._handlers["on_batch_end"]
        if not loop.is_train_loader:  # without the callbacks whose batch events act on train loaders only
            starts, ends = ([h for h in handlers if not getattr(h.__self__, "train_batches_only", False)]
                            for handlers in (starts, ends))
        for loop.batch_step, batch in batches:
            loop.batch = to_device(batch) if to_device else batch
            try:
                for handler in starts:
                    handler(self)
                handle_batch(loop.batch)
            except CancelBatch:
                pass
            for handler in ends:
                handler(self)

    # ---- stages and the chain --------------------------------------------------------------
    def enter_stage(self, index: int) -> None:
        """Make stage ``index`` current: its optimizer, loaders, callbacks and epoch count."""
        stage = self.spec.stage_specs[index]
        self.loop.stage_index, self.loop.stage_key, self.loop.epoch = index, stage.name, 0
        self.loop.num_epochs = stage.num_epochs
        self.criterion, self.optimizer, self.scheduler = stage.criterion, stage.optimizer, stage.scheduler
        self.valid_loader, self.valid_metric = stage.valid_loader, stage.valid_metric
        self.minimize_valid_metric = stage.minimize_valid_metric
        self.loop.loaders = self.stage_loaders[index]
        self.set_callbacks(self.stage_callbacks[index])

    def set_callbacks(self, callbacks: dict) -> None:
        """Install an ordered name -> callback chain: index its handlers per event, and take what its callbacks
        offer one another (``runner.shared``)."""
        self.callbacks = callbacks
        active = [cb for cb in callbacks.values() if CallbackScope(cb.scope).runs_on(self.engine)]
        self._handlers = self.chain_handlers(active)
        self.shared = share(active)

    def chain_handlers(self, active: list) -> dict:
        """Event -> the methods that handle it, in chain order: those of the ``active`` callbacks that override it
        (a subclass may add its own methods to them)."""
        return {event: [getattr(cb, event) for cb in active if cb.handles(event)] for event in EVENTS}

    def state_dict(self) -> dict:
        """The whole run as a checkpoint dict (models, optimizers, loop position, RNG...)."""
        return runner_state_dict(self)

    def load_state_dict(self, checkpoint: dict, weights_only: bool = False) -> None:
        """Restore a checkpoint: weights always; optimizers, loop position and RNG unless weights_only."""
        load_runner_state_dict(self, checkpoint, weights_only=weights_only)

    def save_checkpoint(self, paths: list, before_last=None, last_good: str = "the last checkpoint") -> bool:
        """Write the run's state to ``paths`` once the checks registered with the save let it (False: nothing
        written); collective (see :mod:`torchstage.runner.saving`)."""
        return saving.save_checkpoint(self, paths, before_last, last_good)

    def save_last(self) -> list:
        """Every checkpoint writer of the chain writes ``last.pth`` now (a graceful stop); collective; the paths."""
        return saving.save_last(self)

    def _pass_skips(self):
        """The batches the train pass starting now leaves out (a rollback run's), or None."""
        train_pass = self.loop.train_pass
        return None if train_pass is None else train_pass.skips

    def take_snapshot(self, at_start: bool, leave_out=(), reuse: Snapshot = None) -> Snapshot:
        """This rank's run now, copied in memory, for a rollback (see :mod:`torchstage.runner.snapshot`)."""
        return take_snapshot(self, at_start, leave_out, reuse)

    def restore_snapshot(self, snapshot: Snapshot) -> None:
        """Put a snapshot back; the loader it was taken in goes on from its point when it starts again."""
        restore_snapshot(self, snapshot)

    def loop_position(self) -> dict:
        """Where the run stands: stage, completed epochs, batches done in this epoch, global counters."""
        return self.loop.position()

    @property
    def rollback(self):
        """The run's rollback keeper (:mod:`torchstage.runner.rollback`) where the chain may roll back, else None."""
        return self.shared.rollback

    @property
    def unwrapped_model(self):
        """The model (or dict of models) without DDP/compile wrappers."""
        return map_named(self.strategy.unwrap, self.model)


_START = {level: f"on_{level}_start" for level in ("experiment", "stage", "epoch", "loader", "batch")}
_END = {level: f"on_{level}_end" for level in _START}
