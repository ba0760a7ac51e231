"""Reading checkpoints, as a run and its tools do: one file or a sharded directory (FSDP, DeepSpeed), the checkpoints
of a folder and the newest intact one, a model's weights out of one.

The four checkpoint modules, one job each: what a checkpoint is (:mod:`~torchstage.files.checkpoint_format`), one
file's bytes (:mod:`~torchstage.files.checkpoint_file`), reading (here), writing
(:mod:`~torchstage.files.checkpoint_write`).
"""
import os

import torch

from torchstage.files.checkpoint_file import load_file
from torchstage.files.deepspeed_files import is_deepspeed, load_deepspeed
from torchstage.files.checkpoint_format import CheckpointError, checkpoint_path, clean_state_dict
from torchstage.files.sharded import load_sharded


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
