"""The collectives of a world of ``world_size`` ranks over the default process group, each the identity alone: what
:class:`~torchstage.distributed.engine.Engine` runs, also callable before an engine exists (the membership a run
gathers to build its engine)."""
from typing import Any

import torch
import torch.distributed as dist

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def all_reduce_(tensor: torch.Tensor, world_size: int, op: str = "sum", group=None) -> torch.Tensor:
    """Reduce ``tensor`` in place across ranks (``sum``, ``max`` or ``min``) and return it."""
    if world_size > 1:
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, _OPS[op]), group=group)
    return tensor


def all_gather_object(obj: Any, world_size: int, group=None) -> list:
    """A list of ``obj`` from every rank, in rank order."""
    if world_size == 1:
        return [obj]
    out = [None] * world_size
    dist.all_gather_object(out, obj, group=group)
    return out


def all_gather_cat(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    """Concatenate along dim 0 the tensors of every rank, in rank order; sizes may differ."""
    if world_size == 1:
        return tensor
    size = torch.tensor([tensor.shape[0]], device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    sizes = [int(s) for s in sizes]
    padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    out = [torch.zeros_like(padded) for _ in range(world_size)]
    dist.all_gather(out, padded)
    return torch.cat([t[:n] for t, n in zip(out, sizes)])


def broadcast_object(obj: Any, world_size: int, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank."""
    if world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(world_size: int) -> None:
    if world_size > 1:
        dist.barrier()
