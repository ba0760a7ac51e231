"""The strategy contract: what differs between ways of training a model, with plain torch as the default.

A strategy owns putting a model on the device, wrapping and unwrapping it, precision, backward, skipping
gradient sync on accumulation steps, clipping gradients, the optimizer step, and moving model and optimizer
state into and out of a checkpoint (its :class:`~torchstage.files.checkpoint_write.CheckpointIO` writes the
files). Its lifecycle, the same for every strategy:

0. :meth:`Strategy.layout` ``(world)``: the device mesh layout it lays a world out in, declared before any process
   starts (a layout that cannot work is refused in the launching process); the run builds its
   :class:`~torchstage.distributed.engine.Engine` from the world and this layout, once;
1. :meth:`Strategy.connect` ``(engine, amp)``: once per run, the finished engine (device, rank, world, place in the
   mesh) and precision; a strategy reads its engine, never writes into it;
2. :meth:`Strategy.setup` ``(models, optimizers, plans, batch_size)``: the placed models, the run's optimizers
   and the :class:`StepPlan` each stepping callback declared in; what trains out (Fabric's
   ``setup_module_and_optimizers``);
3. the step (``backward``, ``no_sync``, ``clip_gradients``, ``optimizer_step``, ``zero_grad``), asked by the
   optimizer callback, which keeps the schedule, or by a custom ``handle_batch``; checkpoint state and saves;
4. :meth:`Strategy.teardown` ``(complete)``: after the run, before its process group goes.

A strategy knows nothing of runners or callbacks. A new one is one file with a subclass of :class:`Strategy`
plus its class in ``NAMED`` (:mod:`torchstage.strategies.resolve`). A strategy that writes optimizer state in a
format of its own also reads it back for the others (:meth:`Strategy.load_saved_optimizer_state`).
"""
import abc
import contextlib
from dataclasses import dataclass
from typing import Any, Optional

import torch

from torchstage.distributed.engine import Engine
from torchstage.distributed.layout import MeshLayout
from torchstage.files.checkpoint_write import FileCheckpointIO
from torchstage.strategies.activation_checkpointing import checkpoint_blocks
from torchstage.strategies.materialize import refuse_meta
from torchstage.strategies.precision import FULL, Precision

#: The strategy classes that write optimizer state in a format of their own and read it back for any strategy
#: (those defining :meth:`Strategy.load_saved_optimizer_state`), in the order they were defined.
FORMAT_OWNERS = []


@dataclass(frozen=True)
class StepPlan:
    """What one stepping callback will ask of the strategy for one optimizer, declared before training
    (:meth:`~torchstage.callbacks.base.Callback.step_plans`): the optimizer (None: the one the strategy's own
    configuration names, for a stage given none), its accumulation and its clipping."""

    optimizer: Any = None
    accumulation_steps: int = 1
    grad_clip_norm: Optional[float] = None
    grad_clip_value: Optional[float] = None


