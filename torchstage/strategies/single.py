"""The strategy of one process on one device, and the base every other strategy overrides.

A strategy owns what differs between ways of training: putting a model on the device, wrapping and
unwrapping it, precision, backward, skipping gradient sync on accumulation steps, clipping gradients, the
optimizer step, and moving model and optimizer state into and out of a checkpoint. The optimizer callback
keeps the schedule (accumulation, when to clip and step) and asks the strategy to act. A strategy takes the
engine (device, rank, world size) as an argument and knows nothing of runners or callbacks.
"""
import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Optional

import torch

from torchstage.files.atomic import write_atomic_stream
from torchstage.files.checkpoint import snapshot
from torchstage.files.checkpoint_file import dump
from torchstage.files.writer import hand_over
from torchstage.strategies.precision import FULL, Precision


@dataclass(frozen=True)
class StepPlan:
    """What one optimizer callback will ask of the strategy, told before wrapping (:meth:`SingleDevice.plan_steps`)."""

    optimizer: Any
    accumulation_steps: int = 1
    grad_clip_norm: Optional[float] = None
    grad_clip_value: Optional[float] = None


class SingleDevice:
    """One process on one device: models are placed, never wrapped; clipping and state are plain torch."""

    #: The name ``train(strategy=...)`` accepts for this strategy (None: chosen for a single process only).
    name = None
    #: Autocast dtype and grad scaler of the current run (set by :meth:`setup`).
    precision: Precision = FULL

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def setup(self, engine, amp=None) -> None:
        """Ready for a run on ``engine``: the precision ``amp`` asks for on its device (ValueError, before training,
        for what it cannot do)."""
        self.precision = Precision.for_device(amp, engine.device, engine.is_main)
        self._snapshot_buffers = {}  # the last checkpoint's host copy, reused by the next (save_checkpoint)

    def make_optimizer(self, model):
        """An optimizer the strategy's own configuration names, for a stage given none (None: there is none)."""
        return None

    def plan_steps(self, batch_size, steps: list) -> None:
        """Told before wrapping: the train loaders' batch size (None if unknown) and a :class:`StepPlan` per optimizer
        callback, for strategies that configure their engine from them (refusing, before training, what they
        cannot do); nothing here."""

    # ---- placement and wrapping --------------------------------------------------------------
    def place(self, model: torch.nn.Module, engine) -> torch.nn.Module:
        """The model on the engine's device (in channels-last memory format when the engine asks for it)."""
        if engine.channels_last:
            return model.to(engine.device, memory_format=torch.channels_last)
        return model.to(engine.device)

    def wrap_models(self, models: dict, engine, optimizers=()) -> dict:
        """Name -> model as it trains under this strategy, after checkpoint loading (see :meth:`wrap`).

        ``optimizers`` are the run's optimizers, for strategies that replace parameters and must rebind them.
        """
        return {name: self.wrap(model, engine) for name, model in models.items()}

    def wrap(self, model: torch.nn.Module, engine) -> torch.nn.Module:
        """One model as it trains under this strategy; the model itself on one device."""
        return model

    def teardown(self, complete: bool = True) -> None:
        """Release what :meth:`wrap_models` built, once the run ends and before its process group goes (collective
        only when the run ``complete``-d on every rank: a failing rank must exit, not wait); nothing here."""

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The plain module under DDP or ``torch.compile`` wrappers."""
        while True:
            inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
            if not isinstance(inner, torch.nn.Module):
                return model
            model = inner

    # ---- the step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, optimizer) -> None:
        """Backpropagate ``loss`` (scaled under float16) for the parameters of ``optimizer``."""
        self.precision.scale(loss).backward()

    def no_sync(self, model):
        """A context in which backward passes skip gradient sync (accumulation steps); a no-op alone."""
        return contextlib.nullcontext()

    def finish_partial_group(self, optimizer, engine, scale: float) -> None:
        """Multiply gradients by ``scale`` (an accumulation group cut short); DDP also averages them over ranks."""
        if scale != 1:
            for p in gradients_of(optimizer):
                p.grad.mul_(scale)

    def clip_gradients(self, optimizer, max_norm: float = None, max_value: float = None) -> None:
        """Clip the gradients of ``optimizer``'s parameters, unscaled first: each element into
        ``[-max_value, max_value]``, then the total 2-norm to at most ``max_norm``."""
        if max_norm is None and max_value is None:
            return
        self.precision.unscale_(optimizer)
        params = gradients_of(optimizer)
        if max_value is not None:
            torch.nn.utils.clip_grad_value_(params, max_value)
        if max_norm is not None:
            self.clip_grad_norm_(params, max_norm)

    def clip_grad_norm_(self, params: list, max_norm: float) -> torch.Tensor:
        """Scale gradients so that their total 2-norm is at most ``max_norm``; returns the norm before."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def optimizer_step(self, optimizer) -> None:
        """Step ``optimizer`` (through the grad scaler under float16), then reset its gradients to None."""
        self.precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    def zero_grad(self, optimizer) -> None:
        """Reset the gradients of ``optimizer``'s parameters (to None: no memory, no zero-fill)."""
        optimizer.zero_grad(set_to_none=True)

    # ---- checkpoint state --------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module) -> dict:
        """The unwrapped model's state for a checkpoint (full tensors)."""
        return model.state_dict()

    def load_model_state_dict(self, model: torch.nn.Module, state: dict) -> None:
        """Put a checkpoint's model state (without wrapper prefixes) into the unwrapped model."""
        model.load_state_dict(state)

    def optimizer_state_dict(self, optimizer, models: dict) -> dict:
        """The optimizer's state for a checkpoint; ``models`` (name -> unwrapped model) hold its parameters."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, models: dict, state: dict) -> None:
        """Put a checkpoint's optimizer state into ``optimizer``, keyed by index or, from FSDP, by parameter name."""
        if _keyed_by_name(state):
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict  # heavy; FSDP checkpoints only
            set_optimizer_state_dict(optimizer_module(optimizer, models), optimizer, state)
        else:
            optimizer.load_state_dict(state)

    def save_checkpoint(self, checkpoint: dict, paths: list, engine, writer=None, before_last=None) -> None:
        """Write ``checkpoint`` to each of ``paths`` in order (independent files, each atomic, by the main rank),
        ``before_last()`` (the main rank's) run after all but the last: the last path is the commit point.

        With a :class:`~torchstage.files.writer.FileWriter` the save does not block training: once the previous
        save has landed, the state is copied to host memory here (the snapshot, the only time training waits;
        into the previous snapshot's memory, kept for it), and the writer's thread serializes it into the files
        while training goes on.
        """
        if not engine.is_main:
            return
        if writer is not None:
            writer.wait_for_room()  # no two saves overlap: at most one copy of the state besides the live one
        # the previous snapshot has landed (or is still to be written, when several may be pending: no reuse)
        reuse = writer is None or writer.max_pending == 1
        state = snapshot(checkpoint, getattr(self, "_snapshot_buffers", None) if reuse else None)

        # copies, not links: damage to one file cannot reach another
        hand_over(writer, lambda: write_atomic_stream(paths, functools.partial(dump, state), before_last))


def gradients_of(optimizer) -> list:
    """The parameters of ``optimizer`` that hold a gradient."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def _keyed_by_name(state: dict) -> bool:
    groups = state.get("param_groups") or [{}]
    return any(isinstance(key, str) for key in groups[0].get("params", ()))


def optimizer_module(optimizer, models: dict) -> torch.nn.Module:
    """The model holding ``optimizer``'s parameters, or a ModuleDict of the models that do (names prefix them)."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    holders = {name: model for name, model in models.items() if any(id(p) in ids for p in model.parameters())}
    if len(holders) == 1:
        return next(iter(holders.values()))
    return torch.nn.ModuleDict(holders)
