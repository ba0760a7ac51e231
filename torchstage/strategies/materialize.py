"""Models built on the meta device: each rank materialises only its shards, then fills them from a checkpoint or
initialises them, module by module, the same on any mesh.

A model built under ``torch.device("meta")`` has shapes but no memory. The sharded strategies shard it as it is
(``parallelize_module``, ``fully_shard``), then :func:`materialize` gives each rank's shards memory on its device
(``to_empty``) and their values: the tensors a source holds (``init_from``, or a resumed checkpoint) are read, each
rank reading the slice it holds; every other module is initialised by ``init(module)`` (by default its
``reset_parameters()``) on full-size copies of its own tensors, seeded by the run's seed and the module's name, and
each rank keeps its part. One module's tensors at a time are whole in memory, never the model. So the initial
weights are the same bitwise on any mesh and number of processes (on one kind of device: CPU and CUDA draw
differently), and equal those of the model initialised module by module on one process with the same seeds.
"""
import copy
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

#: Wrappers that torch puts between a module and its parameters' names (activation checkpointing, compile, FSDP1).
WRAPPER_NAMES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """A parameter's name without wrapper prefixes: the same before and after a model is wrapped."""
    for wrapper in WRAPPER_NAMES:
        name = name.replace(wrapper, "")
    return name


@dataclass
class InitialWeights:
    """How a model built on the meta device gets its values (the runner gives it to the strategy before setup):
    ``init(module)`` for what no source holds (None: each module's ``reset_parameters()``), ``sources`` (model name
    -> a :class:`~torchstage.files.pretrained.WeightsSource`), and the run's ``seed``."""

    init: Optional[Callable] = None
    sources: Any = None
    seed: int = 0


def is_meta(model: torch.nn.Module) -> bool:
    """True when any parameter or buffer of ``model`` is on the meta device (shapes only, no memory)."""
    return any(_local(t).is_meta for t in _tensors(model))


def _tensors(model):
    """Every parameter and buffer of ``model``."""
    yield from model.parameters()
    yield from model.buffers()


