"""Sharded checkpoints: a directory written by every rank with ``torch.distributed.checkpoint`` (DCP).

A name such as ``last.pth`` is a symbolic link to a data directory ``.sharded-<id>`` in the same folder.
Every rank writes its shards into a new data directory; once all have finished, the main rank switches
each name to it with an atomic rename of a new link, then deletes data directories no name points to.
A crash at any moment leaves each name on a complete checkpoint. Loading reads the whole checkpoint
into plain tensors on one process (any world size): the same dict a single-file checkpoint holds.
DCP's ``.metadata`` file is a pickle: it is read with an unpickler that builds only an explicit list of
DCP's metadata classes and torch dtypes, so loading runs no code from the file.
"""
import functools
import glob
import importlib
import io
import os
import pickle
import shutil
import uuid

import torch

from torchstage.files.atomic import fsync_folder
from torchstage.files.checkpoint_file import unpickling_reason as _unpickling_reason
from torchstage.files.checkpoint_format import FORMAT, CheckpointError
from torchstage.files.writer import hand_over

DATA_PREFIX = ".sharded-"
#: The key under which a sharded checkpoint lists the key paths of its empty dicts (DCP keeps no empty dict).
EMPTY_DICTS = "empty_dicts"


def is_sharded(path: str) -> bool:
    """True for a checkpoint directory (or a link to one) written by :func:`save_sharded`."""
    return os.path.isdir(path)


def save_sharded(checkpoint: dict, paths: list, engine, before_last=None, writer=None, group=None) -> None:
    """Write ``checkpoint`` from every rank, then point each of ``paths`` at it in order, ``before_last()`` run
    (on the main rank) before the last (collective).

    With a :class:`~torchstage.files.writer.FileWriter` the save does not block training: DCP's ``async_save``
    copies each rank's shards to host memory here and writes them from a thread of its own, its collectives on
    ``group`` (a process group of the checkpoints', so they never meet training's); the main rank's writer
    thread then waits for the save to complete on every rank and switches the names. Until then the names
    point at the previous checkpoint, so a crash during the save leaves it as ``last``.
    """
    import torch.distributed.checkpoint as dcp  # heavy: only sharded runs pay for it
    folder = os.path.dirname(os.path.abspath(paths[0]))
    data = os.path.join(folder, DATA_PREFIX + engine.broadcast_object(uuid.uuid4().hex[:12]))
    if engine.is_main:
        os.makedirs(data, exist_ok=True)
    engine.barrier()
    checkpoint = {**checkpoint, "meta": {**checkpoint.get("meta", {}), "sharded": True},
                  EMPTY_DICTS: _empty_dict_paths(checkpoint)}
    storage = dcp.FileSystemWriter(data, sync_files=True)
    if writer is not None:
        future = dcp.async_save(checkpoint, storage_writer=storage, process_group=group,
                                no_dist=not engine.is_distributed)
        finish = functools.partial(_finish, future, paths, data, before_last, engine.is_main)
        hand_over(writer, finish)
        return
    try:
        dcp.save(checkpoint, storage_writer=storage, no_dist=not engine.is_distributed)
    except OSError as e:
        raise CheckpointError(f"could not write sharded checkpoint {paths[0]!r}: {e}; the previous one, "
                              f"if any, is unchanged") from e
    engine.barrier()  # every rank's shards and the metadata are on disk
    if engine.is_main:
        switch(paths, data, before_last)


def _finish(future, paths: list, data: str, before_last, main: bool) -> None:
    """In the writer's thread: wait for an async save; on the main rank, whose save completes once every rank's
    shards and the metadata are written, point the names at it."""
    try:
        future.result()
    except Exception as e:
        raise CheckpointError(f"could not write sharded checkpoint {paths[0]!r}: {e}; the previous one, if any, is "
                              f"unchanged") from e
    if main:
        switch(paths, data, before_last)


