"""Checks of what ``train()`` is given that would otherwise fail silently: an optimizer on another model's
parameters, a scheduler on another optimizer, a class instead of an instance, a plateau scheduler that
cuts the lr in the wrong direction, a logdir that is a file, a ``resume`` that names nothing, an engine that is
not one."""
import difflib
import glob
import os
from collections.abc import Mapping

import torch
from torch.optim.lr_scheduler import CyclicLR, OneCycleLR, ReduceLROnPlateau

from torchstage.strategies.engine import Engine

#: Schedulers whose one cycle spans a number of optimizer steps: stepped once per train batch.
PER_BATCH_SCHEDULERS = (OneCycleLR, CyclicLR)


def check_components(stage, model, scheduler_step: str) -> None:
    """Criterion, optimizer and scheduler of one stage against the model and each other."""
    prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
    for name in ("criterion", "optimizer", "scheduler"):
        _check_instances(prefix, name, getattr(stage, name))
    optimizers = _values(stage.optimizer)
    allowed = {id(p) for m in _values(model) for p in m.parameters()}
    allowed.update(id(p) for c in _values(stage.criterion) if isinstance(c, torch.nn.Module) for p in c.parameters())
    for key, optimizer in _items(stage.optimizer, "optimizer"):
        params = [p for group in getattr(optimizer, "param_groups", ()) for p in group["params"]]
        if allowed and params and not any(id(p) in allowed for p in params):
            raise ValueError(f"{prefix}{key} ({type(optimizer).__name__}) holds {len(params)} tensor(s), none of them "
                             f"a parameter of the model, so training would change nothing; build it on this "
                             f"model: {type(optimizer).__name__}(model.parameters(), ...)")
    for key, scheduler in _items(stage.scheduler, "scheduler"):
        bound = getattr(scheduler, "optimizer", None)
        if bound is not None and optimizers and not any(bound is o for o in optimizers):
            raise ValueError(f"{prefix}{key} ({type(scheduler).__name__}) is bound to another optimizer than "
                             f"{'the run' if not prefix else 'the stage'}'s optimizer, so the lr would never change; "
                             f"build it on the same object: {type(scheduler).__name__}(optimizer, ...)"
                             f"{'' if not prefix else ', or pass scheduler=None in this stage'}")
        if isinstance(scheduler, ReduceLROnPlateau):
            _check_plateau(prefix, key, scheduler, stage, scheduler_step)
        if isinstance(scheduler, PER_BATCH_SCHEDULERS) and scheduler_step != "batch":
            span = f"total_steps={scheduler.total_steps}" if isinstance(scheduler, OneCycleLR) else "step_size_up=..."
            raise ValueError(f"{prefix}{key} {type(scheduler).__name__} steps once per train batch (its cycle spans "
                             f"{span} batches), but scheduler_step={scheduler_step!r} would step it once per epoch; "
                             f"pass scheduler_step='batch'")


def check_scheduler_steps(stage, loaders: dict) -> None:
    """A OneCycleLR stepped per train batch must last the stage: its ``total_steps`` at least the stage's train
    batches (torch raises past them, epochs into the run)."""
    prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
    try:
        batches = sum(len(loader) for name, loader in loaders.items() if str(name).startswith("train"))
    except TypeError:
        return  # a loader without a length: torch says it when the cycle ends
    needed = stage.num_epochs * batches
    for key, scheduler in _items(stage.scheduler, "scheduler"):
        if isinstance(scheduler, OneCycleLR) and scheduler.total_steps < needed:
            raise ValueError(f"{prefix}{key} OneCycleLR(total_steps={scheduler.total_steps}) is stepped once per train "
                             f"batch, and this stage trains {stage.num_epochs} epoch(s) of {batches} train batch(es) "
                             f"= {needed} steps; build it with total_steps={needed} (or epochs={stage.num_epochs}, "
                             f"steps_per_epoch={batches})")