def _local(tensor):
    """The part this rank holds of ``tensor`` (a DTensor's local tensor; a plain tensor itself)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def module_seed(seed: int, name: str) -> int:
    """The seed module ``name`` is initialised with: the run's seed and a hash of the name that every process
    computes alike (Python's ``hash`` differs between processes)."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63)


def named_tensors(model: torch.nn.Module, persistent_only: bool = False) -> dict:
    """Clean name -> each parameter and buffer of ``model`` (the live objects; a tied tensor under its first name);
    ``persistent_only``: what a state dict holds (no non-persistent buffers)."""
    found, seen = {}, set()
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        skipped = module._non_persistent_buffers_set if persistent_only else ()
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is None or name in skipped or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            found[clean_name(prefix + name)] = tensor
    return found


def tied_names(model: torch.nn.Module) -> dict:
    """Name -> the first name of the same parameter, for each parameter registered under more than one name."""
    first, aliases = {}, {}
    for name, param in model.named_parameters(remove_duplicate=False):
        name = clean_name(name)
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def check_initializable(model: torch.nn.Module, init, covered=(), label: str = "model") -> None:
    """ValueError, before anything is allocated, naming each module whose own tensors no source covers and that has
    no ``reset_parameters()`` to initialise them, where no ``init`` function is given."""
    if init is not None:
        return
    lacking = []
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        own = [n for n, t in [*module._parameters.items(), *module._buffers.items()]
               if t is not None and clean_name(prefix + n) not in covered]
        if own and not callable(getattr(module, "reset_parameters", None)):
            lacking.append(f"{clean_name(module_name) or '(the model itself)'} ({type(module).__name__}: "
                           f"{', '.join(own)})")
    if lacking:
        few = "; ".join(lacking[:4]) + (f"; and {len(lacking) - 4} more" if len(lacking) > 4 else "")
        raise ValueError(f"{label} is on the meta device, so each module's tensors are initialised after sharding by "
                         f"its reset_parameters(), which these modules lack: {few}. Pass init_weights=fn (fn(module) "
                         f"initialises a module's own tensors, as model.apply(fn) would; a Hugging Face model's is "
                         f"init_weights=model._init_weights), or init_from= a checkpoint that holds them")


def materialize(model: torch.nn.Module, device, weights: InitialWeights, source=None) -> None:
    """Give the (sharded) meta ``model`` memory on ``device`` and its values: ``source``'s tensors where it holds them,
    the rest initialised module by module (see the module). Every rank of the model's mesh calls it."""
    covered = set(source.shapes()) if source is not None else set()
    aliases = tied_names(model)
    check_initializable(model, weights.init, covered | set(aliases))
    ties = list(aliases.items())
    model.to_empty(device=device)
    _retie(model, ties)
    tensors = named_tensors(model)
    if source is not None:
        source.load_into({name: tensor for name, tensor in tensors.items() if name in covered})
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        own = [n for n, t in [*module._parameters.items(), *module._buffers.items()]
               if t is not None and clean_name(prefix + n) not in covered and clean_name(prefix + n) not in aliases]
        if own:
            _initialise(module, clean_name(module_name), own, weights, device)


def _retie(model, ties: list) -> None:
    """Register each tied parameter again as the one object ``to_empty`` split it into two of."""
    for name, first in ties:
        owner_name, _, attr = name.rpartition(".")
        first_owner, _, first_attr = first.rpartition(".")
        param = getattr(model.get_submodule(first_owner) if first_owner else model, first_attr)
        setattr(model.get_submodule(owner_name) if owner_name else model, attr, param)


def _initialise(module, name: str, own: list, weights: InitialWeights, device) -> None:
    """Initialise ``module``'s tensors ``own`` on a shallow copy holding full-size ones (seeded by ``name``), then copy
    into each real tensor the part this rank holds."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    twin = copy.copy(module)
    twin._parameters, twin._buffers = dict(module._parameters), dict(module._buffers)
    for key in own:
        real = module._parameters.get(key) if key in module._parameters else module._buffers[key]
        full = torch.empty(real.shape, dtype=real.dtype, device=device)
        if key in module._parameters:
            twin._parameters[key] = torch.nn.Parameter(full, requires_grad=real.requires_grad)
        else:
            twin._buffers[key] = full
    devices = [device] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(module_seed(weights.seed, name))
        if weights.init is not None:
            weights.init(twin)
        else:
            twin.reset_parameters()
    with torch.no_grad():
        for key in own:
            real = module._parameters.get(key) if key in module._parameters else module._buffers[key]
            full = (twin._parameters if key in module._parameters else twin._buffers)[key].detach()
            if isinstance(real, DTensor):
                real.to_local().copy_(distribute_tensor(full, real.device_mesh, real.placements,
                                                        src_data_rank=None).to_local())
            else:
                real.copy_(full)


def refuse_meta(model: torch.nn.Module, why: str) -> None:
    """ValueError, before training, for a model on the meta device where it cannot be materialised (``why``)."""
    if is_meta(model):
        raise ValueError(f"the model is on the meta device (built under torch.device('meta')): {why}")


def load_optimizer_state(module: torch.nn.Module, optimizer, state: dict) -> None:
    """A checkpoint's optimizer state (full tensors, keyed by parameter name or, from a DDP or one-process run, by
    index) into ``optimizer`` of the sharded ``module``: each rank keeps its shard of every tensor."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict  # heavy
    groups = state.get("param_groups") or [{}]
    if not any(isinstance(key, str) for key in groups[0].get("params", ())):  # by index: name them
        names = {id(p): clean_name(n) for n, p in module.named_parameters()}
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        state = {"state": {order[i]: value for i, value in state.get("state", {}).items()},
                 "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))
