"""The default callback chain of every run and of every pass that trains nothing (``evaluate_loader``, ``infer``),
decided here and nowhere else.

Each callback checks its own arguments in its constructor; a ``train()`` argument that configures one is
passed to it, and a malformed value is reported under the name given to ``train()`` (:func:`named_as`).
A runner adds the callbacks of its training step through one hook, :meth:`Runner.step_callbacks`
(SupervisedRunner: the loss and the optimizer step). Users replace a default by giving its name.
"""
from collections.abc import Mapping

from torchstage.arguments import named_as
from torchstage.callbacks.base import Callback
from torchstage.callbacks.metrics.averaging import MetricsAveragingCallback
from torchstage.callbacks.checkpoints.checkpoint_saver import CheckpointCallback
from torchstage.callbacks.checkpoints.config_saver import ConfigSaver
from torchstage.callbacks.loggers.console import ConsoleLogger
from torchstage.callbacks.loggers.csv_logger import CSVLogger
from torchstage.callbacks.control.debug import CheckRunCallback, LimitBatchesCallback
from torchstage.callbacks.checkpoints.loader_state import LoaderStateCallback, is_stateful_loader
from torchstage.callbacks.safety.even_batches import EvenBatchesCallback
from torchstage.callbacks.training.loop import LoopCallback
from torchstage.callbacks.control.periodic_validation import PeriodicValidationCallback
from torchstage.callbacks.monitoring.model_summary import ModelSummary
from torchstage.callbacks.monitoring.monitor import ThroughputMonitor
from torchstage.callbacks.monitoring.stragglers import StragglerDetector
from torchstage.callbacks.training.nonfinite import NonFiniteLossCallback
from torchstage.callbacks.loggers.progress import ProgressBar
from torchstage.callbacks.safety.requeue import RequeueCallback
from torchstage.callbacks.training.scheduler import SchedulerCallback
from torchstage.callbacks.safety.stop import StopCallback
from torchstage.callbacks.safety.unstepped import UnsteppedOptimizerCheck
from torchstage.callbacks.loggers.tensorboard import TensorBoardLogger
from torchstage.callbacks.monitoring.timer import TimerCallback
from torchstage.callbacks.control.validation import ValidEveryCallback
from torchstage.callbacks.safety.watchdog import HangWatchdog
from torchstage.launch.slurm.requeue import slurm_job_id
from torchstage.one_or_many import named
from torchstage.periods import Epoch
from torchstage.runner.chain import merge_chain
from torchstage.runner.rollback import RollbackCallback
from torchstage.runner.shared import share

#: ``check=True``: batches per loader and epochs per stage of a smoke run.
CHECK_BATCHES, CHECK_EPOCHS = 2, 2
#: ``train()`` arguments that configure the default :class:`OptimizerCallback`, with their defaults.
OPTIMIZER_ARGS = {"accumulation_steps": 1, "grad_clip_norm": None, "grad_clip_value": None}


def stage_chains(runner, spec) -> list:
    """Each stage's chain: the defaults, the loggers (``runner.get_loggers()``: ``train(loggers=...)``), then
    ``train(callbacks=...)``, then the stage's own, by name; and the runner's rollback keeper where a callback may
    roll the run back."""
    defaults = runner.get_default_callbacks(spec)
    loggers = runner_loggers(runner, spec)
    keeper = RollbackCallback()  # one for the run: its skip list and count span the stages
    chains = [with_rollback(merge_chain(defaults, loggers, spec.callbacks,
                                        stage.callbacks if stage.callbacks is not spec.callbacks else None), keeper)
              for stage in spec.stage_specs]
    _check_optimizer_args(spec, defaults, chains)
    return [with_step_check(chain, stage) for stage, chain in zip(spec.stage_specs, chains)]


def with_step_check(chain: dict, stage) -> dict:
    """``chain`` with ``step_check`` for the stage's optimizers that none of its callbacks declares to step (a custom
    handle_batch must step them): one never stepped in the first train loader ends the run, naming the fix."""
    plans = [plan for callback in chain.values() for plan in callback.step_plans(stage)]
    if not stage.optimizer or any(plan.optimizer is None for plan in plans) or "step_check" in chain:
        return chain
    stepped = {id(plan.optimizer) for plan in plans}
    names = [name for name, optimizer in named(stage.optimizer, "optimizer").items() if id(optimizer) not in stepped]
    return merge_chain(chain, {"step_check": UnsteppedOptimizerCheck(names)}) if names else chain


def with_rollback(chain: dict, keeper: RollbackCallback) -> dict:
    """``chain`` with the run's rollback keeper (``rollback``: it takes the snapshots and puts them back, after every
    other callback) when one of its callbacks may roll the run back (``Shared.allow_rollbacks``:
    ``NonFiniteLossCallback(mode="rollback")``), unless the chain names one itself."""
    if "rollback" in chain or not share(chain.values()).rolls_back:
        return chain
    return merge_chain(chain, {"rollback": keeper})


def runner_loggers(runner, spec) -> dict:
    """``runner.get_loggers()`` for the run of ``spec`` (the runner's hook sees ``runner.spec``); each a Callback."""
    saved, runner.spec = runner.spec, spec
    try:
        loggers = runner.get_loggers()
    finally:
        runner.spec = saved
    if not isinstance(loggers, Mapping):
        raise TypeError(f"{type(runner).__name__}.get_loggers() must return a dict name -> logger callback, "
                        f"got {type(loggers).__name__}")
    for name, logger in loggers.items():
        if not isinstance(logger, Callback):
            raise TypeError(f"loggers[{name!r}] must be a torchstage logger callback (CSVLogger, TensorBoardLogger, "
                            f"MLflowLogger, ConsoleLogger...), got {type(logger).__name__}")
    return dict(loggers)


