"""Seeding and capture/restore of every random generator (python, numpy, torch, CUDA) as plain values."""
import contextlib
import os
import random

import numpy as np
import torch

#: Mersenne Twister words (python's and numpy's generators) as bytes: 32-bit little-endian, on every host.
_WORDS = np.dtype("<u4")


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); optionally ask torch for deterministic algorithms."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for deterministic matmuls
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def seeded(seed: int):
    """Seed python, numpy and torch (the CPU generator, and the current GPU's once CUDA is in use) for the block;
    put their states back after it, so that what runs around the block draws as if it had not run."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=devices):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def get_rng_state() -> dict:
    """The states of all generators of this process, as plain values (weights_only-safe).

    Each generator's state is one ``bytes`` value: in a checkpoint a tensor costs ``torch.save`` a record
    and some twenty pickled objects, a third of a small checkpoint's serialization for the three of them.
    """
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": np.array(internal, dtype=_WORDS).tobytes(), "gauss": gauss},
        "numpy": {"kind": kind, "keys": keys.astype(_WORDS).tobytes(), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state().numpy().tobytes(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state) -> None:
    """Restore what :func:`get_rng_state` captured (also the tensors that checkpoints before 2026-11-25 hold), or
    what :func:`capture_rng` did."""
    if isinstance(state, tuple):
        restore_rng(state)
        return
    py = state["python"]
    random.setstate((py["version"], tuple(_words(py["state"]).tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], _words(n["keys"]).astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(_byte_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_byte_tensor(s) for s in state["cuda"]])


def _words(value) -> np.ndarray:
    return np.frombuffer(value, dtype=_WORDS) if isinstance(value, bytes) else value.numpy()


def _byte_tensor(value) -> torch.Tensor:
    return torch.frombuffer(bytearray(value), dtype=torch.uint8) if isinstance(value, bytes) else value


def capture_rng() -> tuple:
    """The states of all generators of this process as the generators give them (for an in-memory snapshot: no
    conversion to plain values, a fifth of :func:`get_rng_state`'s cost); put back with :func:`restore_rng`."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def restore_rng(state: tuple) -> None:
    """Put back what :func:`capture_rng` captured."""
    python, numpy_state, torch_state, cuda = state
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