def _check_plateau(prefix, key, scheduler, stage, scheduler_step) -> None:
    wanted = "min" if stage.minimize_valid_metric else "max"
    if scheduler.mode != wanted:
        raise ValueError(f"{prefix}{key} ReduceLROnPlateau(mode={scheduler.mode!r}) cuts the lr when "
                         f"valid_metric={stage.valid_metric!r} stops {'falling' if scheduler.mode == 'min' else 'rising'}"
                         f", but minimize_valid_metric={stage.minimize_valid_metric} says "
                         f"{'lower' if stage.minimize_valid_metric else 'higher'} is better; build it with "
                         f"mode={wanted!r} (or set minimize_valid_metric={not stage.minimize_valid_metric})")
    if scheduler_step != "epoch":
        raise ValueError(f"{prefix}{key} ReduceLROnPlateau steps on valid_metric={stage.valid_metric!r}, known at "
                         f"epoch end, but scheduler_step={scheduler_step!r}; use scheduler_step='epoch'")


def _check_instances(prefix: str, name: str, value) -> None:
    for key, item in _items(value, name):
        if isinstance(item, type):
            example = {"criterion": f"{item.__name__}()", "optimizer": f"{item.__name__}(model.parameters(), lr=...)",
                       "scheduler": f"{item.__name__}(optimizer, ...)"}[name]
            raise TypeError(f"{prefix}{key} must be an instance such as {example}, got the class "
                            f"{item.__module__}.{item.__qualname__}")
        if name == "optimizer" and not (hasattr(item, "step") and hasattr(item, "zero_grad")):
            raise TypeError(f"{prefix}{key} must be a torch.optim.Optimizer (with step and zero_grad), got "
                            f"{type(item).__name__}")


def check_logdir(logdir) -> None:
    """``logdir`` must be a directory or not exist yet (it is created), under a directory this process can write."""
    if logdir is None:
        return
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ValueError(f"logdir={os.fspath(logdir)!r} is an existing file, not a directory; pass the path of a "
                         f"directory (created if missing) for checkpoints and logs")
    existing = os.path.abspath(os.fspath(logdir))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"logdir={os.fspath(logdir)!r} lies under {existing!r}, which is a file, not a directory; "
                         f"pass a logdir in a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"logdir={os.fspath(logdir)!r}: this process cannot write in {existing!r} (permission "
                              f"denied, or a read-only file system); pass a logdir where it can create files")


def check_resume(resume, logdir) -> None:
    """``resume`` is None, ``"last"``, ``"auto"`` or an existing checkpoint (a file, or a sharded checkpoint's
    directory); else say what was probably meant."""
    if resume in (None, "last", "auto") or (isinstance(resume, (str, os.PathLike)) and os.path.exists(resume)):
        return
    if not isinstance(resume, (str, os.PathLike)):
        raise TypeError(f"resume must be None, 'last' or the path of a checkpoint file, got {type(resume).__name__}")
    resume = os.fspath(resume)
    folder = os.path.dirname(resume) or (os.path.join(logdir, "checkpoints") if logdir is not None else ".")
    candidates = ["last", "auto"] + sorted(glob.glob(os.path.join(folder, "*.pth")))
    close = difflib.get_close_matches(resume, candidates, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"resume={resume!r} is neither 'last' (continue the logdir's run) nor an existing checkpoint "
                     f"file{hint}; 'auto' continues the logdir's run when it is this job's, else starts one")


def _values(value) -> list:
    return [] if value is None else list(value.values()) if isinstance(value, Mapping) else [value]


def _items(value, name: str) -> list:
    if value is None:
        return []
    return [(f"{name}[{k!r}]", v) for k, v in value.items()] if isinstance(value, Mapping) else [(name, value)]


def check_engine_and_loggers(engine, loggers) -> None:
    """``train(engine=...)`` must be an Engine and ``train(loggers=...)`` a dict (checked again per logger); that
    engine= is for one process only is checked where the world is known (``runner/setup.py``)."""
    if engine is not None and not isinstance(engine, Engine):
        raise TypeError(f"engine must be a torchstage Engine (such as dl.CPUEngine() or Engine(device='cpu')), "
                        f"got {type(engine).__name__}")
    if loggers is not None and not isinstance(loggers, Mapping):
        raise TypeError(f"loggers must be a dict name -> logger callback, got {type(loggers).__name__}")
