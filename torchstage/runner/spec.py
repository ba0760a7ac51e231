"""The arguments of ``Runner.train`` as a checked spec: every user error is raised here, before training."""
import dataclasses
import difflib
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from torchstage.callbacks.base import Callback
from torchstage.catalyst.engines import check_engine_and_loggers
from torchstage.catalyst.runner import translate_train_kwargs
from torchstage.launch.restarts import check_max_restarts
from torchstage.launch.slurm.requeue import check_requeue_arg
from torchstage.strategies.resolve import resolve_strategy
from torchstage.runner.component_checks import check_components, check_logdir, check_resume
from torchstage.data.datasets import dataset_loader_names
from torchstage.runner.defaults import stage_chains
from torchstage.runner.features import check_switches
from torchstage.runner.resume import resume_of_this_attempt
from torchstage.runner.errors import RunnerException


@dataclass
class StageSpec:
    """One stage: its epochs, data, criterion, optimizer, scheduler and extra callbacks."""

    name: str
    num_epochs: int
    loaders: Optional[Mapping] = None
    datasets: Optional[dict] = None
    criterion: Any = None
    optimizer: Any = None
    scheduler: Any = None
    callbacks: Any = None
    valid_loader: str = "valid"
    valid_metric: str = "loss"
    minimize_valid_metric: bool = True


#: ``check=True`` with a logdir writes to ``logdir/check``, so the real run on that logdir starts clean.
CHECK_FOLDER = "check"
#: What a stage may set (each inherited from the top-level train() arguments when omitted).
STAGE_KEYS = tuple(f.name for f in dataclasses.fields(StageSpec) if f.name != "name")


@dataclass
class TrainSpec:
    """Everything ``train(...)`` accepts. Stage-level keys given at the top are inherited by all stages."""

    model: Any = None
    criterion: Any = None
    optimizer: Any = None
    scheduler: Any = None
    loaders: Optional[Mapping] = None
    datasets: Optional[dict] = None
    callbacks: Any = None
    logdir: Optional[str] = None
    num_epochs: int = 1
    valid_loader: str = "valid"
    valid_metric: str = "loss"
    minimize_valid_metric: bool = True
    verbose: bool = False
    seed: int = 42
    deterministic: bool = False
    stages: Optional[Mapping] = None
    resume: Optional[str] = None
    overwrite: bool = False
    scheduler_step: str = "epoch"
    distributed: Optional[bool] = None
    nprocs: Optional[int] = None
    strategy: Any = "ddp"  # a name or a strategy object; a strategy object once checked
    amp: Any = None
    accumulation_steps: int = 1
    grad_clip_norm: Optional[float] = None
    grad_clip_value: Optional[float] = None
    compile: Any = False
    check: bool = False
    overfit: Any = False
    timeit: bool = False
    monitor: bool = False
    valid_every: int = 1
    valid_period: Any = None
    log_period: Any = None
    channels_last: bool = False
    prefetch: bool = False
    checkpoint_period: Any = None
    topk: int = 0
    load_best_on_end: bool = False
    requeue: Optional[bool] = None
    resume_lr: str = "refuse"
    hang_timeout: Optional[float] = 300
    max_restarts: Optional[int] = None  # None: $TORCHSTAGE_MAX_RESTARTS, else 0
    engine: Any = None  # an Engine (Catalyst 22's train(engine=dl.CPUEngine())); None: the runner's or the default
    loggers: Optional[Mapping] = None  # name -> logger callback, added to the chain (Catalyst 22's train(loggers=))
    stage_specs: list = field(default_factory=list, init=False, repr=False)
    #: Each stage's callback chain (:func:`~torchstage.runner.defaults.stage_chains`), built by make_spec.
    stage_chains: list = field(default_factory=list, init=False, repr=False)
    #: The YAML of a config run, saved to ``logdir/config.yml`` by the default chain.
    config_text: Optional[str] = field(default=None, init=False, repr=False)


def train_arguments() -> list:
    """The names ``train()`` accepts, in signature order."""
    return [f.name for f in dataclasses.fields(TrainSpec) if f.init]


