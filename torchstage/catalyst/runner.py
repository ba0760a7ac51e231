"""Catalyst 20.12 on the runner: its attribute names, its ``_handle_batch(batch)`` override point, its flat epoch
metric keys and its ``train()`` argument names (``fp16``, ``main_metric``...), each mapped to torchstage's with a
one-time note; also Catalyst 22's attribute names (``epoch_step``, ``sample_step``, ``loader_batch_len``).
"""
from torchstage.logging_setup import note_alias
from torchstage.runner.loop_state import EpochMetrics
from torchstage.distributed.engine import Engine
from torchstage.strategies.precision import FP16_OR_FULL

#: train() arguments Catalyst 20.12 spelled differently -> torchstage's name.
TRAIN_RENAMED = {"main_metric": "valid_metric", "minimize_metric": "minimize_valid_metric", "initial_seed": "seed",
                 "fp16": "amp"}
#: train() arguments of Catalyst 20.12 with no torchstage meaning -> why, and what to do instead.
TRAIN_GONE = {
    "stage_kwargs": "set per-stage settings with stages={'name': {...}}",
    "state_kwargs": "set per-stage settings with stages={'name': {...}}",
    "checkpoint_data": "checkpoints hold tensors and plain values only; save extra data next to them in logdir",
}
#: train() arguments of Catalyst 22 with no torchstage meaning -> why, and what to do instead.
TRAIN_GONE_22 = {
    "hparams": "torchstage logs the run's own settings (logs/hparams.json and each logger); log more with a "
               "logger callback's log_hparams",
    "profile": "add callbacks=[ProfilerCallback(...)] (see docs/observability.md)",
}
_APEX = ("apex was removed from torchstage: native autocast replaces opt_level 'O1'; 'O2'/'O3' (fp16 master "
         "weights, a half-precision model) have no equivalent. Pass fp16=True or amp='fp16'/'bf16'")


def translate_train_kwargs(kwargs: dict) -> dict:
    """``train()`` keyword arguments with Catalyst 20.12's and 22's names replaced by torchstage's (each noted
    once); ``engine=`` and ``loggers=``, Catalyst 22's ways to give a run's parts, are noted."""
    if any(name in kwargs for name in (*TRAIN_RENAMED, *TRAIN_GONE, *TRAIN_GONE_22, "ddp", "cpu")):
        kwargs = _translated(dict(kwargs))
    if kwargs.get("engine") is not None:
        note_alias("train(engine=...)", "Runner(engine=...) or train(strategy=...)", version="22")
    if kwargs.get("loggers") is not None:
        note_alias("train(loggers={...})", "train(callbacks={...}) with logger callbacks", version="22")
    return kwargs


def _translated(kwargs: dict) -> dict:
    """``kwargs`` (a copy) with Catalyst 20.12's names replaced, Catalyst 22's switches translated."""
    _translate_22(kwargs)
    for old, why in TRAIN_GONE.items():
        if old in kwargs:
            raise TypeError(f"train({old}=...) is Catalyst 20.12's and has no torchstage meaning: {why}")
    for old, new in TRAIN_RENAMED.items():
        if old not in kwargs:
            continue
        if new in kwargs:
            raise TypeError(f"train() got both {old}= (Catalyst 20.12's name) and {new}=; give only {new}=")
        value = kwargs.pop(old)
        note_alias(f"train({old}=...)", f"train({new}=...)" if old != "fp16" else
                   "train(amp='fp16-or-full'|'fp16'|'bf16'|'auto')")
        kwargs[new] = fp16_to_amp(value) if old == "fp16" else value
    return kwargs


def _translate_22(kwargs: dict) -> None:
    """Catalyst 22's ``train(ddp=True)`` is ``distributed=True``; ``cpu=True`` is ``engine=Engine(device="cpu")``."""
    for old, why in TRAIN_GONE_22.items():
        if old in kwargs:
            raise TypeError(f"train({old}=...) is Catalyst 22's and has no torchstage meaning: {why}")
    if "ddp" in kwargs:
        if "distributed" in kwargs:
            raise TypeError("train() got both ddp= (Catalyst 22's name) and distributed=; give only distributed=")
        note_alias("train(ddp=...)", "train(distributed=...)", version="22")
        kwargs["distributed"] = True if kwargs.pop("ddp") else None
    if "cpu" in kwargs:
        if kwargs.pop("cpu"):
            if kwargs.get("engine") is not None:
                raise TypeError("train() got both cpu=True (Catalyst 22's) and engine=; give only engine=")
            note_alias("train(cpu=True)", "train(engine=Engine(device='cpu'))", version="22")
            kwargs["engine"] = Engine(device="cpu")


