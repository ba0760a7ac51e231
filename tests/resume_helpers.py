"""Helpers shared by the resume tests: run the tiny script in a subprocess, compare checkpoints bitwise."""
import os
import subprocess
import sys

import torch

from tests import script_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "runner", "scripts", "tiny_run.py")
#: The parts of a checkpoint that must be bitwise equal between a resumed and an uninterrupted run.
EXACT_KEYS = ("models", "optimizers", "schedulers", "loop", "metrics", "callbacks", "rng")


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILL_", "SIGNAL_", "MARK_", "PERIOD"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)  # no empty entry (the cwd)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_tiny(logdir, resume=None, **env):
    args = [sys.executable, TINY, str(logdir)] + ([resume] if resume else [])
    return subprocess.Popen(args, env=child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_tiny(logdir, resume=None, timeout=120, **env) -> subprocess.CompletedProcess:
    """The tiny script run to its end (forked from a preloaded process), stdout and stderr in ``stdout``."""
    args = [sys.executable, TINY, str(logdir)] + ([resume] if resume else [])
    return script_server.run(args, env=child_env(**env), timeout=timeout, merge=True)


def differences(a, b, path="") -> list:
    """Paths where two checkpoint trees differ (tensors by torch.equal, so bitwise up to NaN payloads)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [f"{path}: tensors differ"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def checkpoint_differences(path_a, path_b, restarted: bool = False) -> list:
    """Where two checkpoints differ in the parts a resumed run must reproduce bitwise. ``restarted``: ``path_b``
    is a restarted job's, whose CSV logs hold one row more on purpose (``logs/run.csv``, the restart count)."""
    a, b = (torch.load(p, weights_only=True) for p in (path_a, path_b))
    if restarted:
        assert b["callbacks"]["csv"]["epoch_rows"].pop("run") == 1
    return [d for key in EXACT_KEYS for d in differences(a[key], b[key], key)]


def tiny_train_kwargs(logdir, **overrides) -> dict:
    """An in-process shuffled run with dropout: 10 train batches per epoch, 3 valid batches."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(52, 6, generator=g), torch.randn(52, 1, generator=g)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    kwargs = dict(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
                  loaders={"train": DataLoader(TensorDataset(x[:40], y[:40]), batch_size=4, shuffle=True),
                           "valid": DataLoader(TensorDataset(x[40:], y[40:]), batch_size=4)},
                  logdir=None if logdir is None else str(logdir), num_epochs=3, seed=3)
    kwargs.update(overrides)
    return kwargs
