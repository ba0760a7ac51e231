"""scripts/gan.py: a two-model runner that trains, logs loss_d/loss_g, and checkpoints every part by name."""
import csv
import importlib.util
import math
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import load_checkpoint, load_model_weights

from tests import script_server

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gan.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gan_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.alone  # times the example
def test_gan_script_learns_the_mixture_and_logs_both_losses(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[1])}
    start = time.perf_counter()
    done = script_server.run([sys.executable, str(SCRIPT), "--logdir", str(tmp_path), "--epochs", "20"], env=env,
                             timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.perf_counter() - start < 60
    before, after = map(float, re.search(r"mode distance: before ([\d.]+) after ([\d.]+)", done.stdout).groups())
    assert before > 1.5 and after < 0.8  # generated points moved from the origin onto the circle of modes
    with open(tmp_path / "logs" / "train.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 20
    assert all(math.isfinite(float(r["loss_d"])) and math.isfinite(float(r["loss_g"])) for r in rows)
    assert 0.5 < float(rows[-1]["loss_d"]) < 2.0  # neither network won outright
    checkpoint = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    for part in ("models", "optimizers", "schedulers"):
        assert set(checkpoint[part]) == {"generator", "discriminator"}
    assert checkpoint["schedulers"]["generator"]["last_epoch"] == 20


def gan_run(module, logdir, epochs, resume=None):
    torch.manual_seed(0)
    models = {"generator": module.mlp(module.LATENT, 2, hidden=16), "discriminator": module.mlp(2, 1, hidden=16)}
    optimizers = {k: torch.optim.Adam(m.parameters(), lr=1e-3) for k, m in models.items()}
    schedulers = {k: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.9) for k, o in optimizers.items()}
    loaders = {"train": DataLoader(TensorDataset(module.mixture(256, seed=1)), batch_size=64, shuffle=True),
               "valid": DataLoader(TensorDataset(module.mixture(64, seed=2)), batch_size=64)}
    runner = module.GANRunner()
    runner.train(model=models, optimizer=optimizers, scheduler=schedulers, criterion={"bce": nn.BCEWithLogitsLoss()},
                 loaders=loaders, num_epochs=epochs, valid_metric="loss_g", logdir=str(logdir), resume=resume)
    return runner


def test_named_models_optimizers_schedulers_resume_exactly(tmp_path):
    module = load_script()
    straight = gan_run(module, tmp_path / "straight", epochs=3)
    gan_run(module, tmp_path / "resumed", epochs=2)
    resumed = gan_run(module, tmp_path / "resumed", epochs=3, resume="last")
    for name in ("generator", "discriminator"):
        for a, b in zip(straight.model[name].parameters(), resumed.model[name].parameters()):
            assert torch.equal(a, b)
        assert resumed.scheduler[name].last_epoch == 3
        assert resumed.optimizer[name].state_dict()["state"][0]["step"] == 12  # 3 epochs x 4 batches
    fresh = module.mlp(module.LATENT, 2, hidden=16)
    load_model_weights(fresh, str(tmp_path / "resumed" / "checkpoints" / "last.pth"), name="generator")
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), resumed.model["generator"].parameters()))


@pytest.mark.distributed
def test_gan_trains_with_each_model_sharded_by_fsdp_on_two_processes(tmp_path):
    from tests.helpers import run
    done = run([SCRIPT, "--logdir", tmp_path, "--epochs", "2", "--nprocs", "2", "--strategy", "fsdp"], timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    distances = re.findall(r"\[rank(\d)\]: mode distance: before ([\d.]+) after ([\d.]+)", done.stdout)
    assert sorted(rank for rank, _, _ in distances) == ["0", "1"]
    assert all(float(after) < float(before) for _, before, after in distances)
    assert os.path.isdir(tmp_path / "checkpoints" / "last.pth")  # sharded: a directory
    checkpoint = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    for part in ("models", "optimizers", "schedulers"):
        assert set(checkpoint[part]) == {"generator", "discriminator"}
    module = load_script()
    generator = module.mlp(module.LATENT, 2)
    generator.load_state_dict(checkpoint["models"]["generator"])  # full tensors, loadable into a plain model
    names = {name for name, _ in module.mlp(2, 1).named_parameters()}
    assert set(checkpoint["optimizers"]["discriminator"]["state"]) == names  # each optimizer by its own model
