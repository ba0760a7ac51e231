"""Checkpoints as a run reads them: one file or a sharded directory (FSDP, DeepSpeed), the newest intact one of a
folder, a model's weights out of one, and the host snapshot a save is made from.

The one-file format (``format = "torchstage/1"``: models, optimizers, schedulers, scaler, callbacks, loop, rng,
metrics, meta), its CRC-32s and its safe loading live in :mod:`torchstage.files.checkpoint_file`.
"""
import os

import torch

from torchstage.files.checkpoint_file import load_file
from torchstage.files.deepspeed_files import is_deepspeed, load_deepspeed
from torchstage.files.format import CheckpointError, checkpoint_path, clean_state_dict
from torchstage.files.sharded import load_sharded


def snapshot(tree, buffers: dict = None):
    """A copy of ``tree`` whose tensors are host-memory copies and whose containers are new: what the checkpoint
    files will hold, whatever training changes in place afterwards. Plain values are kept as they are.

    Tensors sharing a storage (tied weights) share its one copy, so the file holds it once, as ``torch.save``
    of the live state would. ``buffers`` (a dict kept between calls) holds the previous snapshot's copies:
    a storage copied again is copied into the same memory, which costs no allocation and no page faults
    (the caller makes sure the previous snapshot is no longer read); it is then set to this snapshot's.
    """
    copies = {}
    result = _snapshot(tree, copies, {} if buffers is None else buffers)
    if buffers is not None:
        buffers.clear()
        buffers.update(copies)
    return result


def _snapshot(tree, copies: dict, previous: dict):
    if isinstance(tree, torch.Tensor):
        return _copy_tensor(tree.detach(), copies, previous)
    if isinstance(tree, dict):
        return {key: _snapshot(value, copies, previous) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_snapshot(value, copies, previous) for value in tree)
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


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Load a checkpoint with ``weights_only=True``; refuse files that would need to run pickled code.

    A sharded checkpoint (a directory written under FSDP or DeepSpeed) is read whole, as plain tensors.
    """
    if os.path.isdir(path):
        return load_deepspeed(path) if is_deepspeed(path) else load_sharded(path)
    return load_file(path, map_location)


def load_model_weights(model: torch.nn.Module, path_or_checkpoint, name: str = "model") -> None:
    """Load the weights of model ``name`` from a checkpoint (path or dict) into a plain module."""
    checkpoint = load_checkpoint(path_or_checkpoint) if isinstance(path_or_checkpoint, str) else path_or_checkpoint
    models = checkpoint["models"]
    if name not in models:
        raise CheckpointError(f"checkpoint has no model named {name!r}; it has {sorted(models)}")
    model.load_state_dict(clean_state_dict(models[name]))


def checkpoint_files(folder: str) -> list:
    """The checkpoints in ``folder``: ``last.pth`` first, then the others (best, epoch-NNNN), newest first."""
    if not os.path.isdir(folder):
        return []
    last = checkpoint_path(folder, "last")
    others = [os.path.join(folder, name) for name in os.listdir(folder)
              if name.endswith(".pth") and not name.startswith(".") and name != os.path.basename(last)]
    others.sort(key=os.path.getmtime, reverse=True)
    return ([last] if os.path.exists(last) else []) + others


def load_newest_intact(folder: str):
    """``(path, checkpoint, skipped)``: ``last.pth`` if it loads, else the newest intact one of the folder;
    ``skipped`` lists ``(path, why)`` for each file passed over. Raises naming every file and why if none loads."""
    last = checkpoint_path(folder, "last")
    skipped = [] if os.path.exists(last) else [(last, "it does not exist")]
    for path in checkpoint_files(folder):
        try:
            return path, load_checkpoint(path), skipped
        except CheckpointError as e:
            skipped.append((path, str(e)))
    reasons = "\n".join(f"  {path}: {why}" for path, why in skipped)
    raise CheckpointError(f"resume='last': no intact checkpoint in {folder!r}:\n{reasons}")
