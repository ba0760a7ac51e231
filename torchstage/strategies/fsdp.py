"""FSDP2: parameters, gradients and optimizer state sharded across ranks (``torch.distributed.fsdp.fully_shard``).

``fully_shard`` replaces every parameter by a sharded DTensor, so the optimizer the user built holds
stale tensors afterwards; :meth:`FSDP.setup` rebinds it (same object, groups, hyperparameters
and state, the state sharded like its parameter). Checkpoints are directories written by every rank
with ``torch.distributed.checkpoint`` (see :mod:`torchstage.files.sharded`).
"""
import contextlib
import numbers

import torch

from torchstage.distributed.layout import MeshLayout, check_degree, complete
from torchstage.files.checkpoint_write import ShardedCheckpointIO
from torchstage.files.pretrained import StateDictSource
from torchstage.strategies.activation_checkpointing import checkpoint_blocks
from torchstage.strategies.base import Strategy
from torchstage.strategies.materialize import InitialWeights, clean_name, is_meta, load_optimizer_state, materialize
from torchstage.strategies.mesh import build_mesh, by_mesh, data_mesh, total_norm

#: Modules that hold sub-modules without running them in a forward of their own: the policy looks inside.
CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


class FSDP(Strategy):
    """``strategy="fsdp"``, or ``FSDP(...)`` with options: shard each model with FSDP2 over all ranks.

    Wrapping policy: ``modules=(Block, ...)`` shards every sub-module of those classes; by default each
    child of the model holding at least ``min_params`` parameters is sharded as a unit (an
    ``nn.ModuleList``/``nn.ModuleDict`` is looked into, and its children are taken instead). The model
    itself is sharded last and holds what no unit took. ``reshard_after_forward`` frees the gathered
    parameters after forward (less memory, one more all-gather in backward). With ``train(amp="bf16")``
    parameters compute in bfloat16 and gradients are reduced in float32 (FSDP2's MixedPrecisionPolicy).
    On a single process nothing is sharded; checkpoints are still written as directories.

    A model built on the meta device is sharded as it is, then each rank materialises its shards only
    (:mod:`~torchstage.strategies.materialize`): from ``train(init_from=...)`` or a resumed checkpoint, else
    initialised module by module.

    ``replicate=R, shard=S`` (HSDP, see :class:`~torchstage.strategies.hsdp.HSDP`): a 2-D device mesh, each
    model sharded over ``S`` ranks and replicated ``R`` times (``R x S`` = the world size; one of them may be
    left out). Without them every rank shards the model.
    """

    name = "fsdp"
    meta_refusal = None
    #: torch's DeviceMesh of the engine's layout (set by :meth:`connect`; None: FSDP's default, every rank shards).
    mesh = None

    def __init__(self, min_params: int = 100_000, modules=(), reshard_after_forward: bool = True, *,
                 replicate: int = None, shard: int = None):
        if isinstance(min_params, bool) or not isinstance(min_params, numbers.Integral) or min_params < 1:
            raise ValueError(f"FSDP(min_params=...) must be an integer >= 1 (parameters of a unit), got {min_params!r}")
        modules = tuple(modules) if isinstance(modules, (list, tuple)) else (modules,)
        if not all(isinstance(m, type) and issubclass(m, torch.nn.Module) for m in modules):
            raise TypeError(f"FSDP(modules=...) must be nn.Module classes (e.g. modules=(Block,)), got {modules!r}")
        if not isinstance(reshard_after_forward, bool):
            raise TypeError(f"FSDP(reshard_after_forward=...) must be True or False, got {reshard_after_forward!r}")
        self.min_params, self.modules, self.reshard_after_forward = int(min_params), modules, reshard_after_forward
        self.replicate = check_degree(type(self).__name__, "replicate", replicate)
        self.shard = check_degree(type(self).__name__, "shard", shard)
        self.checkpointed = ()  # the block classes under activation checkpointing, applied at setup
        self._meta_states, self._meta_optimizers = {}, []  # a resumed checkpoint's states for meta models

    def __repr__(self) -> str:
        mesh = "".join(f", {k}={getattr(self, k)}" for k in ("replicate", "shard") if getattr(self, k) is not None)
        modules = tuple(m.__name__ for m in self.modules)
        return (f"{type(self).__name__}(min_params={self.min_params}, modules={modules}, "
                f"reshard_after_forward={self.reshard_after_forward}{mesh})")

    # ---- the mesh ----------------------------------------------------------------------------
    def layout(self, world) -> MeshLayout:
        """``replicate x shard`` of the world (refused when the degrees do not make it); by default every rank
        shards."""
        return complete(self.mesh_label(), world.world_size, self.replicate, self.shard, world.world_size)

    def connect(self, engine, amp=None) -> None:
        """The device mesh of the engine's layout where it has more than one dimension, and sharded checkpoints."""
        super().connect(engine, amp)
        self.mesh = build_mesh(engine.layout, engine.device.type) if engine.is_distributed and self.needs_mesh() \
            else None
        self.checkpoint_io = ShardedCheckpointIO(engine)  # a directory of every rank's shards (collective)

    def mesh_label(self) -> str:
        """``strategy=FSDP(replicate=2, shard=2)``: how a refused layout names the strategy, by its mesh arguments."""
        args = ", ".join(f"{k}={getattr(self, k)}" for k in ("replicate", "shard") if getattr(self, k) is not None)
        return f"strategy={type(self).__name__}({args})"

    def needs_mesh(self) -> bool:
        """True when FSDP's default mesh (every rank a shard) is not the layout."""
        return self.engine.layout.shard != self.engine.world_size

    @property
    def label(self) -> str:
        """How messages name this strategy."""
        return f"strategy={self.name!r}" if self.name else f"strategy={type(self).__name__}(...)"

    def describe(self) -> str:
        """The mesh, for the line that announces the world: its dimensions of more than one rank, and the shards."""
        layout = self.mesh_layout()
        if layout is None or layout.size == 1:
            return ""
        parts = [f"{name} {n}" for name, n in layout.as_dict().items() if n > 1 or name == "shard"]
        return "mesh " + " x ".join(parts)

    def mesh_layout(self):
        """The engine's layout once connected."""
        return None if self.engine is None else self.engine.layout

    def shard_mesh(self):
        """The mesh ``fully_shard`` shards over (None: all ranks)."""
        return None if self.mesh is None else data_mesh(self.mesh, self.engine.layout)

    # ---- wrapping ----------------------------------------------------------------------------
    def place(self, model):
        """A model on the meta device stays there until it is sharded (several processes only)."""
        if not is_meta(model):
            return super().place(model)
        if not self.engine.is_distributed:
            raise ValueError(f"the model is on the meta device (built under torch.device('meta')), and {self.label} on "
                             f"one process has nothing to shard it over: start several processes (distributed=True, "
                             f"nprocs=N, or a launcher), or build the model on a device")
        return model

    def checkpoint_activations(self, model, classes):
        """Kept for :meth:`setup`: activation checkpointing goes after tensor parallelism, before sharding."""
        self.checkpointed = tuple(classes or ())
        return model

    def units(self, model: torch.nn.Module) -> list:
        """The sub-modules sharded as their own unit before the model itself, innermost first."""
        if self.modules:
            return [m for m in reversed(list(model.modules())) if m is not model and isinstance(m, self.modules)]
        found = []

        def visit(module):
            for child in module.children():
                if sum(p.numel() for p in child.parameters()) < self.min_params:
                    continue
                if isinstance(child, CONTAINERS):
                    visit(child)
                else:
                    found.append(child)
        visit(model)
        return found

    def setup(self, models, optimizers, plans=(), batch_size=None):
        """Shard every trainable model in place and rebind ``optimizers`` to the sharded parameters."""
        _check_optimizers(models, optimizers, self.label)
        amp_dtype = self.precision.dtype
        if amp_dtype is torch.float16:
            raise ValueError(f"amp='fp16' is not supported with {self.label} (it needs a sharded grad scaler); "
                             "use amp='bf16'")
        compiled = [key for key, model in models.items() if hasattr(model, "_orig_mod")]
        if compiled:
            raise ValueError(f"compile=True is not supported with {self.label} (model {compiled[0]!r} is compiled "
                             f"before sharding); train without compile, or use strategy='ddp'")
        if not self.engine.is_distributed:
            return {key: checkpoint_blocks(model, self.checkpointed) for key, model in models.items()}, list(optimizers)
        before = {id(p): (key, clean_name(name)) for key, model in models.items()
                  for name, p in model.named_parameters()}
        meta = {key: self._meta_states.pop(id(model), None) for key, model in models.items() if is_meta(model)}
        models = {key: checkpoint_blocks(self.parallelize(model), self.checkpointed) for key, model in models.items()}
        self.shard_models(models, amp_dtype)
        self.materialize_models({key: models[key] for key in meta}, meta)
        after = {(key, clean_name(name)): p for key, model in models.items() for name, p in model.named_parameters()}
        for optimizer in optimizers:
            _rebind(optimizer, {old: after[where] for old, where in before.items()})
        for optimizer, state in self._meta_optimizers:
            load_optimizer_state(optimizer_module(optimizer, models), optimizer, state)
        self._meta_optimizers = []
        return dict(models), list(optimizers)

    def materialize_models(self, models: dict, resumed: dict) -> None:
        """Give each sharded meta model its memory and values: a resumed checkpoint's (``resumed``, name -> state or
        None), else the run's initial weights (``init_from``, or initialised)."""
        weights = self.initial_weights or InitialWeights()
        for key, model in models.items():
            source = (StateDictSource(resumed[key], "the resumed checkpoint") if resumed[key] is not None
                      else (weights.sources or {}).get(key))
            materialize(model, self.engine.device, weights, source)

    def parallelize(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model before it is sharded; tensor parallelism's place (:class:`ModelParallel`), as is here."""
        return model

    def shard_models(self, models: dict, amp_dtype) -> None:
        """``fully_shard`` each trainable model in place over :meth:`shard_mesh`: its units, then itself."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # heavy; FSDP runs only
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if amp_dtype is torch.bfloat16 else MixedPrecisionPolicy())
        options = dict(mp_policy=policy, reshard_after_forward=self.reshard_after_forward)
        if self.mesh is not None:
            options["mesh"] = self.shard_mesh()
        for model in models.values():
            if not any(p.requires_grad for p in model.parameters()):
                continue
            for unit in self.units(model):
                fully_shard(unit, **options)
            fully_shard(model, **options)

    # ---- gradients ---------------------------------------------------------------------------
    def no_sync(self, model):
        """Accumulate unsharded gradients locally: no reduce-scatter until the context's last backward."""
        stack = contextlib.ExitStack()
        for m in (model.values() if isinstance(model, dict) else [model]):
            if hasattr(m, "set_requires_gradient_sync"):
                m.set_requires_gradient_sync(False)
                stack.callback(m.set_requires_gradient_sync, True)
        return stack

    def finish_partial_group(self, optimizer, scale):
        if self.engine.is_distributed:
            raise RuntimeError(f"{self.label} with accumulation_steps > 1 needs loaders with a length: the last "
                               "accumulation group of a loader ended early, and its gradients were never "
                               "reduce-scattered; give the loader a __len__ or use accumulation_steps=1")
        super().finish_partial_group(optimizer, scale)

    def clip_grad_norm_(self, params, max_norm):
        """Clip by the norm of the whole (sharded) gradient: local norms are reduced over ranks first (over each
        device mesh the gradients live on)."""
        total = total_norm([p.grad for p in params])
        for group in by_mesh(params).values():  # torch's foreach ops take the tensors of one mesh at a time
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    # ---- checkpoint state --------------------------------------------------------------------
    def model_state_dict(self, model):
        """Sharded (DTensor) state of a sharded model; plain state on one process."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict  # heavy; FSDP runs only
        return get_model_state_dict(model)

    def load_model_state_dict(self, model, state):
        """Full tensors into a plain or a sharded model (each rank keeps its shard); into a meta model once it is
        sharded and materialised (:meth:`setup`)."""
        if is_meta(model):
            self._meta_states[id(model)] = state
            return
        # heavy; FSDP runs only
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def load_optimizer_state_dict(self, optimizer, models, state):
        """As any strategy's; for an optimizer of a meta model, once the model is materialised (:meth:`setup`)."""
        if any(is_meta(model) for model in models.values()):
            self._meta_optimizers.append((optimizer, state))
            return
        super().load_optimizer_state_dict(optimizer, models, state)

    def optimizer_state_dict(self, optimizer, models):
        """The optimizer state keyed by parameter name (sharded tensors), loadable on any world size."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # heavy; FSDP runs only
        return get_optimizer_state_dict(optimizer_module(optimizer, models), optimizer)

    @classmethod
    def load_saved_optimizer_state(cls, optimizer, models, state) -> bool:
        """An optimizer state keyed by parameter name (FSDP's) loaded by name, into a sharded or a plain optimizer."""
        groups = state.get("param_groups") or [{}]
        if not any(isinstance(key, str) for key in groups[0].get("params", ())):
            return False
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict  # heavy; FSDP checkpoints only
        set_optimizer_state_dict(optimizer_module(optimizer, models), optimizer, state)
        return True



def optimizer_module(optimizer, models: dict) -> torch.nn.Module:
    """The model holding ``optimizer``'s parameters, or a ModuleDict of the models that do (names prefix them)."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    holders = {name: model for name, model in models.items() if any(id(p) in ids for p in model.parameters())}
    if len(holders) == 1:
        return next(iter(holders.values()))
    return torch.nn.ModuleDict(holders)


def _check_optimizers(models: dict, optimizers, label: str) -> None:
    """Every parameter an optimizer holds must belong to one of the models (else it would never change)."""
    known = {id(p) for model in models.values() for p in model.parameters()}
    for optimizer in optimizers:
        for i, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if id(p) not in known:
                    raise ValueError(f"the optimizer ({type(optimizer).__name__}) holds a parameter of shape "
                                     f"{tuple(p.shape)} in param_groups[{i}] that is in no model given to train(); "
                                     f"{label} rebinds parameters by their place in the model, so build the "
                                     f"optimizer from model.parameters()")


def _rebind(optimizer, new: dict) -> None:
    """Point the optimizer's groups (and state) at the sharded parameters; the state is sharded alike."""
    from torch.distributed.tensor import distribute_tensor  # DTensor: heavy; FSDP runs only
    state = optimizer.state
    for group in optimizer.param_groups:
        params = []
        for old in group["params"]:
            param = new[id(old)]
            if old in state:
                state[param] = {k: distribute_tensor(v, param.device_mesh, param.placements, src_data_rank=None)
                                if torch.is_tensor(v) and v.shape == old.shape and v.dim() > 0 else v
                                for k, v in state.pop(old).items()}
            params.append(param)
        group["params"] = params
