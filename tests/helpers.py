"""What many tests share: running scripts and multi-process runs with this checkout on the path, a free port,
seeded classification loaders and a tiny run (one import instead of a copy per test file)."""
import json
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests import script_server
from tests.conftest import regression_loaders
from torchstage import SupervisedRunner

ROOT = Path(__file__).resolve().parents[1]


def script_env(nproc=None, **extra) -> dict:
    """The environment of a test run: this checkout first on PYTHONPATH, no inherited world variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHSTAGE_NPROC",
                        "TORCHSTAGE_LAUNCHED", "TORCHSTAGE_PARENT_PID") and not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU/gloo in tests, also on a GPU machine
    if nproc is not None:
        env["TORCHSTAGE_NPROC"] = str(nproc)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, nproc=None, timeout=120, fresh=False, **extra) -> subprocess.CompletedProcess:
    """Run ``python *args`` (or a full command when args[0] is '-m') in the repo root; capture output. The script
    is forked from a preloaded process (:mod:`tests.script_server`), a fresh interpreter with ``fresh``."""
    return script_server.run([sys.executable, *args], env=script_env(nproc, **extra), cwd=ROOT, timeout=timeout,
                             fresh=fresh)


def alive(pid: int) -> bool:
    """True if process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a test's own rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_script(path, *args, timeout=300, env=None, cpus=None, fresh=False) -> subprocess.CompletedProcess:
    """Run ``scripts/<path>`` (an example of this repository) with this checkout first on PYTHONPATH, not an
    install, and ``env`` added (on the CPUs ``cpus`` lists, as ``taskset -c`` takes them, when given, in a fresh
    interpreter as with ``fresh``, else forked as :func:`run` does); assert it exits 0, showing the ends of its output
    if not."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    pinned = ["taskset", "-c", str(cpus)] if cpus is not None else []
    result = script_server.run([*pinned, sys.executable, ROOT / "scripts" / path, *args], timeout=timeout,
                               env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})}, cwd=None, fresh=fresh)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def classification_loaders(n=96, features=6, classes=3, batch_size=16, labels="rule", pinned=False, seed=0):
    """Seeded loaders of a classification task. ``labels``: "rule" (3 classes from the first three features),
    "random" (uniform over ``classes``), "linear" (the argmax of a fixed linear map: learnable in a few epochs) or
    "images" (3x16x16 images whose class, of 4, is the brightest quadrant). One unshuffled loader serves as train
    and valid, or with ``pinned`` (the GPU tests) a shuffled train and a valid loader, both in pinned memory."""
    g = torch.Generator().manual_seed(seed)
    if labels == "images":
        x = torch.randn(n, 3, 16, 16, generator=g)
        y = torch.randint(0, 4, (n,), generator=g)
        for q in range(4):
            rows, cols = slice(8 * (q // 2), 8 * (q // 2) + 8), slice(8 * (q % 2), 8 * (q % 2) + 8)
            x[y == q, :, rows, cols] += 1.0
    else:
        x = torch.randn(n, features, generator=g)
        if labels == "rule":
            y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
        elif labels == "random":
            y = torch.randint(0, classes, (n,), generator=g)
        else:
            assert labels == "linear", labels
            y = (x @ torch.randn(features, classes, generator=g)).argmax(1)
    data = TensorDataset(x, y)
    if not pinned:
        loader = DataLoader(data, batch_size=batch_size)
        return {"train": loader, "valid": loader}
    return {"train": DataLoader(data, batch_size=batch_size, shuffle=True, pin_memory=True,
                                generator=torch.Generator().manual_seed(seed)),
            "valid": DataLoader(data, batch_size=batch_size, pin_memory=True)}


_DEFAULT = object()  # "not given": a test may pass None on purpose (train() must refuse it)


def tiny_run(model=_DEFAULT, *, runner=None, loaders=_DEFAULT, criterion=_DEFAULT, optimizer=_DEFAULT, sgd_lr=0.1,
             num_epochs=1, torch_seed=None, **kwargs):
    """A tiny supervised run, in process: ``Linear(4, 1)`` on conftest's regression loaders with MSE and
    SGD(sgd_lr) where not given (``torch_seed`` seeds torch first); every other keyword, ``seed`` and unknown ones
    included, goes to ``train()``. Returns the runner."""
    if torch_seed is not None:
        torch.manual_seed(torch_seed)
    model = nn.Linear(4, 1) if model is _DEFAULT else model
    optimizer = torch.optim.SGD(model.parameters(), lr=sgd_lr) if optimizer is _DEFAULT else optimizer
    return (runner or SupervisedRunner()).train(
        model=model, criterion=nn.MSELoss() if criterion is _DEFAULT else criterion, optimizer=optimizer,
        loaders=regression_loaders() if loaders is _DEFAULT else loaders, num_epochs=num_epochs, **kwargs)


def straggler_logdir(folder, hosts=("node1", "node1", "node2", "node2")):
    """A 4-process logdir as the straggler detector leaves it: each rank's times per epoch, its places, and one
    episode of rank 2 (slow in compute from epoch 2, global batch 100, to epoch 4, global batch 300)."""
    (folder / "logs" / "ranks").mkdir(parents=True)
    columns = [f"rank{r}/{part}_ms" for r in range(4) for part in ("data", "compute", "wait")]
    rows = []
    for epoch in range(1, 6):
        slow = 2 <= epoch <= 3
        values = {f"rank{r}/{part}": {"data": 1.0, "compute": 30.0 if slow and r == 2 else 10.0,
                                      "wait": 0.0 if slow and r == 2 else (20.0 if slow else 2.0)}[part]
                  for r in range(4) for part in ("data", "compute", "wait")}
        rows.append(f"{epoch},main,{epoch}," + ",".join(str(values[c[:-3]]) for c in columns))
    (folder / "logs" / "ranks" / "train.csv").write_text("step,stage,epoch," + ",".join(columns) + "\n" +
                                                          "\n".join(rows) + "\n")
    (folder / "logs" / "ranks.json").write_text(json.dumps(
        {"ranks": [{"rank": r, "host": h, "local_rank": r % 2} for r, h in enumerate(hosts)]}))
    common = {"rank": 2, "host": "node2", "local_rank": 0, "part": "compute", "attempt": 0, "stage": "main"}
    events = [{**common, "kind": "slow", "value_ms": 30.0, "median_ms": 10.0, "share": 0.6, "worst": 0.6,
               "time": 1000.0, "epoch": 2, "global_batch_step": 160, "began": 994.0,
               "began_at": {"stage": "main", "epoch": 2, "global_batch_step": 100}},
              {**common, "kind": "recovered", "value_ms": 10.0, "median_ms": 10.0, "share": 0.0, "worst": 0.62,
               "time": 1030.0, "epoch": 4, "global_batch_step": 360, "began": 1020.0,
               "began_at": {"stage": "main", "epoch": 4, "global_batch_step": 300}}]
    (folder / "logs" / "stragglers.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(folder)


@contextmanager
def busy_core(cpu: int):
    """A busy process pinned to CPU ``cpu`` in a session of its own (a neighbour's job), stopped by its pid after."""
    proc = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"],
                            start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
