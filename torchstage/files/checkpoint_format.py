"""What a checkpoint is: its format string, its file names in a checkpoint folder, the error of every checkpoint that
cannot be written or read, and the model keys a checkpoint holds without wrappers' prefixes (the contract that
:mod:`~torchstage.files.checkpoint_write` writes and :mod:`~torchstage.files.checkpoint_read` reads)."""
import os

FORMAT = "torchstage/1"
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file and why."""


def checkpoint_path(folder: str, which="last") -> str:
    """The one place checkpoint file names are made: ``which`` is ``"last"``, ``"best"``, ``"metrics"``
    (``metrics.json``) or an int global epoch (``epoch-NNNN.pth``, kept top-k); ``folder`` is a
    checkpoint folder (see :func:`checkpoint_folder`)."""
    if isinstance(which, int) and not isinstance(which, bool):
        return os.path.join(folder, f"epoch-{which:04d}.pth")
    names = {"last": "last.pth", "best": "best.pth", "metrics": "metrics.json"}
    if which not in names:
        raise ValueError(f"which must be 'last', 'best', 'metrics' or an epoch number, got {which!r}")
    return os.path.join(folder, names[which])


def checkpoint_folder(logdir: str) -> str:
    """Where a run with ``logdir`` keeps its checkpoints unless its checkpoint callback names another folder."""
    return os.path.join(os.fspath(logdir), "checkpoints")


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
