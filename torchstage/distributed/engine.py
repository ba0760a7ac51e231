"""The engine: who this process is (device, rank, world, its place in the device mesh) and the collectives between
the ranks, identities alone.

An :class:`Engine` is immutable and made once per run, from the world the process entered and the layout its
strategy declares (:meth:`Engine.for_world`); the strategy then connects to the finished engine. Everything that
follows from the layout (which batches a rank trains, whether it counts its samples) is computed here, from the
layout, never written in later. The engine knows no strategy: the runner holds that (``runner.strategy``).
"""
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional

import torch

from torchstage.distributed import collectives
from torchstage.distributed.layout import MeshLayout, node_size


def default_device() -> torch.device:
    """The first visible GPU if there is one, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@dataclass(frozen=True)
class Engine:
    """Device and place in the world of one process of a run (a world of 1 by default), with collectives."""

    device: Optional[torch.device] = None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    channels_last: bool = False  # 4-D inputs and models in NHWC memory format (faster convolutions)
    prefetch: bool = False  # copy the next batch to the GPU while the current one trains
    node_size: Optional[int] = 1  # processes on this node (None: the launcher does not say; 1 alone)
    #: The device mesh's layout, from the strategy (None: every rank trains its own batches, ``replicate`` = world).
    layout: Optional[MeshLayout] = None
    #: The world's nodes (``{"host", "agent", "ranks"}``), gathered as a run starts (launch/membership).
    nodes: Any = field(default=None, compare=False)

    def __post_init__(self):
        device = torch.device(self.device) if self.device is not None else default_device()
        object.__setattr__(self, "device", device)
        layout = self.layout if self.layout is not None else MeshLayout(replicate=self.world_size)
        if layout.size != self.world_size:
            model = "".join(f" x {n} {name}-parallel" for name, n in layout.model_dims().items() if n > 1)
            raise ValueError(f"a mesh of {layout.dp_size} data-parallel{model} ranks does not make a world of "
                             f"{self.world_size} ({layout})")
        object.__setattr__(self, "layout", layout)

    @classmethod
    def for_world(cls, world, layout: MeshLayout = None, **settings) -> "Engine":
        """The engine of ``world``'s process in ``layout`` (None: pure data parallel): under several processes its
        rank and device (its GPU under NCCL, else the CPU), alone the default device; ``settings`` are the other
        fields (``channels_last``, ``nodes``...)."""
        if not world.is_distributed:
            return cls(layout=layout, **settings)
        device = torch.device("cuda", world.local_rank) if world.backend == "nccl" else torch.device("cpu")
        return cls(device=device, rank=world.rank, world_size=world.world_size, local_rank=world.local_rank,
                   node_size=node_size(world), layout=layout, **settings)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    # ---- the place in the mesh (from the layout) -------------------------------------------------
    @cached_property
    def coordinates(self) -> dict:
        """Name -> this rank's coordinate along each mesh dimension."""
        return self.layout.coordinates(self.rank)

    @cached_property
    def dp_rank(self) -> int:
        """This process's data-parallel rank: loaders split data by it (the ranks of a model-parallel group share it)."""
        return self.layout.data_rank(self.rank)

    @property
    def dp_size(self) -> int:
        """The number of different batches a step trains: the product of the data dimensions."""
        return self.layout.dp_size

    @property
    def tp_rank(self) -> int:
        """Its coordinate in its tensor-parallel group."""
        return self.coordinates["tensor"]

    @property
    def tp_size(self) -> int:
        """The size of its tensor-parallel group (ranks that train the same batch, each a part of the model)."""
        return self.layout.tensor

    @property
    def model_parallel_size(self) -> int:
        """The ranks that train one batch together (the product of the model dimensions)."""
        return math.prod(self.layout.model_dims().values())

    @cached_property
    def counts_samples(self) -> bool:
        """False on the ranks of a model-parallel group but one (its first; a pipeline's last stage, which holds the
        outputs): they train that one's samples, which metrics count once."""
        return self.layout.counts_samples(self.rank)

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
        return collectives.all_reduce_(tensor, self.world_size, op)

    def all_reduce_samples_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum per-sample quantities (sums, counts) over the ranks in place, each sample once: the ranks of a
        model-parallel group but its first add zeros (they trained the same samples)."""
        if self.is_distributed and not self.counts_samples:
            tensor.zero_()
        return self.all_reduce_(tensor)

    def all_gather_samples(self, tensor: torch.Tensor) -> torch.Tensor:
        """Per-sample rows (dim 0) of every rank concatenated, each sample once (see :meth:`all_reduce_samples_`)."""
        return self.all_gather_cat(tensor if self.counts_samples else tensor[:0])

    def all_gather_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate along dim 0 the tensors of every rank, in rank order; sizes may differ."""
        return collectives.all_gather_cat(tensor, self.world_size)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` from rank ``src`` on every rank."""
        return collectives.broadcast_object(obj, self.world_size, src)

    def all_gather_object(self, obj: Any) -> list:
        """A list of ``obj`` from every rank, in rank order."""
        return collectives.all_gather_object(obj, self.world_size)

    def barrier(self) -> None:
        collectives.barrier(self.world_size)


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
