"""Each rank's memory for a strategy and a world, before launch: parameters, gradients, optimizer state, activations
and the strategy's working buffers, from the model's shapes (built on the meta device, or a meta twin of it), in one
process and without a world.

The sharded strategies are planned by running their own code on the meta model inside a fake process group of the
planned size (torch's ``fake`` backend: collectives that move nothing), once per position in the tensor-parallel
group: the tensor-parallel plan and ``fully_shard`` give each rank's exact local shapes. Activations are the tensors
autograd saves for backward in one forward (and the criterion) of the model as the rank runs it, counted once per
storage: with activation checkpointing, each checkpointed block keeps its input, and one block's at a time comes back
in backward. FSDP's working buffers are the gathered units (the root, the unit computing and the next one prefetched)
and one unit's unsharded gradients; DDP's, its gradient buckets. The peak is the largest of the forward's end
(activations and gathered units) and the step (gradients and the optimizer's temporaries), over the parameters and
optimizer state that live all run. What the allocator keeps, the runtime and the data are not counted.
"""
import copy
import inspect
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from torchstage.strategies.activation_checkpointing import check_classes
from torchstage.strategies.fsdp import FSDP
from torchstage.strategies.materialize import is_meta
from torchstage.distributed.engine import Engine
from torchstage.strategies.mesh import build_mesh
from torchstage.strategies.precision import amp_dtype
from torchstage.strategies.resolve import resolve_strategy

MIB = 2 ** 20
COLUMNS = ("params", "grads", "optimizer", "activations", "buffers", "peak")


@dataclass
class RankMemory:
    """Bytes one rank holds (see the module): each part, and the estimated peak."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    activations: int = 0
    buffers: int = 0
    peak: int = 0


@dataclass
class MemoryPlan:
    """The plan of a run: the strategy and its layout, each rank's :class:`RankMemory`, and notes."""

    strategy: str
    world_size: int
    layout: str
    ranks: list
    notes: list = field(default_factory=list)

    def __str__(self) -> str:
        rows, groups = [], {}
        for rank, memory in enumerate(self.ranks):
            groups.setdefault(tuple(getattr(memory, c) for c in COLUMNS), []).append(rank)
        width = max(len(_ranks(r)) for r in groups.values())
        lines = [f"memory plan: {self.strategy} on {self.world_size} process(es){self.layout} (MiB per rank)",
                 f"{'ranks'.ljust(width)}  " + "  ".join(c.rjust(11) for c in COLUMNS)]
        for values, ranks in groups.items():
            rows.append(f"{_ranks(ranks).ljust(width)}  " + "  ".join(f"{v / MIB:11.1f}" for v in values))
        return "\n".join(lines + rows + [f"note: {n}" for n in self.notes])


def _ranks(ranks: list) -> str:
    """``0-3`` for a run of ranks, else the ranks listed."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def plan_memory(model: torch.nn.Module, strategy="ddp", world_size: int = 1, *, optimizer=None, inputs=None,
                criterion=None, targets=None, amp=None, activation_checkpointing=None, node_size: int = None,
                device: str = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of training ``model`` with ``strategy`` on ``world_size`` processes (``node_size`` of
    them per node; default all), ``optimizer`` (an instance or class; None: no state), one forward on ``inputs`` (a
    tensor, a tuple of arguments or a dict of keyword arguments, the per-process batch; None: no activations) and
    ``criterion(output, targets)``, under ``amp`` and ``activation_checkpointing`` as ``train()`` takes them, on
    ``device`` (``"cuda"`` or ``"cpu"``; default: CUDA where available)."""
    strategy = copy.copy(resolve_strategy(strategy))
    classes = check_classes(activation_checkpointing) if activation_checkpointing else ()
    dtype = amp_dtype(amp) if amp else None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    meta = meta_twin(model)
    sharded = isinstance(strategy, FSDP) and world_size > 1
    notes = [] if is_meta(model) or not sharded else [
        f"the model is built on a device: each rank first holds all of it ({_bytes(model.parameters()) / MIB:.1f} MiB) "
        f"before the strategy shards it; build it under torch.device('meta') to skip that"]
    factor, scalars = optimizer_factor(optimizer)
    if optimizer is None:
        notes.append("no optimizer given: no optimizer state counted")
    if inputs is None:
        notes.append("no batch given: activations not counted")
    forward = (lambda m: activation_bytes(m, inputs, classes, dtype, criterion, targets)) if inputs is not None \
        else (lambda m: (0, 0))
    if getattr(strategy, "pipe", None) is not None and sharded:  # a stage's input is the stage before's output
        forward = lambda m: (0, 0)  # noqa: E731
        if inputs is not None:
            notes.append("a pipeline: each rank's part (its stages) weighed; activations not counted under a pipeline")
    step = lambda trainable, largest: trainable if device == "cuda" else 2 * largest  # noqa: E731 (foreach on CUDA)
    if sharded:
        ranks, layout = _sharded(meta, strategy, world_size, node_size or world_size, forward, dtype)
    else:
        ranks, layout = _whole(meta, strategy, world_size, forward), ""
        if getattr(strategy, "name", None) == "deepspeed":
            notes.append("DeepSpeed: its ZeRO partitions are counted as FSDP's would be, not its own buffers")
    plan = []
    for r in ranks:
        optimizer_bytes = (factor * r["trainable"] + scalars * r["count"]) // r.get("optimizer_divisor", 1)
        buffers = r["buffers"]
        peak = r["params"] + optimizer_bytes + max(r["activations"] + buffers, r["trainable"] + buffers
                                                   + step(r["trainable"], r["largest"]))
        plan.append(RankMemory(r["params"], r["trainable"], optimizer_bytes, r["activations"], buffers, peak))
    return MemoryPlan(repr(strategy), world_size, layout, plan, notes)