def make_spec(runner, kwargs: dict, config_text: str = None) -> TrainSpec:
    """Validate ``train`` keyword arguments, resolve stages and build their callback chains (which check the
    arguments they are given); raise ValueError/TypeError naming the argument. The one way from ``train()``'s
    arguments, or a config's, to a run: Catalyst 20.12's argument names (``fp16``...) are translated here."""
    kwargs = translate_train_kwargs(kwargs)
    names = train_arguments()
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        close = {name: difflib.get_close_matches(name, names, n=1) for name in unknown}
        hint = "".join(f"; did you mean {c[0]!r} for {name!r}?" for name, c in close.items() if c)
        raise TypeError(f"train() got unknown argument(s) {unknown}; accepted: {', '.join(names)}{hint}")
    spec = TrainSpec(**kwargs)
    _check_model(spec.model)
    _check_type("seed", spec.seed, int)
    if spec.logdir is not None and not isinstance(spec.logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a path (str or os.PathLike), got {type(spec.logdir).__name__}")
    check_logdir(spec.logdir)
    if spec.distributed not in (None, True, False):
        raise TypeError(f"distributed must be None (join a torchrun/SLURM world if started in one), True "
                        f"(also launch one process per device) or False (one process), got {spec.distributed!r}")
    spec.strategy = resolve_strategy(spec.strategy)
    check_engine_and_loggers(spec.engine, spec.loggers, spec.distributed)
    spec.max_restarts = check_max_restarts(spec.max_restarts)
    check_switches(spec)
    if spec.check and spec.logdir is not None:  # a smoke run writes to a scratch folder, never the real run's
        spec.logdir, spec.overwrite = os.path.join(os.fspath(spec.logdir), CHECK_FOLDER), True
    if spec.resume_lr not in ("refuse", "new", "checkpoint"):
        raise ValueError(f"resume_lr must be 'refuse' (a learning rate that differs from the checkpoint's fails), "
                         f"'new' (use the one given now) or 'checkpoint' (keep the saved one), got {spec.resume_lr!r}")
    check_requeue_arg(spec.requeue, spec.resume)
    spec.resume = resume_of_this_attempt(spec.resume, spec.requeue)
    check_resume(spec.resume, spec.logdir)
    spec.stage_specs = _resolve_stages(spec)
    for stage in spec.stage_specs:
        _check_stage(runner, stage, spec.strategy)
        check_components(stage, spec.model, spec.scheduler_step)
    spec.config_text = config_text
    spec.stage_chains = stage_chains(runner, spec)
    return spec


def _resolve_stages(spec: TrainSpec) -> list:
    top = {key: getattr(spec, key) for key in STAGE_KEYS}
    if spec.stages is None:
        return [StageSpec(name="main", **top)]
    if not isinstance(spec.stages, Mapping) or not spec.stages:
        raise TypeError(f"stages must be a non-empty mapping {{name: {{num_epochs, loaders, ...}}}}, "
                        f"got {type(spec.stages).__name__}")
    stages = []
    for name, overrides in spec.stages.items():
        if not isinstance(overrides, Mapping):
            raise TypeError(f"stages[{name!r}] must be a mapping of stage settings, got {type(overrides).__name__}")
        unknown = sorted(set(overrides) - set(STAGE_KEYS))
        if unknown:
            raise ValueError(f"stages[{name!r}] has unknown key(s) {unknown}; accepted: {', '.join(STAGE_KEYS)}")
        values = {**top, **overrides}
        if "loaders" in overrides:
            values["datasets"] = overrides.get("datasets")
        if "datasets" in overrides:
            values["loaders"] = overrides.get("loaders")
        stages.append(StageSpec(name=str(name), **values))
    return stages


def _check_stage(runner, stage: StageSpec, strategy) -> None:
    where = "num_epochs" if stage.name == "main" else f"stages[{stage.name!r}]['num_epochs']"
    if isinstance(stage.num_epochs, bool) or not isinstance(stage.num_epochs, int) or stage.num_epochs < 1:
        raise ValueError(f"{where} must be an integer >= 1, got {stage.num_epochs!r}")
    prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
    if stage.loaders is not None and stage.datasets is not None:
        raise ValueError(f"{prefix}give either loaders or datasets, not both")
    if stage.loaders is None and stage.datasets is None:
        raise ValueError(f"{prefix}loaders is required: a mapping such as {{'train': DataLoader, 'valid': "
                         f"DataLoader}} (or pass datasets={{'batch_size': .., 'train': .., 'valid': ..}})")
    if stage.loaders is not None:
        names = _check_loaders(stage.loaders, prefix)
    else:
        names = dataset_loader_names(stage.datasets, prefix)
    if names is not None:  # None: a get_datasets_fn, checked once it has run (still before training)
        check_loader_names(stage, names)
    trains = names is None or any(str(name).startswith("train") for name in names)
    if runner.requires and trains:  # a stage of evaluation loaders only needs no optimizer (as in Catalyst 22)
        for name in runner.requires:
            if getattr(stage, name) is None and not (name == "optimizer" and strategy.supplies_optimizer):
                raise ValueError(f"{prefix}{type(runner).__name__} needs {name}=...; got {name}=None (a stage "
                                 f"whose loaders are all evaluation loaders, not 'train*', needs none)")
    if stage.callbacks is not None and not isinstance(stage.callbacks, (list, tuple, Mapping)):
        raise TypeError(f"{prefix}callbacks must be a list or a dict name -> Callback, "
                        f"got {type(stage.callbacks).__name__}")
    items = stage.callbacks.items() if isinstance(stage.callbacks, Mapping) else enumerate(stage.callbacks or ())
    for key, callback in items:
        if not (isinstance(callback, Callback) or (callback is None and isinstance(stage.callbacks, Mapping))):
            raise TypeError(f"{prefix}callbacks[{key!r}] must be a torchstage Callback, got "
                            f"{type(callback).__name__}")


#: Name prefixes of loaders that only evaluate; a run whose loaders all have one trains nothing, on purpose.
EVALUATION_PREFIXES = ("val", "test", "eval", "infer", "predict")


def check_loader_names(stage: StageSpec, names) -> None:
    """A loader trains when its name starts with ``train``: loaders of which none trains are refused unless every
    one is named as an evaluation loader (``valid``, ``test``...: a pass that trains nothing, on purpose). And
    ``valid_loader`` must name one of the loaders."""
    prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
    names = list(names)
    unclear = [name for name in names if not str(name).startswith(("train", *EVALUATION_PREFIXES))]
    if unclear and not any(str(name).startswith("train") for name in names):
        raise ValueError(f"{prefix}no loader trains: the loaders are {names}, and a loader trains when its name "
                         f"starts with 'train' ('train', 'train_extra'...; the others only evaluate), so "
                         f"{unclear[0]!r} would train nothing. Name the training loader 'train' (loaders={{'train': "
                         f"..., 'valid': ...}}), or evaluate without training with runner.evaluate_loader(loader)")
    if stage.valid_loader not in names:
        raise ValueError(f"{prefix}valid_loader={stage.valid_loader!r} is not among the loaders {names}; "
                         f"pass valid_loader=<one of them>")


def _check_loaders(loaders, prefix: str) -> list:
    if not isinstance(loaders, Mapping) or not loaders:
        raise TypeError(f"{prefix}loaders must be a non-empty mapping of name -> iterable of batches "
                        f"(e.g. {{'train': DataLoader, 'valid': DataLoader}}), got {loaders!r:.80}")
    for name, loader in loaders.items():
        if not isinstance(name, str):
            raise TypeError(f"{prefix}loaders keys must be strings, got {name!r}")
        if not hasattr(loader, "__iter__") or isinstance(loader, (str, bytes, torch.Tensor)):
            hint = "; pass datasets={...} to have torchstage build loaders" if hasattr(loader, "__getitem__") else ""
            raise TypeError(f"{prefix}loaders[{name!r}] is a {type(loader).__name__}, expected an iterable "
                            f"of batches such as a DataLoader{hint}")
        try:
            size = len(loader)
        except TypeError:
            continue
        if size == 0:
            raise RunnerException(f"{prefix}loaders[{name!r}] is empty (len 0): it would yield no batch")
    return list(loaders)


def _check_model(model) -> None:
    models = model.values() if isinstance(model, Mapping) else [model]
    if model is None or (isinstance(model, Mapping) and not model):
        raise ValueError("model is required: a torch.nn.Module or a dict of name -> torch.nn.Module")
    for m in models:
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or a dict of them, got {type(m).__name__}")


def _check_type(name, value, kind) -> None:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {kind.__name__}, got {value!r}")


def train_signature() -> inspect.Signature:
    """The keyword-only signature of ``Runner.train``, so ``help()`` and IDEs list every argument."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for f in dataclasses.fields(TrainSpec):
        if f.init:
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default))
    return inspect.Signature(params)
