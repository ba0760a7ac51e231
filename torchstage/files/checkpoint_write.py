"""Writing checkpoints: how a checkpoint dict reaches its files, one object per file layout, which a strategy chooses
when it connects, and the host copy a save is made from (:func:`host_copy`).

Each owns the hand-over to the :class:`~torchstage.files.writer.FileWriter` and the write order (each of the paths
in order, ``before_last()`` run before the last: the last path is the commit point). :class:`FileCheckpointIO`
writes one file per path from the main rank; :class:`ShardedCheckpointIO` a directory of DCP shards from every
rank (FSDP); :class:`DeepSpeedCheckpointIO` DeepSpeed's files of each engine plus the run's state (DeepSpeed).
"""
import functools

import torch
import torch.distributed as dist

from torchstage.files.atomic import write_atomic_stream
from torchstage.files.checkpoint_file import dump
from torchstage.files.writer import hand_over


class CheckpointIO:
    """Writes checkpoints of the process of ``engine`` (rank, collectives)."""

    def __init__(self, engine):
        self.engine = engine

    def save(self, checkpoint: dict, paths: list, writer=None, before_last=None) -> None:
        """Write ``checkpoint`` under each of ``paths`` in order, ``before_last()`` before the last (collective where
        every rank writes)."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what is kept between saves (the object stays usable); nothing here."""


class FileCheckpointIO(CheckpointIO):
    """One file per path, each atomic, written by the main rank (copies, not links: damage to one cannot reach
    another).

    With a writer the save does not block training: once the previous save has landed, the state is copied to host
    memory here (the host copy, the only time training waits; into the previous copy's memory, kept for it), and
    the writer's thread serializes it into the files while training goes on.
    """

    def __init__(self, engine):
        super().__init__(engine)
        self._buffers = {}  # the last checkpoint's host copy, reused by the next

    def save(self, checkpoint, paths, writer=None, before_last=None):
        if not self.engine.is_main:
            return
        if writer is not None:
            writer.wait_for_room()  # no two saves overlap: at most one copy of the state besides the live one
        # the previous host copy has landed (or is still to be written, when several may be pending: no reuse)
        reuse = writer is None or writer.max_pending == 1
        state = host_copy(checkpoint, self._buffers if reuse else None)
        hand_over(writer, lambda: write_atomic_stream(paths, functools.partial(dump, state), before_last))

    def close(self):
        self._buffers = {}


class ShardedCheckpointIO(CheckpointIO):
    """A directory of shards written by every rank with ``torch.distributed.checkpoint``, the names switched to it in
    order (see :mod:`torchstage.files.sharded`). A collective, started once the files handed to the writer earlier
    have landed (which keeps their order and lets no two saves overlap); with a writer the shards are written while
    training goes on (DCP's async save), its collectives on a gloo group of the checkpoints' own."""

    def __init__(self, engine):
        super().__init__(engine)
        self.group = dist.new_group(backend="gloo") if engine.is_distributed else None  # collective

    def save(self, checkpoint, paths, writer=None, before_last=None):
        from torchstage.files.sharded import save_sharded  # torch.distributed.checkpoint: heavy
        if writer is not None:
            writer.wait()
        save_sharded(checkpoint, paths, self.engine, before_last, writer, self.group)


class DeepSpeedCheckpointIO(CheckpointIO):
    """Every rank writes the DeepSpeed files of each of ``engines`` (model name -> DeepSpeedEngine, filled by the
    strategy's setup) into a new directory, the main rank the rest of the run's state; then the names are switched
    to it in order (collective, see :mod:`torchstage.files.deepspeed_files`). Waits for earlier file jobs."""

    def __init__(self, engine, engines: dict):
        super().__init__(engine)
        self.engines = engines

    def save(self, checkpoint, paths, writer=None, before_last=None):
        from torchstage.files.deepspeed_files import save_deepspeed
        if writer is not None:
            writer.wait()
        state = host_copy(checkpoint) if self.engine.is_main else None
        save_deepspeed(state, self.engines, paths, self.engine, before_last)


def host_copy(tree, buffers: dict = None):
    """A copy of ``tree`` whose tensors are host-memory copies and whose containers are new: what the checkpoint
    files will hold, whatever training changes in place afterwards. Plain values are kept as they are.

    Tensors sharing a storage (tied weights) share its one copy, so the file holds it once, as ``torch.save``
    of the live state would. ``buffers`` (a dict kept between calls) holds the previous host copy's copies:
    a storage copied again is copied into the same memory, which costs no allocation and no page faults
    (the caller makes sure the previous host copy is no longer read); it is then set to this one's.
    """
    copies = {}
    result = _host_copy(tree, copies, {} if buffers is None else buffers)
    if buffers is not None:
        buffers.clear()
        buffers.update(copies)
    return result


def _host_copy(tree, copies: dict, previous: dict):
    if isinstance(tree, torch.Tensor):
        return _copy_tensor(tree.detach(), copies, previous)
    if isinstance(tree, dict):
        return {key: _host_copy(value, copies, previous) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_host_copy(value, copies, previous) for value in tree)
    return tree


def _copy_tensor(tensor: torch.Tensor, copies: dict, previous: dict) -> torch.Tensor:
    """A host copy of ``tensor``, a view of the copy of its storage (made once per storage)."""
    if tensor.layout != torch.strided or type(tensor) is not torch.Tensor:  # sparse, subclasses: a plain copy
        return tensor.clone() if tensor.device.type == "cpu" else tensor.to("cpu")
    storage = tensor.untyped_storage()
    key = (tensor.device, storage.data_ptr(), storage.nbytes())
    if key not in copies:
        old = previous.get(key)
        if old is not None:
            copies[key] = old.copy_(storage)
        else:
            copies[key] = storage.clone() if tensor.device.type == "cpu" else storage.cpu()
    return torch.empty(0, dtype=tensor.dtype).set_(copies[key], tensor.storage_offset(), tensor.size(),
                                                   tensor.stride())
