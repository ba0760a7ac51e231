"""strategy="deepspeed" with torchstage's other features on 2 gloo processes (bf16, monitor, early stopping, model
summary, check=True, a config optimizer, the GAN's two engines), and what it refuses before training, with why."""
from pathlib import Path
import json
import importlib.util
import os
import sys

import pytest
import torch

from tests.helpers import ROOT, run

SCRIPTS = Path(__file__).resolve().parent / "scripts"
from torchstage import DeepSpeed, SupervisedRunner
from torchstage.files.checkpoint_read import load_checkpoint
from torchstage.strategies.base import StepPlan

# the deepspeed extra (installed by .ci/run); looked up, not imported, at collection (1.2 s of CPU in every test process)
pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs the deepspeed extra")]

GAN = ROOT / "scripts" / "gan.py"


def _features(tmp_path, case):
    result = run([SCRIPTS / "deepspeed_features.py", tmp_path, case], timeout=400)
    report = tmp_path / "report.json"
    return result.returncode, result.stdout + result.stderr, json.loads(report.read_text()) if report.exists() else None


@pytest.mark.timeout(900)
def test_bf16_monitor_early_stopping_and_model_summary_under_zero3(tmp_path):
    code, out, report = _features(tmp_path, "amp")
    assert code == 0 and "terminate called" not in out, out[-3000:]
    assert report["epochs"] == [1, 2, 3]  # early stopping (patience 1) ended the run after epoch 3 of 4
    assert "early stopping at epoch 3" in out
    assert report["dtype_in_run"] == "torch.bfloat16" and report["dtype"] == "torch.float32"
    assert report["numel"] == 65  # the whole model back in the user's module after train(), fp32 master weights
    summary = (tmp_path / "model_summary.txt").read_text()
    assert "  total  Sequential      65         65" in summary  # ZeRO-3 shards counted whole
    assert "samples_per_s=" in out and "peak_memory_mb=" in out
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert last["meta"]["sharded"] and last["callbacks"]["early_stopping"]["stopped"]
    best = load_checkpoint(str(tmp_path / "checkpoints" / "best.pth"))
    assert best["loop"]["global_epoch_step"] == last["loop"]["global_epoch_step"] == 3  # no min_delta for "best"
    # load_best_on_end: the user's model ends with the best checkpoint's fp32 weights, not rounded through bf16
    assert torch.cat([t.flatten() for t in best["models"]["model"].values()]).sum().item() == report["weights"]


@pytest.mark.timeout(900)
def test_check_run_with_the_optimizer_of_the_deepspeed_config_offloaded(tmp_path):
    code, out, report = _features(tmp_path, "check")
    assert code == 0, out[-3000:]
    assert "check run passed" in out and report["optimizer"] == "AdamW"
    assert os.path.islink(tmp_path / "check" / "checkpoints" / "last.pth")
    # the optimizer callback stepped the optimizer the strategy's setup built (its lr logged)
    assert load_checkpoint(str(tmp_path / "check" / "checkpoints" / "last.pth"))["metrics"]["train"]["lr"] == 0.01


@pytest.mark.timeout(900)
def test_a_config_that_contradicts_train_is_refused_before_training(tmp_path):
    code, out, _ = _features(tmp_path, "disagree")
    assert code != 0
    assert ("DeepSpeed config gradient_accumulation_steps=4 disagrees with train(accumulation_steps=2); set it in "
            "one place") in out
    assert "epoch 1/" not in out


@pytest.mark.timeout(900)
def test_the_gan_trains_each_model_in_its_own_engine_as_ddp_does(tmp_path):
    runs = {}
    for strategy in ("ddp", "deepspeed"):
        logdir = tmp_path / strategy
        result = run([GAN, "--logdir", logdir, "--epochs", "2", "--nprocs", "2", "--strategy", strategy], timeout=400)
        out = result.stdout + result.stderr
        assert result.returncode == 0 and "terminate called" not in out, out[-3000:]
        runs[strategy] = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))
    for name in ("generator", "discriminator"):
        for key, tensor in runs["ddp"]["models"][name].items():
            torch.testing.assert_close(runs["deepspeed"]["models"][name][key], tensor, atol=1e-5, rtol=0)


@pytest.mark.timeout(900)
def test_the_documented_example_trains_at_zero3_and_gives_the_whole_model_back(tmp_path):
    result = run([ROOT / "scripts" / "deepspeed_example.py", tmp_path / "logs", "3"], nproc=2, timeout=400)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "terminate called" not in out, out[-3000:]
    for rank in (0, 1):  # the whole model and the scheduler's lr on every rank, after train()
        assert f"[rank{rank}]: rank {rank}/2: 75,268 parameters, valid loss" in out and "lr 0.00025" in out
    assert os.path.isdir(tmp_path / "logs" / "checkpoints" / "last.pth" / "model")


