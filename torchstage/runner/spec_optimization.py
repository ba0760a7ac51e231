"""The optimization part of ``train()``'s arguments: how the weights are stepped (``scheduler_step``, accumulation,
clipping) and how fast a step computes (``amp``, ``compile``, ``channels_last``); and the checks of each stage's
criterion, optimizer and scheduler against the model and each other that would otherwise fail silently (an
optimizer on another model's parameters, a scheduler on another optimizer, a class instead of an instance, a
plateau scheduler that cuts the lr in the wrong direction)."""
from collections.abc import Mapping

import torch
from torch.optim.lr_scheduler import CyclicLR, OneCycleLR, ReduceLROnPlateau

from torchstage.strategies.precision import amp_dtype

#: Schedulers whose one cycle spans a number of optimizer steps: stepped once per train batch.
PER_BATCH_SCHEDULERS = (OneCycleLR, CyclicLR)


def check_optimization(spec, runner) -> None:
    """``amp`` and ``compile``. ``scheduler_step`` and the accumulation and clipping arguments configure the default
    SchedulerCallback and OptimizerCallback, which check their values (:mod:`torchstage.runner.defaults`); each
    stage's criterion, optimizer and scheduler are checked against the model (:func:`check_components`, a rule
    between parts: :mod:`torchstage.runner.spec_rules`)."""
    amp_dtype(spec.amp)
    if not isinstance(spec.compile, (bool, dict)):
        raise TypeError(f"compile must be True/False or a dict of torch.compile arguments "
                        f"(e.g. {{'mode': 'reduce-overhead'}}), got {spec.compile!r}")


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
        if params and not allowed:
            raise ValueError(f"{prefix}model ({_kinds(model)}) has no parameters, so {key} "
                             f"({type(optimizer).__name__}), which holds {len(params)} tensor(s) of something else, "
                             f"would train nothing; give train() the model whose parameters it holds (tensors a "
                             f"model learns are nn.Parameter attributes of one of its modules)")
        if params and not any(id(p) in allowed for p in params):
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


def _kinds(model) -> str:
    return ", ".join(f"{k}: {type(m).__name__}" for k, m in model.items()) if isinstance(model, Mapping) else \
        type(model).__name__


def _values(value) -> list:
    return [] if value is None else list(value.values()) if isinstance(value, Mapping) else [value]


def _items(value, name: str) -> list:
    if value is None:
        return []
    return [(f"{name}[{k!r}]", v) for k, v in value.items()] if isinstance(value, Mapping) else [(name, value)]
