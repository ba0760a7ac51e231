"""EMACallback and SWACallback: the averages equal hand-written loops, validation sees them, resume is bitwise."""
import copy
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests import script_server
from tests.resume_helpers import checkpoint_differences, child_env
from torchstage import EMACallback, SupervisedRunner, SWACallback

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "averaging_run.py")


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 5, generator=g)
    return x, x @ torch.randn(5, 1, generator=g) + 0.1 * torch.randn(96, 1, generator=g)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))


def _train(callback, epochs=3):
    x, y = _data()
    model = _model()
    loaders = {"train": DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8),
               "valid": DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8)}
    runner = SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, num_epochs=epochs,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                      callbacks={"avg": callback})
    return runner, model


def _hand_loop(update, epochs=3):
    """The same training by hand; ``update(avg_tensors, model_tensors, n)`` after each step."""
    x, y = _data()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    avg, n = copy.deepcopy(model), 0
    for _ in range(epochs):
        model.train()
        for i in range(0, 64, 8):
            loss = nn.functional.mse_loss(model(x[i:i + 8]), y[i:i + 8])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n += 1
            with torch.no_grad():
                update(avg, model, n)
    return model, avg


def _floats(module):
    return [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]


def test_ema_equals_a_hand_written_ema_loop():
    decay = 0.9

    def ema(avg, model, n):
        for a, p in zip(_floats(avg), _floats(model)):
            a.copy_(p if n == 1 else decay * a + (1 - decay) * p)
    runner, model = _train(EMACallback(decay=decay))
    hand_model, hand_avg = _hand_loop(ema)
    for got, want in zip(_floats(runner.callbacks["avg"].averaged), _floats(hand_avg)):
        assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max()
    for got, want in zip(_floats(model), _floats(hand_model)):  # the model keeps its own weights
        assert torch.allclose(got, want, atol=1e-6, rtol=0)
    assert runner.callbacks["avg"].num_averaged == 24


def test_validation_sees_the_averaged_weights():
    runner, model = _train(EMACallback(decay=0.9))
    x, y = _data()
    averaged = runner.callbacks["avg"].averaged.eval()
    with torch.no_grad():
        want = nn.functional.mse_loss(averaged(x[64:]), y[64:]).item()
        trained = nn.functional.mse_loss(model.eval()(x[64:]), y[64:]).item()
    assert runner.epoch_metrics["valid"]["loss"] == pytest.approx(want, abs=1e-6)
    assert abs(want - trained) > 1e-4  # the two are really different weights


def test_swa_equals_a_running_mean_with_batchnorm_statistics_recomputed():
    start = 8

    def swa(avg, model, n):
        if n > start:
            k = n - start
            for a, p in zip(avg.parameters(), model.parameters()):
                a.copy_(p if k == 1 else a + (p - a) / k)
    runner, model = _train(SWACallback(start=start, apply_on_end=True))
    _, hand_avg = _hand_loop(swa)
    x, _ = _data()
    torch.optim.swa_utils.update_bn(DataLoader(TensorDataset(x[:64]), batch_size=8), hand_avg)
    for got, want in zip(_floats(model), _floats(hand_avg)):  # apply_on_end: the model holds the average
        assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max()
    assert runner.callbacks["avg"].num_averaged == 16


def test_two_averages_evaluated_at_once_are_refused():
    with pytest.raises(ValueError, match=r"callbacks \['avg', 'swa'\] would all put their averaged weights"):
        x, y = _data()
        model = _model()
        SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders={
            "train": DataLoader(TensorDataset(x, y), batch_size=8)}, valid_loader="train",
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
            callbacks={"avg": EMACallback(), "swa": SWACallback()})


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\), got 1.5"):
        EMACallback(decay=1.5)
    with pytest.raises(ValueError, match="start must be an integer >= 0"):
        SWACallback(start=-1)


@pytest.mark.timeout(300)
def test_killed_run_resumes_bitwise_equal(tmp_path):
    def run(logdir, *extra, **env):
        return script_server.run([sys.executable, SCRIPT, str(logdir), *extra], env=child_env(**env), timeout=120)
    reference = subprocess.Popen([sys.executable, SCRIPT, str(tmp_path / "ref")], env=child_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = run(tmp_path / "killed", KILL_AT_BATCH=13)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    survivor = torch.load(tmp_path / "killed" / "checkpoints" / "last.pth", weights_only=True)
    assert survivor["loop"]["global_batch_step"] == 12 and not survivor["loop"]["epoch_done"]
    assert set(survivor["callbacks"]) >= {"ema", "swa"}
    resumed = run(tmp_path / "killed", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert reference.communicate(timeout=120)[0] is not None and reference.returncode == 0
    last = torch.load(tmp_path / "ref" / "checkpoints" / "last.pth", weights_only=True)
    assert last["callbacks"]["ema"]["num_averaged"] == 40 and last["callbacks"]["swa"]["num_averaged"] == 30
    assert checkpoint_differences(tmp_path / "ref" / "checkpoints" / "last.pth",
                                  tmp_path / "killed" / "checkpoints" / "last.pth") == []


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_two_processes_hold_the_same_averages(tmp_path):
    from tests.helpers import run as run_procs
    ran = run_procs([SCRIPT, tmp_path], nproc=2, timeout=240)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"averages-rank{r}.json").read_text()) for r in range(2))
    assert first == second  # identical weights after each step, BatchNorm statistics averaged across ranks
    assert len(first["swa"]) == 9 and all(math.isfinite(v) for v in first["ema"])
