"""The device mesh of the sharded strategies: a layout ``replicate x shard x tensor`` checked against the world,
built once with torch's ``init_device_mesh``, and the process's data-parallel place in it.

Ranks are laid out row-major, the tensor dimension innermost: rank = (r x shard + s) x tensor + t. So a
tensor-parallel group is ``tensor`` consecutive ranks (on one node when ``tensor`` divides the node's ranks), a
shard group spans the next dimension, and the replicas are the outermost (across nodes for HSDP). The data-parallel
coordinate of a rank is ``rank // tensor``: the ranks of a tensor-parallel group train the same batch.
"""
import logging
import numbers
from dataclasses import dataclass

import torch

from torchstage.logging_setup import at_level

#: The logger of DTensor's redistribution, which warns when a 2-D partial norm is reduced one dimension at a time.
_REDISTRIBUTE_LOG = "torch.distributed.tensor._redistribute"
#: The names of the mesh's dimensions, outermost first.
DIMS = ("replicate", "shard", "tensor")


@dataclass(frozen=True)
class MeshLayout:
    """How many ranks replicate the model (``replicate``), shard it (``shard``) and split its layers
    (``tensor``); their product is the world size."""

    replicate: int = 1
    shard: int = 1
    tensor: int = 1

    @property
    def size(self) -> int:
        return self.replicate * self.shard * self.tensor

    @property
    def dp_size(self) -> int:
        """Ranks that train different batches: the replicas times the shards."""
        return self.replicate * self.shard

    def __str__(self) -> str:
        return " x ".join(f"{name} {getattr(self, name)}" for name in DIMS)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in DIMS}


def check_degree(owner: str, name: str, value, allow_none: bool = True):
    """``value`` as a mesh degree (an integer >= 1, or None where ``allow_none``); ValueError naming
    ``owner(name=...)`` otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{owner}({name}=...) must be an integer >= 1{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    return int(value)


def complete(owner: str, world: int, tensor: int, replicate, shard, default_shard: int) -> MeshLayout:
    """The layout of ``world`` ranks with ``tensor``-way tensor parallelism and the data-parallel degrees given
    (None: derived; both None: ``default_shard`` ranks shard, the rest replicate); ValueError, before training,
    naming both numbers when they do not make the world."""
    data = world // tensor if world % tensor == 0 else None
    if data is None:
        raise ValueError(f"{owner}: tensor={tensor} does not divide the world of {world} processes; give a tensor "
                         f"degree that divides it")
    if replicate is None and shard is None:
        shard = default_shard
    if shard is None:
        shard = data // replicate if data % replicate == 0 else None
        if shard is None:
            raise ValueError(f"{owner}: replicate={replicate} does not divide the {data} data-parallel ranks of "
                             f"{world} processes{_over(tensor)}; give replicate x shard = {data}")
    if replicate is None:
        replicate = data // shard if data % shard == 0 else None
        if replicate is None:
            raise ValueError(f"{owner}: shard={shard} does not divide the {data} data-parallel ranks of {world} "
                             f"processes{_over(tensor)}; give replicate x shard = {data}")
    layout = MeshLayout(replicate, shard, tensor)
    if layout.size != world:
        raise ValueError(f"{owner}: replicate x shard{' x tensor' if tensor > 1 else ''} = {replicate} x {shard}"
                         f"{f' x {tensor}' if tensor > 1 else ''} = {layout.size} ranks, but the world has {world} "
                         f"processes; the product must equal the world size")
    return layout


def _over(tensor: int) -> str:
    return f" (the world over tensor={tensor})" if tensor > 1 else ""


def build_mesh(layout: MeshLayout, device_type: str):
    """torch's ``DeviceMesh`` of ``layout`` (collective: every rank builds it), its dimensions named
    :data:`DIMS`."""
    from torch.distributed.device_mesh import init_device_mesh  # heavy; mesh strategies only
    return init_device_mesh(device_type, (layout.replicate, layout.shard, layout.tensor), mesh_dim_names=DIMS)


def data_mesh(mesh, layout: MeshLayout):
    """The sub-mesh FSDP shards over: 2-D (replicate, shard) for HSDP, else the shard dimension."""
    return mesh["replicate", "shard"] if layout.replicate > 1 else mesh["shard"]


def place(engine, layout: MeshLayout) -> None:
    """Give ``engine`` its data-parallel coordinate in ``layout`` (tensor innermost, see the module)."""
    engine.set_data_parallel(engine.rank // layout.tensor, layout.dp_size, engine.rank % layout.tensor,
                             layout.tensor)


def by_mesh(tensors: list) -> dict:
    """``tensors`` grouped by the device mesh of each (None for plain tensors), in order."""
    groups = {}
    for tensor in tensors:
        groups.setdefault(getattr(tensor, "device_mesh", None), []).append(tensor)  # meshes compare by ranks, names
    return groups


def total_norm(grads: list) -> torch.Tensor:
    """The 2-norm of all of ``grads`` on every rank: plain tensors, or DTensors on any device meshes (tensor-parallel
    parameters live on a 2-D mesh, the rest on the data mesh: torch's ``get_total_norm`` takes one mesh)."""
    norms = []
    for group in by_mesh(grads).values():
        with at_level(_REDISTRIBUTE_LOG, logging.ERROR):  # its "2 sequential all_reduce" advice: every rank gets the same sum
            norm = torch.nn.utils.get_total_norm(group)
            norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if len(norms) == 1:
        return norms[0]
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))

