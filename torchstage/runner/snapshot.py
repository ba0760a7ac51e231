"""In-memory snapshots of a run, for rollbacks: this rank's state, copied, and put back exactly.

A snapshot holds what a checkpoint holds, for this rank only and without any collective: the models' and
optimizers' tensors (copied on their device; under FSDP each rank's shards), the schedulers, the grad scaler,
the callbacks' states, the loop's counters and metrics, and the random generators. It is taken between two
batches of a train loader's pass (or as the pass starts) and put back with the pass set to go on from there,
as a run resumed from a checkpoint written at that point would (see :mod:`torchstage.runner.resume`). A new
snapshot copies into the previous one's tensors where they fit, so a run keeps one set of copies.
"""
import copy
from dataclasses import dataclass, field
from typing import Optional

import torch

from torchstage.one_or_many import named
from torchstage.rng import capture_rng, set_rng_state
from torchstage.runner.loop_state import ResumePoint

#: The loop's counters a snapshot keeps (its position and metrics are kept apart).
_COUNTERS = ("global_batch_step", "global_sample_step", "run_batch_step", "run_sample_step", "train_batches_done",
             "loader_sample_step", "batch_step", "periodic_step")


@dataclass
class Snapshot:
    """One rank's run at one point of a train loader's pass (see the module)."""

    stage: str
    epoch: int  #: the global epoch
    loader: str
    batch: int  #: the loop's batch_step of the last batch done (0 at the pass's start)
    at_start: bool  #: taken as the loader (re)started, before it drew its first batch
    models: dict = field(default_factory=dict)
    optimizers: dict = field(default_factory=dict)
    schedulers: dict = field(default_factory=dict)
    scaler: dict = field(default_factory=dict)
    callbacks: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)  #: epoch metrics, and the periodic validation's
    rng: tuple = ()  #: the generators' states (:func:`~torchstage.rng.capture_rng`)
    resume_point: Optional[ResumePoint] = None  #: the resume point the loader had yet to apply (at a start)

    @property
    def global_batch(self) -> int:
        return self.counters["global_batch_step"]


def take_snapshot(runner, at_start: bool, leave_out=(), reuse: Snapshot = None) -> Snapshot:
    """This rank's run now, copied (``reuse``: a snapshot whose tensors to copy into); ``leave_out``: names of
    callbacks whose state is not the run's to roll back (the rollback's own record)."""
    loop, strategy, old = runner.loop, runner.strategy, reuse or Snapshot("", 0, "", 0, True)
    point = loop.resume_point if at_start else None  # a loader about to resume: it starts after the point's batches
    batch = (point.batch if point is not None else 0) if at_start else loop.batch_step
    snapshot = Snapshot(runner.loop.stage_key, runner.loop.global_epoch_step, runner.loop.loader_key, batch, at_start)
    snapshot.models = {name: _copy(model.state_dict(), old.models.get(name))
                       for name, model in named(runner.unwrapped_model, "model").items()}
    snapshot.optimizers = {name: _copy(_optimizer_state(optimizer), old.optimizers.get(name))
                           for name, optimizer in named(runner.optimizer, "optimizer").items()}
    snapshot.schedulers = {name: copy.deepcopy(scheduler.state_dict())
                           for name, scheduler in named(runner.scheduler, "scheduler").items()}
    snapshot.scaler = copy.deepcopy(strategy.precision.state_dict())
    snapshot.callbacks = {name: _copy(callback.state_dict(), old.callbacks.get(name))
                          for name, callback in runner.callbacks.items() if name not in leave_out}
    snapshot.counters = {name: getattr(loop, name) for name in _COUNTERS}
    snapshot.metrics = copy.deepcopy({"epoch": dict(loop.epoch_metrics), "periodic": loop.periodic_metrics})
    snapshot.rng = capture_rng()
    snapshot.resume_point = copy.copy(point)
    return snapshot


def restore_snapshot(runner, snapshot: Snapshot) -> None:
    """Put ``snapshot`` back: the next loader start of the runner goes on from its point, as a resume would."""
    loop, strategy = runner.loop, runner.strategy
    for name, model in named(runner.unwrapped_model, "model").items():
        model.load_state_dict(snapshot.models[name])  # in place: each tensor copied into the model's own
    for name, optimizer in named(runner.optimizer, "optimizer").items():
        _load_optimizer_state(optimizer, snapshot.optimizers[name])
    for name, scheduler in named(runner.scheduler, "scheduler").items():
        scheduler.load_state_dict(copy.deepcopy(snapshot.schedulers[name]))
    strategy.precision.load_state_dict(copy.deepcopy(snapshot.scaler))
    for name, state in snapshot.callbacks.items():
        callback = runner.callbacks.get(name)
        if callback is not None and (state or callback.state_dict()):  # as a checkpoint: no empty state loaded
            callback.load_state_dict(_copy(state, None))
    for name, value in snapshot.counters.items():
        setattr(loop, name, value)
    metrics = copy.deepcopy(snapshot.metrics)
    loop.epoch_metrics, loop.periodic_metrics = runner.epoch_metrics_type(metrics["epoch"]), metrics["periodic"]
    set_rng_state(snapshot.rng)
    if snapshot.at_start:
        loop.resume_point = copy.copy(snapshot.resume_point)
        return
    done = {name: values for name, values in metrics["epoch"].items() if name != snapshot.loader}
    loop.resume_point = ResumePoint(loader=snapshot.loader, batch=snapshot.batch,
                                    train_batches_done=snapshot.counters["train_batches_done"],
                                    loader_sample_step=snapshot.counters["loader_sample_step"], metrics=done,
                                    loader_rng=loop.loader_start_rng, rng=snapshot.rng)


def _optimizer_state(optimizer) -> dict:
    """The optimizer's state by parameter index (the live tensors) and its groups' hyperparameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {"state": [optimizer.state[p] if p in optimizer.state else None for p in params],
            "groups": [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]}


def _load_optimizer_state(optimizer, saved: dict) -> None:
    """Put a copied state back into ``optimizer``'s own tensors (a new one where a tensor is new or reshaped)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for param, state in zip(params, saved["state"]):
        if state is None:
            optimizer.state.pop(param, None)
            continue
        current = optimizer.state[param]
        for key in [key for key in current if key not in state]:
            del current[key]
        for key, value in state.items():
            current[key] = _copy(value, current.get(key))
    for group, values in zip(optimizer.param_groups, saved["groups"]):
        group.update(copy.deepcopy(values))


def _copy(value, into=None):
    """``value`` with every tensor copied (into ``into``'s tensor at the same place where it fits) and containers
    made anew; other values deep-copied."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if (isinstance(into, torch.Tensor) and type(into) is type(value) and into.shape == value.shape
                and into.dtype == value.dtype and into.device == value.device):
            return into.copy_(value)
        return value.clone()
    if isinstance(value, dict):
        into = into if isinstance(into, dict) else {}
        copied = {key: _copy(item, into.get(key)) for key, item in value.items()}
        return copied if type(value) is dict else type(value)(copied)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        if len(value) > 4 and type(value[0]) is torch.Tensor:  # per-batch values (metric sums): one copy for all
            try:
                return type(value)(torch.stack([item.detach() for item in value]).unbind(0))
            except (RuntimeError, TypeError):  # tensors of several shapes, devices or kinds: one by one below
                pass
        into = into if isinstance(into, (list, tuple)) and len(into) == len(value) else [None] * len(value)
        return type(value)(_copy(item, old) for item, old in zip(value, into))
    if isinstance(value, (str, int, float, bool, bytes, type(None))):
        return value
    return copy.deepcopy(value)
