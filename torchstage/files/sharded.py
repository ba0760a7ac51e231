"""Sharded checkpoints: a directory written by every rank with ``torch.distributed.checkpoint`` (DCP).

A name such as ``last.pth`` is a symbolic link to a data directory ``.sharded-<id>`` in the same folder.
Every rank writes its shards into a new data directory; once all have finished, the main rank switches
each name to it with an atomic rename of a new link, then deletes data directories no name points to.
A crash at any moment leaves each name on a complete checkpoint. Loading reads the whole checkpoint
into plain tensors on one process (any world size): the same dict a single-file checkpoint holds.
DCP's ``.metadata`` file is a pickle: it is read with an unpickler that builds only DCP's own
metadata classes and torch dtypes, so loading runs no code from the file.
"""
import glob
import io
import os
import pickle
import shutil
import uuid

import torch

from torchstage.files.atomic import fsync_folder
from torchstage.files.format import FORMAT, CheckpointError

DATA_PREFIX = ".sharded-"
_TORCH_NAMES = ("Size",)
#: Other globals DCP metadata refers to: containers, paths, and torch's layout-by-name lookup.
_PLAIN = (("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("pathlib", "PosixPath"),
          ("pathlib", "PurePosixPath"), ("torch.serialization", "_get_layout"))


def is_sharded(path: str) -> bool:
    """True for a checkpoint directory (or a link to one) written by :func:`save_sharded`."""
    return os.path.isdir(path)


def save_sharded(checkpoint: dict, paths: list, engine) -> None:
    """Write ``checkpoint`` from every rank, then point each of ``paths`` at it (collective)."""
    import torch.distributed.checkpoint as dcp  # heavy: only sharded runs pay for it
    folder = os.path.dirname(os.path.abspath(paths[0]))
    data = os.path.join(folder, DATA_PREFIX + engine.broadcast_object(uuid.uuid4().hex[:12]))
    if engine.is_main:
        os.makedirs(data, exist_ok=True)
    engine.barrier()
    checkpoint = {**checkpoint, "meta": {**checkpoint.get("meta", {}), "sharded": True}}
    try:
        dcp.save(checkpoint, storage_writer=dcp.FileSystemWriter(data, sync_files=True),
                 no_dist=not engine.is_distributed)
    except OSError as e:
        raise CheckpointError(f"could not write sharded checkpoint {paths[0]!r}: {e}; the previous one, "
                              f"if any, is unchanged") from e
    engine.barrier()  # every rank's shards and the metadata are on disk
    if engine.is_main:
        fsync_folder(data)
        for path in paths:
            _point(path, os.path.basename(data))
        fsync_folder(folder)
        collect_garbage(folder, keep=data)


def _point(path: str, target: str) -> None:
    """Make ``path`` a link to ``target`` atomically (a new link renamed over the old name)."""
    tmp = f"{path}.{os.getpid()}.link"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    os.replace(tmp, path)


def collect_garbage(folder: str, keep: str = None) -> None:
    """Delete data directories that no name in ``folder`` points to (and what a crash left half made)."""
    for stale in glob.glob(os.path.join(folder, "*.link")):
        os.remove(stale)
    used = {os.path.realpath(p) for p in glob.glob(os.path.join(folder, "*")) if os.path.islink(p)}
    for data in glob.glob(os.path.join(folder, DATA_PREFIX + "*")):
        if os.path.realpath(data) not in used and data != keep:
            shutil.rmtree(data, ignore_errors=True)


def load_sharded(path: str) -> dict:
    """The whole checkpoint in ``path`` as plain tensors and values, read by this process alone."""
    from torch.distributed.checkpoint import FileSystemReader  # heavy: only sharded checkpoints need it
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata_path = os.path.join(path, ".metadata")
            with open(metadata_path, "rb") as f:
                metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
            if getattr(metadata, "storage_meta", None) is None:
                from torch.distributed.checkpoint.metadata import StorageMeta  # heavy: only sharded checkpoints need it
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise CheckpointError(f"{path!r} is not a complete sharded checkpoint: it has no .metadata file")
    checkpoint = {}
    try:
        _load_state_dict(checkpoint, storage_reader=SafeReader(path), planner=_EmptyStateDictLoadPlanner(),
                         no_dist=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"refused to load {path!r}: {e}") from None
    except (RuntimeError, OSError, EOFError) as e:
        raise CheckpointError(f"could not read sharded checkpoint {path!r}: {e}") from None
    if checkpoint.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not a torchstage checkpoint: format is {checkpoint.get('format')!r}, "
                              f"expected {FORMAT!r}")
    return checkpoint


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata dataclasses and enums, torch dtypes/layouts/Size, paths and plain containers only."""

    def find_class(self, module, name):
        if module.startswith("torch.distributed.checkpoint."):
            obj = super().find_class(module, name)
            if isinstance(obj, type):
                return obj
        elif module == "torch":
            obj = getattr(torch, name, None)
            if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)) or name in _TORCH_NAMES:
                return obj
        elif (module, name) in _PLAIN:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the checkpoint metadata names {module}.{name}, which a sharded checkpoint "
                                     f"never holds; torchstage does not run code from checkpoint files")