@pytest.mark.timeout(900)
def test_a_non_finite_loss_stops_the_run_and_no_checkpoint_holds_its_weights(tmp_path):
    code, out, _ = _features(tmp_path, "nan")
    assert code != 0 and "NonFiniteLossError: non-finite loss: 'loss' was nan" in out
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert all(torch.isfinite(t).all() for t in last["models"]["model"].values())
    assert not [name for name in os.listdir(tmp_path / "checkpoints") if name.endswith(".link")]


@pytest.mark.timeout(900)
def test_a_gan_under_zero2_is_refused_with_the_reason(tmp_path):
    result = run([GAN, "--logdir", tmp_path, "--epochs", "1", "--nprocs", "2", "--strategy", "deepspeed",
                  "--zero-stage", "2"], timeout=400)
    assert result.returncode != 0
    assert ("strategy='deepspeed' stage 2: this loss backpropagates into model 'discriminator', which another "
            "optimizer steps") in result.stdout + result.stderr
    # the launcher's summary appears (comparing the ranks' collectives of DeepSpeed's groups raised IndexError)
    summary = [line for line in (result.stdout + result.stderr).splitlines() if not line.startswith("[rank")]
    headline = next((line for line in summary if "exited with code 1; stopped the other ranks." in line), None)
    assert headline and "The first error, on rank " in headline and "this loss backpropagates" in headline, summary
    assert not any("IndexError" in line or "flight_recorder.py" in line for line in summary), summary


def _train(**kwargs):
    model = torch.nn.Linear(2, 1)
    loader = [(torch.zeros(4, 2), torch.zeros(4, 1))]
    SupervisedRunner().train(**{"model": model, "criterion": torch.nn.MSELoss(), "loaders": {"train": loader},
                                "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "valid_loader": "train",
                                **kwargs})


def test_what_is_refused_before_training_names_the_argument_and_the_values(tmp_path):
    with pytest.raises(ValueError, match=r"DeepSpeed\(stage=...\) must be 1, 2 or 3"):
        DeepSpeed(stage=4)
    with pytest.raises(ValueError, match=r"DeepSpeed\(stage=2\) disagrees with the config's zero_optimization.stage=3"):
        DeepSpeed(stage=2, config={"zero_optimization": {"stage": 3}})
    with pytest.raises(ValueError, match=r"offload_params=True\) needs stage=3"):
        DeepSpeed(stage=2, offload_params=True)
    with pytest.raises(ValueError, match="build it there .* and remove 'scheduler' from the config"):
        DeepSpeed(config={"scheduler": {"type": "WarmupLR"}})
    with pytest.raises(ValueError, match="optimizer type 'Lamb' cannot be built by torchstage"):
        DeepSpeed(config={"optimizer": {"type": "Lamb"}})
    with pytest.raises(ValueError, match="shards training state over several processes, and this run has one"):
        _train(strategy="deepspeed")
    (tmp_path / "ds.yaml").write_text("zero_optimization:\n  stage: 3\ngradient_clipping: 1.0\n")
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 1}, "bf16": {"enabled": true}}')
    assert DeepSpeed(config=tmp_path / "ds.yaml").stage == 3 and DeepSpeed(config=str(tmp_path / "ds.json")).stage == 1
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    strategy = DeepSpeed(config=tmp_path / "ds.yaml")
    with pytest.raises(ValueError, match=r"gradient_clipping=1.0 disagrees with train\(grad_clip_norm=None\) "
                                         r"\(no clipping; DeepSpeed's own default is 1.0\)"):
        strategy.engine_config(StepPlan(optimizer), 8, 2)
    assert strategy.engine_config(StepPlan(optimizer, 2, 1.0), 8, 2)["train_batch_size"] == 32
    strategy = DeepSpeed(config=tmp_path / "ds.json")
    with pytest.raises(ValueError, match=r"bf16.enabled=True disagrees with train\(amp=None\)"):
        strategy.engine_config(StepPlan(optimizer), 8, 2)
    strategy = DeepSpeed()
    with pytest.raises(ValueError, match="needs train_micro_batch_size_per_gpu, which the train loader's batch_size "
                                         r"\(None\) does not give; set it in the DeepSpeed config"):
        strategy.engine_config(StepPlan(optimizer), None, 2)  # a loader with a batch sampler
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu=16 disagrees with the train loader's "
                                         r"batch_size \(8\)"):
        strategy = DeepSpeed(train_micro_batch_size_per_gpu=16)
        strategy.engine_config(StepPlan(optimizer), 8, 2)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="grad_clip_value=0.5 is not supported with strategy='deepspeed'"):
        DeepSpeed().setup({"model": model}, [optimizer], [StepPlan(optimizer, grad_clip_value=0.5)], 8)
    with pytest.raises(ValueError, match="compile=True is not supported with strategy='deepspeed'"):
        DeepSpeed().setup({"model": torch.compile(torch.nn.Linear(2, 1))}, [optimizer])


def test_without_deepspeed_installed_the_error_says_how_to_install_it(monkeypatch):
    from torchstage.strategies.deepspeed import _import_deepspeed
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"pip install torchstage\[deepspeed\]"):
        _import_deepspeed()