class Strategy(abc.ABC):
    """How a model trains: placement, wrapping, the step, precision and checkpoint state (see the module's lifecycle).

    The methods here are plain torch on one device; a strategy overrides what it does differently and must say,
    in :meth:`setup`, what trains.
    """

    #: The name ``train(strategy=...)`` accepts for this strategy (None: chosen for a single process only).
    name = None
    #: Autocast dtype and grad scaler of the current run (set by :meth:`connect`).
    precision: Precision = FULL
    #: The process's engine (device, rank, world size, collectives), given once by :meth:`connect`.
    engine = None
    #: How a checkpoint reaches its files (set by :meth:`connect`: one file per name here).
    checkpoint_io = None
    #: True when the strategy's own configuration names an optimizer, which :meth:`setup` builds for a run given
    #: none (DeepSpeed's config ``optimizer`` section): a runner that needs an optimizer then has one.
    supplies_optimizer = False
    #: Why this strategy cannot have its models and optimizers copied in memory and put back in place (a rollback's
    #: snapshot: each rank's ``model.state_dict()`` and ``optimizer.state`` tensors), or None where it can.
    no_snapshots = None
    #: How models built on the meta device get their values (a
    #: :class:`~torchstage.strategies.materialize.InitialWeights`, given by the runner before :meth:`setup`).
    initial_weights = None
    #: Why a model on the meta device cannot train under this strategy (None: it shards and materialises one).
    meta_refusal = ("this strategy holds the whole model on every process, so it would be built in full anyway: build "
                    "it on a device (drop torch.device('meta')), or shard it with strategy='fsdp' (or HSDP, "
                    "ModelParallel) on several processes")
    #: True when a train batch's forward and backward run together through a pipeline schedule: the runner hands
    #: whole batches to :meth:`pipeline_step`, and :meth:`backward` has nothing left to do.
    pipelined = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "load_saved_optimizer_state" in vars(cls):
            FORMAT_OWNERS.append(cls)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ---- the lifecycle -----------------------------------------------------------------------
    def layout(self, world) -> MeshLayout:
        """How this strategy lays out the processes of ``world`` (a :class:`~torchstage.launch.world.World`, maybe one
        about to be started) in a device mesh; ValueError, before any process starts, for a layout that cannot work.
        Here every rank holds the whole model and trains its own batches."""
        return MeshLayout(replicate=world.world_size)

    def connect(self, engine: Engine, amp=None) -> None:
        """Ready for a run on ``engine`` (built from :meth:`layout`), kept for the run: the precision ``amp`` asks for
        on its device (ValueError, before training, for what it cannot do) and the checkpoint IO."""
        self.engine = engine
        self.precision = Precision.for_device(amp, engine.device, engine.is_main)
        self.checkpoint_io = FileCheckpointIO(engine)

    @abc.abstractmethod
    def setup(self, models: dict, optimizers: list, plans=(), batch_size=None) -> tuple:
        """``(models, optimizers)`` as they train: ``models`` (name -> model, placed, checkpoint state loaded) wrapped
        as this strategy trains them, ``optimizers`` (the run's, each once) rebound where parameters were replaced,
        with any the strategy's configuration names added. ``plans`` are the :class:`StepPlan` the run's callbacks
        declared, ``batch_size`` the train loaders' (None if unknown); refuses, before training, what it cannot do."""

    def describe(self) -> str:
        """Its device mesh, for the line that announces the world ("" without one)."""
        return ""

    def mesh_layout(self):
        """The layout of its device mesh, recorded in checkpoints (None: a strategy without one)."""
        return None

    def teardown(self, complete: bool = True) -> None:
        """Release what the run built, once it ends and before its process group goes (collective only when the run
        ``complete``-d on every rank: a failing rank must exit, not wait): here the checkpoint IO's host memory."""
        if self.checkpoint_io is not None:
            self.checkpoint_io.close()

    # ---- placement ---------------------------------------------------------------------------
    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on the engine's device (in channels-last memory format when the engine asks for it); a model on
        the meta device is refused, before training, where the strategy cannot materialise it."""
        refuse_meta(model, f"{type(self).__name__}: {self.meta_refusal}")
        if self.engine.channels_last:
            return model.to(self.engine.device, memory_format=torch.channels_last)
        return model.to(self.engine.device)

    def checkpoint_activations(self, model: torch.nn.Module, classes: tuple) -> torch.nn.Module:
        """``model`` with each block of ``classes`` under activation checkpointing: here at once (before compile);
        a sharding strategy applies it in :meth:`setup`, after tensor parallelism and before sharding."""
        return checkpoint_blocks(model, classes)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The plain module under DDP or ``torch.compile`` wrappers."""
        while True:
            inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
            if not isinstance(inner, torch.nn.Module):
                return model
            model = inner

    # ---- the step ----------------------------------------------------------------------------
    def pipeline_step(self, model, inputs, targets, criterion, train: bool = True):
        """``(outputs, loss)`` of one whole batch through a pipeline schedule (forward, and backward when ``train``);
        only a strategy that is :attr:`pipelined` has one."""
        raise NotImplementedError(f"{type(self).__name__} runs no pipeline schedule")

    def backward(self, loss: torch.Tensor, optimizer) -> None:
        """Backpropagate ``loss`` (scaled under float16) for the parameters of ``optimizer``."""
        self.precision.scale(loss).backward()

    def no_sync(self, model):
        """A context in which backward passes skip gradient sync (accumulation steps); a no-op alone."""
        return contextlib.nullcontext()

    def finish_partial_group(self, optimizer, scale: float) -> None:
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
        """Put a checkpoint's optimizer state into ``optimizer``: torch's own format here; a format of another
        strategy's (FSDP's by parameter name, DeepSpeed's ZeRO partitions) through that strategy
        (:data:`FORMAT_OWNERS`)."""
        for owner in FORMAT_OWNERS:
            if owner.load_saved_optimizer_state(optimizer, models, state):
                return
        optimizer.load_state_dict(state)

    @classmethod
    def load_saved_optimizer_state(cls, optimizer, models: dict, state: dict) -> bool:
        """If ``state`` is an optimizer state in the format this strategy writes, load it into ``optimizer`` (a plain
        one, of any strategy; ``models``: name -> unwrapped model holding its parameters) and return True; a
        strategy with a format of its own defines this (and is then in :data:`FORMAT_OWNERS`)."""
        return False

    def save_checkpoint(self, checkpoint: dict, paths: list, writer=None, before_last=None) -> None:
        """Write ``checkpoint`` to each of ``paths`` in order, ``before_last()`` run after all but the last (the last
        path is the commit point), through this strategy's checkpoint IO; with a
        :class:`~torchstage.files.writer.FileWriter` the files are written while training goes on."""
        self.checkpoint_io.save(checkpoint, paths, writer, before_last)


def gradients_of(optimizer) -> list:
    """The parameters of ``optimizer`` that hold a gradient."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]