def fp16_to_amp(fp16):
    """The ``amp=`` value for Catalyst's ``fp16=``: ``True``/``{"amp": True}``/``{"opt_level": "O1"}`` give
    ``"fp16-or-full"`` (fp16 on CUDA; elsewhere full precision, as Catalyst 20.12 and 22 trained there, logged);
    ``False``/``None``/``{}``/``"O0"`` full precision."""
    if fp16 is None or fp16 is False:
        return None
    if fp16 is True:
        return FP16_OR_FULL
    if not isinstance(fp16, dict):
        raise TypeError(f"fp16 must be True, False or a dict such as {{'amp': True}}, got {fp16!r}")
    unknown = sorted(set(fp16) - {"amp", "apex", "opt_level"})
    if unknown:
        raise ValueError(f"fp16={fp16!r}: keys {unknown} are apex settings; {_APEX}")
    level = fp16.get("opt_level", "O1" if fp16.get("apex") else None)
    if level is not None:
        if level not in ("O0", "O1"):
            raise ValueError(f"fp16={fp16!r}: opt_level {level!r}: {_APEX}")
        return FP16_OR_FULL if level == "O1" else None
    return FP16_OR_FULL if fp16.get("amp") else None


def flat_epoch_metric(metrics: dict, key):
    """``metrics["train_loss"]``, Catalyst 20.12's flat key, read as ``metrics["train"]["loss"]`` (noted once);
    KeyError where no loader and metric make ``key``. The lookup behind a missing key of the loop's epoch metrics."""
    if isinstance(key, str):
        for loader, values in metrics.items():
            if isinstance(values, dict) and key.startswith(f"{loader}_") and key[len(loader) + 1:] in values:
                note_alias("runner.epoch_metrics['<loader>_<metric>']", "runner.epoch_metrics['<loader>']['<metric>']")
                return values[key[len(loader) + 1:]]
    raise KeyError(key)


class FlatEpochMetrics(EpochMetrics):
    """The loop's epoch metrics, a key they lack read as Catalyst 20.12's flat view of them (``["train_loss"]`` is
    ``["train"]["loss"]``)."""

    def __missing__(self, key):
        return flat_epoch_metric(self, key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default


class _Alias:
    """A Catalyst 20.12 runner attribute: reads torchstage's value (noting its name once); assignable."""

    def __init__(self, preferred: str, read, version: str = "20.12"):
        self.preferred, self.read, self.version = preferred, read, version

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, runner, owner=None):
        if runner is None:
            return self
        if self.name in runner.__dict__:
            return runner.__dict__[self.name]
        note_alias(f"runner.{self.name}", self.preferred, self.version)
        return self.read(runner)

    def __set__(self, runner, value):
        runner.__dict__[self.name] = value


def _engine(runner):
    if runner.engine is None:
        runner.engine = Engine()
    return runner.engine


def _early_stop(runner, value):
    raise AttributeError("runner.need_early_stop is Catalyst 20.12's stop flag; torchstage callbacks raise "
                         "torchstage.CancelLoader() (end this loader), CancelStage() or CancelRun() instead")