def switch(paths: list, data: str, before_last) -> None:
    """Point each of ``paths`` at the complete checkpoint ``data`` in order (``before_last()`` before the last),
    then delete the data directories no name points to."""
    folder = os.path.dirname(os.path.abspath(paths[0]))
    fsync_folder(data)
    for index, path in enumerate(paths):
        if before_last is not None and index == len(paths) - 1:
            before_last()
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
    """The whole checkpoint in ``path`` as plain tensors and values, read by this process alone.

    Its ``.metadata`` is read first, by :class:`_MetadataUnpickler`; a damaged or foreign file is a
    :class:`~torchstage.files.checkpoint_format.CheckpointError`, as any error of DCP's reading it."""
    from torch.distributed.checkpoint import FileSystemReader  # heavy: only sharded checkpoints need it
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from torch.distributed.checkpoint._traverse import set_element

    metadata = read_metadata(path)

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(_EmptyStateDictLoadPlanner):
        """DCP's planner, but the non-tensor values of the data files are read with ``weights_only=True`` (DCP's
        own reads them with ``weights_only=False``, running whatever a crafted file pickled)."""

        def load_bytes(self, read_item, value) -> None:
            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as e:
                raise _Refused(f"a data file holds a value under {read_item.dest_index.fqn!r} that only unpickling "
                               f"code could rebuild ({_unpickling_reason(e)}); torchstage does not run code from "
                               f"checkpoint files") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    checkpoint = {}
    try:
        _load_state_dict(checkpoint, storage_reader=SafeReader(path), planner=SafePlanner(), no_dist=True)
    except _Refused as e:
        raise CheckpointError(f"refused to load {path!r}: {e}") from None
    except CheckpointException as e:  # DCP wraps what its reader raised, ours included
        refused = [error for error in _wrapped_errors(e) if isinstance(error, _Refused)]
        if refused:
            raise CheckpointError(f"refused to load {path!r}: {refused[0]}") from None
        raise CheckpointError(f"could not read sharded checkpoint {path!r}: {_first_line(e)}") from None
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, AssertionError) as e:
        raise CheckpointError(f"could not read sharded checkpoint {path!r}: {_first_line(e)}") from None
    if checkpoint.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not a torchstage checkpoint: format is {checkpoint.get('format')!r}, "
                              f"expected {FORMAT!r}")
    _restore_empty_dicts(checkpoint, checkpoint.pop(EMPTY_DICTS, None))
    return checkpoint


def _empty_dict_paths(node, path=()) -> list:
    """The key paths of the empty dicts in ``node`` (a run without a scheduler, an optimizer with no state yet),
    which DCP does not keep."""
    if not isinstance(node, dict):
        return []
    if not node:
        return [list(path)]
    return [found for key, value in node.items() for found in _empty_dict_paths(value, (*path, key))]


def _restore_empty_dicts(checkpoint: dict, paths) -> None:
    """Put back the empty dicts DCP left out: at ``paths``, or (a checkpoint written before they were recorded)
    the format's own containers and each optimizer's ``state``."""
    if paths is None:
        paths = [[key] for key in ("models", "optimizers", "schedulers", "callbacks", "scaler", "metrics")]
        paths += [["optimizers", name, "state"] for name in checkpoint.get("optimizers", {})]
    for keys in paths:
        node = checkpoint
        for key in keys:
            node = node.setdefault(key, {})


def read_metadata(path: str):
    """DCP's ``Metadata`` of the sharded checkpoint ``path``, unpickled without running code from the file."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta  # heavy: sharded checkpoints only
    metadata_path = os.path.join(path, ".metadata")
    if not os.path.isfile(metadata_path):
        raise CheckpointError(f"{path!r} is not a complete sharded checkpoint: it has no .metadata file")
    with open(metadata_path, "rb") as f:
        data = f.read()
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise CheckpointError(f"refused to load {path!r}: {e}") from None
    except Exception as e:  # random bytes make any error: they are a damaged file, reported as one
        raise CheckpointError(f"sharded checkpoint {path!r} is damaged: its .metadata ({len(data)} bytes) cannot be "
                              f"read ({type(e).__name__}: {_first_line(e)})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"sharded checkpoint {path!r} is damaged: its .metadata holds a "
                              f"{type(metadata).__name__}, not DCP's Metadata")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


def _wrapped_errors(error) -> list:
    """The exceptions a DCP ``CheckpointException`` carries from its ranks (its ``failures`` by rank)."""
    failures = getattr(error, "failures", None) or {}
    return [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def _first_line(error) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else type(error).__name__)


#: The globals DCP's metadata pickle refers to, each by its exact module and name: its dataclasses and enum,
#: the storage record of the file system writer, torch's layout lookup and Size, paths and plain containers.
#: Nothing else is built, and nothing is reached through a module's attributes.
ALLOWED_GLOBALS = frozenset(
    [("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")]
    + [("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
       ("torch", "Size"), ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
       ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
       ("pathlib", "PureWindowsPath")])


class _Refused(pickle.UnpicklingError):
    """The metadata pickle names a global that sharded checkpoints never hold."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only :data:`ALLOWED_GLOBALS` and torch's dtypes, layouts and memory formats, each found by its exact
    name: a pickle cannot reach anything else through a module's attributes (``operator.attrgetter`` and
    ``os`` are a module attribute away in DCP's own modules)."""

    def find_class(self, module, name):
        if (module, name) in ALLOWED_GLOBALS:
            return getattr(importlib.import_module(module), name)
        if module == "torch" and name.isidentifier():
            obj = getattr(torch, name, None)
            if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        raise _Refused(f"the checkpoint metadata names {module}.{name}, which a sharded checkpoint never holds; "
                       f"torchstage does not run code from checkpoint files")