def meta_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (no memory is copied)."""
    memo = {}
    for module in model.modules():
        for name, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is not None and id(t) not in memo:
                twin = torch.empty_like(t, device="meta")
                memo[id(t)] = torch.nn.Parameter(twin, t.requires_grad) if isinstance(t, torch.nn.Parameter) else twin
    return copy.deepcopy(model, memo)


def optimizer_factor(optimizer) -> tuple:
    """``(tensors of a parameter's size, bytes of scalars)`` that ``optimizer`` (an instance or a class) keeps per
    parameter, found by stepping one of its kind on a small tensor."""
    if optimizer is None:
        return 0, 0
    kind = optimizer if isinstance(optimizer, type) else type(optimizer)
    accepted = inspect.signature(kind.__init__).parameters
    defaults = {"lr": 1e-3} if isinstance(optimizer, type) else \
        {k: v for k, v in optimizer.defaults.items() if k in accepted}
    probe = torch.nn.Parameter(torch.zeros(7))
    try:
        instance = kind([probe], **defaults)
        probe.grad = torch.ones(7)
        instance.step()
    except Exception:
        return 0, 0
    state = [v for v in instance.state[probe].values() if torch.is_tensor(v)]
    full = sum(1 for v in state if v.shape == probe.shape)
    scalars = sum(v.numel() * v.element_size() for v in state if v.shape != probe.shape)
    return full, scalars


def _whole(model, strategy, world_size: int, forward) -> list:
    """Every rank holds the whole model (DDP, one process); DDP adds its gradient buckets; DeepSpeed ZeRO divides."""
    params = _bytes(model.parameters()) + _bytes(model.buffers())
    trainable = _bytes(p for p in model.parameters() if p.requires_grad)
    stage = getattr(strategy, "stage", None) or 0
    ddp = world_size > 1 and getattr(strategy, "name", None) == "ddp"
    activations, largest_saved = forward(model)
    if getattr(strategy, "name", None) == "deepspeed" and world_size > 1:
        params = params // world_size if stage >= 3 else params
        trainable = trainable // world_size if stage >= 2 else trainable
    count = sum(1 for p in model.parameters() if p.requires_grad)
    largest = max((p.numel() * p.element_size() for p in model.parameters()), default=0)
    row = {"params": params, "trainable": trainable, "activations": activations + largest_saved,
           "buffers": trainable if ddp else 0, "largest": largest, "count": count}
    if getattr(strategy, "name", None) == "deepspeed" and stage >= 1 and world_size > 1:
        row["optimizer_divisor"] = world_size
    return [row] * world_size


def _sharded(model, strategy, world_size: int, node_size: int, forward, dtype) -> tuple:
    """Each position in the tensor-parallel group simulated in a fake world: the strategy's own tensor parallelism
    and ``fully_shard`` on a meta copy, its local shapes read off (ranks of one position hold the same: FSDP pads
    every shard to the first's size)."""
    import torch.distributed as dist  # heavy; sharded plans only
    layout = strategy.layout(SimpleNamespace(world_size=world_size, local_size=node_size))
    if dist.is_initialized():
        raise RuntimeError("plan_memory runs without a world, in a fake one of its own: call it outside a run")
    positions, hook = {}, sys.excepthook
    place = [_position(layout.coordinates(rank)) for rank in range(world_size)]
    for key in dict.fromkeys(place):  # the first rank of each place in the pipeline and the tensor group
        rank = place.index(key)
        dist.init_process_group("fake", rank=rank, world_size=world_size)
        try:
            engine = Engine(device="cpu", rank=rank, world_size=world_size, node_size=node_size, layout=layout)
            positions[key] = _simulate(copy.deepcopy(model), copy.copy(strategy), engine, forward, dtype)
        finally:
            dist.destroy_process_group()
            sys.excepthook = hook  # init_process_group prefixes it with the (fake) rank
    text = " (" + " x ".join(f"{k} {v}" for k, v in layout.as_dict().items() if v > 1 or k == "shard") + ")"
    return [positions[key] for key in place], text


def _position(coordinates: dict) -> tuple:
    """Where a rank's figures differ: its pipeline stage(s) and its place in the tensor group (the data-parallel
    ranks of one place hold the same: FSDP pads every shard to the first's size)."""
    return coordinates.get("pipeline", 0), coordinates.get("tensor", 0)


def _simulate(model, strategy, engine, forward, dtype) -> dict:
    """One rank's figures: the strategy (a copy, given the fake world's ``engine`` and mesh; no checkpoint IO, whose
    groups a fake world cannot make) applies its tensor parallelism, the activations are measured, then it shards
    ``model``."""
    strategy.engine, strategy.mesh = engine, build_mesh(engine.layout, "cpu")
    if getattr(strategy, "pipe", None) is not None:  # under a pipeline: the part this rank's stages hold
        model = strategy.pipe.part_of(model, engine.coordinates["pipeline"])
    model = strategy.parallelize(model)
    activations, largest_saved = forward(model)
    units = [_bytes(u.parameters(), dtype) for u in strategy.units(model)]
    root = _bytes(model.parameters(), dtype) - sum(units)
    if getattr(strategy, "pipe", None) is not None and engine.dp_size == 1:  # stages alone: nothing to gather
        units, root = [], 0
    else:
        strategy.shard_models({"model": model}, dtype)
    params = _bytes(model.parameters()) + _bytes(model.buffers())
    trainable = _bytes(p for p in model.parameters() if p.requires_grad)
    largest_unit = max(units, default=0)
    gathered = sum(units) if not strategy.reshard_after_forward else 2 * largest_unit
    return {"params": params, "trainable": trainable, "activations": activations + largest_saved,
            "buffers": root + gathered + largest_unit, "count": sum(1 for p in model.parameters() if p.requires_grad),
            "largest": max((_local(p).numel() * p.element_size() for p in model.parameters()), default=0)}


def _local(tensor):
    """The part this rank holds of ``tensor`` (a DTensor's local tensor; a plain tensor itself)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _bytes(tensors, dtype=None) -> int:
    """The bytes this rank holds of ``tensors`` (a DTensor's local part), each once; in ``dtype`` when given."""
    seen, total = set(), 0
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        local = _local(t)
        size = torch.empty((), dtype=dtype).element_size() if dtype is not None and t.is_floating_point() else \
            local.element_size()
        total += local.numel() * size
    return total


def activation_bytes(model, inputs, classes=(), dtype=None, criterion=None, targets=None) -> tuple:
    """``(bytes kept for backward, the largest one tensor)``: one forward (and criterion) of ``model`` (in ``dtype``
    when given) on fake copies of ``inputs`` (shapes only), counting each storage autograd saves once; with
    ``classes`` checkpointed, each block keeps its input and the largest block's saved tensors come back at a time."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # shapes without data, as torch's tracers use them
    if dtype is not None:  # computing in bf16 (FSDP's mixed precision casts the parameters; autocast, most ops)
        model = copy.deepcopy(model).to(dtype)
    params = {id(p) for p in model.parameters()}
    saved, blocks, stack, inputs_kept = {}, {}, [], {}

    def pack(t):
        base = getattr(t, "_base", None)
        if id(t) not in params and (base is None or id(base) not in params):
            local = _local(t)
            key = local.untyped_storage()._cdata
            if key not in saved:
                saved[key] = local.numel() * local.element_size()
                owner = stack[-1] if stack else None
                blocks[owner] = blocks.get(owner, 0) + saved[key]
        return t

    def enter(module, args, kwargs):
        first = next((a for a in (*args, *kwargs.values()) if torch.is_tensor(a)), None)
        inputs_kept[id(module)] = 0 if first is None else _local(first).numel() * _local(first).element_size()
        stack.append(id(module))

    def leave(*_):
        stack.pop()

    handles = []
    for module in model.modules():
        if classes and isinstance(module, classes):
            handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(module.register_forward_hook(leave))
    try:
        # fake tensors: a model that looks at its inputs' values (a transformers attention mask) skips that, as when
        # compiled, where meta tensors would fail
        with FakeTensorMode(allow_non_fake_inputs=True), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = _call(model.train(), _to_meta(inputs, dtype))
            if criterion is not None and targets is not None:
                criterion(output, _to_meta(targets, dtype))
    finally:
        for handle in handles:
            handle.remove()
    outside = blocks.pop(None, 0)
    kept = outside + (sum(inputs_kept.values()) + max(blocks.values(), default=0) if classes else sum(blocks.values()))
    return kept, max(saved.values(), default=0)


def _call(model, inputs):
    """``model`` called on ``inputs``: a tensor, a tuple of arguments or a dict of keyword arguments."""
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def _to_meta(tree, dtype=None):
    """``tree``'s tensors as meta tensors (floating ones in ``dtype`` when given)."""
    if torch.is_tensor(tree):
        kind = dtype if dtype is not None and tree.is_floating_point() else tree.dtype
        return torch.empty(tree.shape, dtype=kind, device="meta")
    if isinstance(tree, dict):
        return {k: _to_meta(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_meta(v, dtype) for v in tree)
    return tree