class CatalystAttributes:
    """Catalyst 20.12 on a runner class, its one hook: the attribute names, each reading the torchstage attribute
    it names, and a ``_handle_batch(batch)`` override adopted as ``handle_batch``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        adopt_catalyst_handle_batch(cls)
    input = _Alias("runner.batch", lambda r: r.loop.batch)
    output = _Alias("runner.batch", lambda r: r.loop.batch)
    batch_in = _Alias("runner.batch", lambda r: r.input)
    batch_out = _Alias("runner.batch", lambda r: r.output)
    device = _Alias("runner.engine.device", lambda r: _engine(r).device)
    global_epoch = _Alias("runner.global_epoch_step", lambda r: r.loop.global_epoch_step)
    loader_name = _Alias("runner.loader_key", lambda r: r.loop.loader_key)
    loader_batch_step = _Alias("runner.batch_step (counted from 1)", lambda r: r.loop.batch_step - 1)
    loader_len = _Alias("len(runner.loader)", lambda r: len(r.loop.loader))
    stage = _Alias("runner.stage_key", lambda r: r.loop.stage_key)
    stage_name = _Alias("runner.stage_key", lambda r: r.loop.stage_key)
    is_valid_loader = _Alias("runner.loader_key.startswith('valid')", lambda r: r.loop.loader_key.startswith("valid"))
    is_infer_loader = _Alias("runner.loader_key.startswith('infer')", lambda r: r.loop.loader_key.startswith("infer"))
    valid_metrics = _Alias("runner.epoch_metrics[runner.valid_loader]",
                           lambda r: r.loop.epoch_metrics.get(r.valid_loader, {}))
    main_metric = _Alias("runner.valid_metric", lambda r: r.valid_metric)
    minimize_metric = _Alias("runner.minimize_valid_metric", lambda r: r.minimize_valid_metric)
    distributed_rank = _Alias("runner.engine.rank", lambda r: _engine(r).rank)
    is_distributed_master = _Alias("runner.engine.is_main", lambda r: _engine(r).is_main)
    is_distributed_worker = _Alias("not runner.engine.is_main", lambda r: not _engine(r).is_main)
    is_check_run = _Alias("runner.spec.check", lambda r: r.spec.check)
    state = _Alias("runner", lambda r: r)
    # Catalyst 22's names (runner.batch_step keeps torchstage's meaning, the batch within the loader, except on
    # dl.IRunner: see catalyst/irunner.py)
    epoch_step = _Alias("runner.global_epoch_step", lambda r: r.loop.global_epoch_step, version="22")
    sample_step = _Alias("runner.loop.run_sample_step (every loader's samples so far)",
                         lambda r: r.loop.run_sample_step, version="22")
    loader_batch_len = _Alias("len(runner.loader)", lambda r: len(r.loop.loader), version="22")
    need_early_stop = property(lambda r: False, _early_stop)


#: Catalyst 22's ``dl.Runner`` read a run's parts from these methods, which ``train()`` filled; torchstage's
#: ``train()`` takes the parts as arguments and only ``dl.IRunner`` calls them.
CATALYST_GETTERS = ("get_engine", "get_loaders", "get_model", "get_criterion", "get_optimizer", "get_scheduler",
                    "get_callbacks")


def refuse_ignored_getters(runner) -> None:
    """A ``train()`` call on a runner class overriding Catalyst 22's ``get_*`` methods (which ``train()`` would not
    call) is refused, naming them; ``dl.IRunner`` subclasses call them from ``run()``."""
    if getattr(runner, "catalyst22_batch_step", False):  # a dl.IRunner
        return
    cls = type(runner)
    found = [name for name in CATALYST_GETTERS if any(name in klass.__dict__ for klass in cls.__mro__[:-1])]
    if found:
        raise TypeError(f"{cls.__name__} overrides {', '.join(found)}, which Catalyst 22's dl.Runner.train() read "
                        f"its parts from; torchstage's train() takes them as arguments and would ignore these. "
                        f"Pass them to train(...), or derive from dl.IRunner and start with runner.run()")


def catalyst_target_key(target_key: str, input_target_key: str) -> str:
    """``SupervisedRunner(input_target_key=...)``, Catalyst 20.12's name for ``target_key``."""
    if target_key != "targets":
        raise TypeError("give target_key=... or Catalyst 20.12's input_target_key=..., not both")
    note_alias("SupervisedRunner(input_target_key=...)", "SupervisedRunner(target_key=...)")
    return input_target_key


def adopt_catalyst_handle_batch(cls) -> None:
    """A runner class defining Catalyst 20.12's ``_handle_batch(batch)`` gets a ``handle_batch`` that calls it."""
    if "_handle_batch" not in cls.__dict__:
        return
    if "handle_batch" in cls.__dict__:
        raise TypeError(f"{cls.__name__} defines both handle_batch (torchstage) and _handle_batch (Catalyst 20.12); "
                        f"keep one")
    cls.handle_batch = _catalyst_handle_batch


def _catalyst_handle_batch(self, batch) -> None:
    """Catalyst 20.12's step: ``self.input`` is the batch, ``self._handle_batch(batch)`` fills ``self.output``;
    ``self.batch`` becomes both merged, so torchstage's callbacks read them too."""
    note_alias(f"{type(self).__name__}._handle_batch(batch) with self.input/self.output",
               "handle_batch(batch) writing self.batch")
    as_dict = getattr(self, "_as_dict", None)  # SupervisedRunner: (x, y) -> {input_key: x, target_key: y}, as 20.12
    if as_dict is not None:
        batch = as_dict(batch)
    self.input, self.output = batch, {}
    self._handle_batch(batch)
    inputs, output = self.input, self.output  # the step may have replaced either
    if isinstance(output, dict) and output:
        self.loop.batch = {**inputs, **output} if isinstance(inputs, dict) else dict(output)
    else:
        self.loop.batch = inputs

