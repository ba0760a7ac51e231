"""The checkpoint file format: one dict of tensors and plain values, written atomically, loaded safely.

Layout (``format = "torchstage/1"``): models, optimizers, schedulers, scaler, callbacks, loop, rng,
metrics, meta. ``torch.load(weights_only=True)`` reads it, so loading never runs pickled code.
"""
import io
import os
import pickle
import tempfile

import torch

FORMAT = "torchstage/1"
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file and why."""


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash at any moment leaves the old file or the new one.

    A temporary file in the same folder is written, flushed and fsynced, then renamed over ``path``.
    """
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise CheckpointError(f"could not write checkpoint {path!r}: {e.strerror or e}; "
                              f"the previous file, if any, is unchanged") from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def link_atomic(source: str, path: str, data: bytes) -> None:
    """Make ``path`` hold the same bytes as the already written ``source``: an atomic hard link, or a write."""
    tmp = f"{path}.{os.getpid()}.link"
    try:
        os.link(source, tmp)
        os.replace(tmp, path)
    except OSError:
        if os.path.lexists(tmp):
            os.remove(tmp)
        write_atomic(path, data)


def serialize(checkpoint: dict) -> bytes:
    """The bytes ``torch.save`` would write for ``checkpoint``."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def save_checkpoint(checkpoint: dict, path: str) -> None:
    """Serialize ``checkpoint`` and write it atomically to ``path``."""
    write_atomic(path, serialize(checkpoint))


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Load a checkpoint with ``weights_only=True``; refuse files that would need to run pickled code.

    A sharded checkpoint (a directory written under FSDP) is read whole, as plain tensors.
    """
    if os.path.isdir(path):
        from torchstage.sharded_checkpoint import load_sharded  # imports this module; DCP is heavy
        return load_sharded(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        detail = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), "")
        raise CheckpointError(
            f"refused to load {path!r}: it holds objects that only unpickling code could rebuild, and "
            f"torchstage loads checkpoints with weights_only=True so that no code from a file ever runs "
            f"({_unpickling_reason(e)})") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"could not read checkpoint {path!r}: {e}") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(f"{path!r} is not a torchstage checkpoint: format is {found!r}, "
                              f"expected {FORMAT!r}")
    return checkpoint


def _unpickling_reason(error) -> str:
    """The line of torch's weights_only error that names the refused object."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Unsupported" in line or "global" in line.lower()]
    reason = (named or lines or ["unsupported object"])[0].replace("WeightsUnpickler error: ", "")
    return reason.split(" Please use")[0]  # torch's advice to allow-list the global is not ours to give


def clean_state_dict(state_dict: dict) -> dict:
    """Strip DDP (``module.``) and ``torch.compile`` (``_orig_mod.``) prefixes from parameter names."""
    cleaned = {}
    for key, value in state_dict.items():
        changed = True
        while changed:
            changed = False
            for prefix in WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix):], True
        cleaned[key] = value
    return cleaned


def load_model_weights(model: torch.nn.Module, path_or_checkpoint, name: str = "model") -> None:
    """Load the weights of model ``name`` from a checkpoint (path or dict) into a plain module."""
    checkpoint = load_checkpoint(path_or_checkpoint) if isinstance(path_or_checkpoint, str) else path_or_checkpoint
    models = checkpoint["models"]
    if name not in models:
        raise CheckpointError(f"checkpoint has no model named {name!r}; it has {sorted(models)}")
    model.load_state_dict(clean_state_dict(models[name]))
