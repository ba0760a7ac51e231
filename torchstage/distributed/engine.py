"""The engine: where tensors live and who this process is, with collectives that are no-ops alone."""
import contextlib
from dataclasses import dataclass
from typing import Any

import torch


def default_device() -> torch.device:
    """The first visible GPU if there is one, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@dataclass
class Engine:
    """Device placement and process-group operations for one process of a run (world of 1 by default)."""

    device: torch.device = None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    channels_last: bool = False  # 4-D inputs and models in NHWC memory format (faster convolutions)
    prefetch: bool = False  # copy the next batch to the GPU while the current one trains

    def __post_init__(self):
        self.device = torch.device(self.device) if self.device is not None else default_device()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    # ---- placement -------------------------------------------------------------------------
    @property
    def moves_batches(self) -> bool:
        """False when batches are used as the loader yields them (CPU, default memory format)."""
        return self.device.type != "cpu" or self.channels_last

    def to_device(self, obj: Any) -> Any:
        """Move every tensor inside ``obj`` (tensors, dicts, lists, tuples) to this engine's device."""
        if not self.moves_batches:
            return obj
        return _move(obj, self.device, self.device.type == "cuda", self.channels_last)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Put a model on the device; a distributed engine also wraps it (DDP/FSDP)."""
        if self.channels_last:
            return model.to(self.device, memory_format=torch.channels_last)
        return model.to(self.device)

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap a placed model for the run (DDP under several processes); identity on one process."""
        return model

    def no_sync(self, model):
        """A context in which backward passes skip gradient sync (accumulation steps); a no-op alone."""
        return contextlib.nullcontext()

    @staticmethod
    def unwrap(model: torch.nn.Module) -> torch.nn.Module:
        """The plain module under DDP/FSDP or ``torch.compile`` wrappers."""
        while True:
            inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
            if not isinstance(inner, torch.nn.Module):
                return model
            model = inner

    # ---- collectives (identity on one process) ---------------------------------------------
    def all_reduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` in place across ranks (``sum``, ``max`` or ``min``) and return it."""
        if self.is_distributed:
            import torch.distributed as dist
            dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                        "min": dist.ReduceOp.MIN}[op])
        return tensor

    def all_gather_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate along dim 0 the tensors of every rank, in rank order; sizes may differ."""
        if not self.is_distributed:
            return tensor
        import torch.distributed as dist
        size = torch.tensor([tensor.shape[0]], device=tensor.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        dist.all_gather(sizes, size)
        sizes = [int(s) for s in sizes]
        padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        out = [torch.zeros_like(padded) for _ in range(self.world_size)]
        dist.all_gather(out, padded)
        return torch.cat([t[:n] for t, n in zip(out, sizes)])

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` from rank ``src`` on every rank."""
        if not self.is_distributed:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list:
        """A list of ``obj`` from every rank, in rank order."""
        if not self.is_distributed:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.is_distributed:
            import torch.distributed as dist
            dist.barrier()


def _move(obj, device, non_blocking, channels_last=False):
    if isinstance(obj, torch.Tensor):
        obj = obj.to(device, non_blocking=non_blocking)
        return obj.contiguous(memory_format=torch.channels_last) if channels_last and obj.dim() == 4 else obj
    if isinstance(obj, dict):
        return {k: _move(v, device, non_blocking, channels_last) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [_move(v, device, non_blocking, channels_last) for v in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
    return obj
