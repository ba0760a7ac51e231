"""The device mesh of the sharded strategies, built once with torch's ``init_device_mesh`` from the engine's layout
(:class:`~torchstage.distributed.layout.MeshLayout`, whose arithmetic says which rank sits where), and the gradient
norm over the meshes a model's parameters live on.

Ranks are laid out row-major, the tensor dimension innermost: a tensor-parallel group is ``tensor`` consecutive
ranks (on one node when ``tensor`` divides the node's ranks), a shard group spans the next dimension, and the
replicas are the outermost (across nodes for HSDP).
"""
import logging

import torch

from torchstage.distributed.layout import MeshLayout
from torchstage.logging_setup import at_level

#: The logger of DTensor's redistribution, which warns when a 2-D partial norm is reduced one dimension at a time.
_REDISTRIBUTE_LOG = "torch.distributed.tensor._redistribute"


def build_mesh(layout: MeshLayout, device_type: str):
    """torch's ``DeviceMesh`` of ``layout`` (collective: every rank builds it), its dimensions named as the layout's."""
    from torch.distributed.device_mesh import init_device_mesh  # heavy; mesh strategies only
    dims = layout.as_dict()  # a pipeline of one stage is no dimension
    return init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))


def data_mesh(mesh, layout: MeshLayout):
    """The sub-mesh FSDP shards over: 2-D (replicate, shard) for HSDP, else the shard dimension."""
    return mesh["replicate", "shard"] if layout.replicate > 1 else mesh["shard"]


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

