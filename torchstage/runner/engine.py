"""The engine: where tensors live, who this process is, its strategy, and collectives that are no-ops alone.

It is built once per run from the world the process entered and the run's strategy (:meth:`Engine.for_world`),
which it is then given once (:meth:`~torchstage.strategies.base.Strategy.connect`); callbacks reach the strategy
through it (``runner.engine.strategy``) for backward and the optimizer step.
"""
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from torchstage.strategies.single import SingleDevice


def default_device() -> torch.device:
    """The first visible GPU if there is one, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@dataclass
class Engine:
    """Device, place in the world and strategy of one process of a run (a world of 1 by default), with collectives."""

    device: torch.device = None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    channels_last: bool = False  # 4-D inputs and models in NHWC memory format (faster convolutions)
    prefetch: bool = False  # copy the next batch to the GPU while the current one trains
    strategy: Any = None  # placement, wrapping, sync, clipping, checkpoint state (default: SingleDevice())
    node_size: Optional[int] = 1  # processes on this node (None: the launcher does not say; 1 alone)
    #: This process's data-parallel coordinate and the number of different batches a step trains (default: its rank
    #: and the world size); set by a strategy whose device mesh has a tensor-parallel dimension.
    dp_rank: Optional[int] = None
    dp_size: Optional[int] = None
    #: Its coordinate in its tensor-parallel group and the group's size: the ``tp_size`` ranks of a group train the
    #: same batch, and only the group's first (``tp_rank == 0``) counts its samples in metrics.
    tp_rank: int = 0
    tp_size: int = 1
    nodes: Any = None  # the world's nodes ({"host", "agent", "ranks"}), gathered as a run starts (launch/membership)

    def __post_init__(self):
        self.device = torch.device(self.device) if self.device is not None else default_device()
        if self.strategy is None:
            self.strategy = SingleDevice()
        if self.dp_rank is None:
            self.dp_rank, self.dp_size = self.rank, self.world_size

    @classmethod
    def for_world(cls, world, strategy=None, **settings) -> "Engine":
        """The engine of ``world``'s process: under several processes its rank and device (its GPU under NCCL,
        else the CPU), alone the default device; ``settings`` are placement fields (``channels_last``...)."""
        if not world.is_distributed:
            return cls(strategy=strategy, **settings)
        device = torch.device("cuda", world.local_rank) if world.backend == "nccl" else torch.device("cpu")
        return cls(device=device, rank=world.rank, world_size=world.world_size, local_rank=world.local_rank,
                   strategy=strategy, node_size=world.local_size, **settings)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def counts_samples(self) -> bool:
        """False on the ranks of a tensor-parallel group but its first: they train the first one's samples, which
        metrics count once."""
        return self.tp_rank == 0

    def set_data_parallel(self, dp_rank: int, dp_size: int, tp_rank: int = 0, tp_size: int = 1) -> None:
        """Place this process in a device mesh (a strategy's, as it connects): loaders split data by ``dp_rank`` of
        ``dp_size``; ranks sharing a ``dp_rank`` form a tensor-parallel group of ``tp_size``."""
        if dp_size * tp_size != self.world_size:
            raise ValueError(f"a mesh of {dp_size} data-parallel x {tp_size} tensor-parallel ranks does not make a "
                             f"world of {self.world_size}")
        self.dp_rank, self.dp_size, self.tp_rank, self.tp_size = dp_rank, dp_size, tp_rank, tp_size

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` through the strategy (scaled under float16): a custom ``handle_batch``'s backward,
        as Catalyst 22's ``self.engine.backward(loss)``."""
        self.strategy.backward(loss, None)

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

    # ---- collectives (identity on one process) ---------------------------------------------
    def all_reduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` in place across ranks (``sum``, ``max`` or ``min``) and return it."""
        if self.is_distributed:
            dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                        "min": dist.ReduceOp.MIN}[op])
        return tensor

    def all_reduce_samples_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum per-sample quantities (sums, counts) over the ranks in place, each sample once: the ranks of a
        tensor-parallel group but its first add zeros (they trained the same samples)."""
        if self.is_distributed and not self.counts_samples:
            tensor.zero_()
        return self.all_reduce_(tensor)

    def all_gather_samples(self, tensor: torch.Tensor) -> torch.Tensor:
        """Per-sample rows (dim 0) of every rank concatenated, each sample once (see :meth:`all_reduce_samples_`)."""
        return self.all_gather_cat(tensor if self.counts_samples else tensor[:0])

    def all_gather_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate along dim 0 the tensors of every rank, in rank order; sizes may differ."""
        if not self.is_distributed:
            return tensor
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
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list:
        """A list of ``obj`` from every rank, in rank order."""
        if not self.is_distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.is_distributed:
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