def default_callbacks(runner, spec=None, *, evaluate: bool = False) -> dict:
    """Name -> callback of the default chain: bookkeeping first, always.

    Of a training run for ``spec``: the hang watchdog and the even-batches check (both act under several
    processes only), non-finite loss detection, the runner's step, metric averaging, scheduler (if any),
    checkpoints and logs (with a logdir), the feature switches (valid_every, valid_period, check, overfit,
    timeit, monitor), console, graceful stop, SLURM requeue (inside a SLURM job), the straggler detector (under
    several processes only), model summary, progress (verbose), the config copy (config runs). Of a pass that trains nothing (no ``spec``): bookkeeping only
    (``infer``), and with ``evaluate`` metric averaging and the runner's loss (when it has a criterion).
    """
    if spec is None:
        return _pass_chain(runner, evaluate)
    with named_as(mode="scheduler_step"):
        scheduler = SchedulerCallback(mode=spec.scheduler_step)
    with named_as(period="checkpoint_period"):
        checkpoint = CheckpointCallback(period=Epoch(1) if spec.checkpoint_period is None else spec.checkpoint_period,
                                        topk=spec.topk,
                                        load_best_on_end=spec.load_best_on_end)
    csv, tensorboard = CSVLogger(log_period=spec.log_period or ()), TensorBoardLogger(log_period=spec.log_period or ())
    with named_as(every="valid_every"):
        valid_every = ValidEveryCallback(spec.valid_every)
    with named_as(timeout="hang_timeout"):
        watchdog = HangWatchdog(spec.hang_timeout)
    chain = {"loop": LoopCallback(), "watchdog": watchdog, "even_batches": EvenBatchesCallback(),
             "nonfinite": NonFiniteLossCallback(), "averaging": MetricsAveragingCallback()}
    if any(is_stateful_loader(loader) for stage in spec.stage_specs for loader in (stage.loaders or {}).values()):
        chain["loader_state"] = LoaderStateCallback()
    if any(stage.scheduler is not None for stage in spec.stage_specs):
        chain["scheduler"] = scheduler
    if spec.logdir is not None:
        chain.update(checkpoint=checkpoint, csv=csv, tensorboard=tensorboard)
    if valid_every.every > 1:
        chain["valid_every"] = valid_every
    if spec.valid_period is not None:
        with named_as(period="valid_period"):
            chain["periodic_validation"] = PeriodicValidationCallback(spec.valid_period)
    if spec.check:
        chain["check"] = CheckRunCallback(num_epochs=CHECK_EPOCHS)
        chain["limit_batches"] = LimitBatchesCallback(CHECK_BATCHES)
    if spec.overfit is not False:
        chain["limit_batches"] = LimitBatchesCallback.for_overfit(spec.overfit)
    if spec.timeit:
        chain["timer"] = TimerCallback()
    if spec.monitor:
        chain["monitor"] = ThroughputMonitor()
    chain["console"] = ConsoleLogger()
    chain["stop"] = StopCallback()
    if spec.requeue is not False and slurm_job_id() is not None:
        chain["requeue"] = RequeueCallback(required=spec.requeue is True)
    chain["stragglers"] = StragglerDetector()
    if spec.verbose or spec.logdir is not None:
        chain["model_summary"] = ModelSummary(verbose=spec.verbose)
    if spec.verbose:
        chain["progress"] = ProgressBar()
    chain.update(runner.step_callbacks(spec, {name: getattr(spec, name) for name in OPTIMIZER_ARGS}))
    if spec.config_text is not None and spec.logdir is not None:
        chain["config"] = ConfigSaver(spec.config_text)
    return chain


def _pass_chain(runner, evaluate: bool) -> dict:
    chain = {"loop": LoopCallback()}
    if evaluate:
        chain["averaging"] = MetricsAveragingCallback()
        if runner.loss_callback is not None and runner.criterion is not None:
            chain["criterion"] = runner.loss_callback()
    return chain


def _check_optimizer_args(spec, defaults: dict, chains: list) -> None:
    """``train()``'s optimizer arguments configure the default OptimizerCallback, never a user's one."""
    given = {name: getattr(spec, name) for name, default in OPTIMIZER_ARGS.items() if getattr(spec, name) != default}
    if not given:
        return
    text = ", ".join(f"{name}={value!r}" for name, value in given.items())
    for stage, chain in zip(spec.stage_specs, chains):
        mine = {key: cb for key, cb in chain.items() if cb.step_plans(stage)}  # the callbacks that step optimizers
        for key, callback in mine.items():
            if defaults.get(key) is not callback:
                kind = type(callback).__name__
                raise ValueError(f"{text} was given to train() but the {kind} in callbacks[{key!r}] has "
                                 f"its own arguments; set them in one place: on {kind}(...) or in train()")
        if not mine:
            raise ValueError(f"{text} is applied by an OptimizerCallback, and this run's callbacks have none (a "
                             f"custom handle_batch steps its own optimizers); pass callbacks=[OptimizerCallback"
                             f"({text})] instead, or apply it in handle_batch")
