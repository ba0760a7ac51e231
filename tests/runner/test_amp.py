"""train(amp=...): bf16 autocast on CPU trains; fp16 needs CUDA; the no-amp path costs nothing per batch."""
import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, CallbackOrder, Engine, SupervisedRunner


def loaders(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).tanh()
    return {"train": DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
            "valid": DataLoader(TensorDataset(x, y), batch_size=64)}


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


class Dtypes(Callback):
    """Records the dtype of the model output and of the loss on train batches."""

    order = CallbackOrder.MetricAggregation

    def __init__(self):
        self.outputs, self.losses = set(), set()

    def on_batch_end(self, runner):
        self.outputs.add(runner.batch["logits"].dtype)
        self.losses.add(runner.batch_metrics["loss"].dtype)


def test_bf16_autocast_on_cpu_trains_and_the_loss_falls(tmp_path):
    net, dtypes = model(), Dtypes()
    runner = SupervisedRunner().train(model=net, criterion=nn.MSELoss(), loaders=loaders(), amp="bf16",
                                      optimizer=torch.optim.Adam(net.parameters(), lr=1e-2), num_epochs=6,
                                      callbacks=[dtypes], logdir=str(tmp_path))
    assert dtypes.outputs == {torch.bfloat16}  # the forward ran under autocast
    assert all(p.dtype == torch.float32 for p in net.parameters())  # weights stay fp32
    rows = (tmp_path / "logs" / "train.csv").read_text().splitlines()[1:]
    losses = [float(row.split(",")[3]) for row in rows]
    assert losses[-1] < 0.5 * losses[0]
    assert runner.scaler is None  # bf16 needs no loss scaling
    assert not torch.is_autocast_enabled("cpu")  # nothing leaks out of the run


class Never(Callback):
    def on_experiment_start(self, runner):
        raise AssertionError("training started")


def test_fp16_on_cpu_fails_before_training():
    net = model()
    with pytest.raises(ValueError, match="amp='fp16' .*needs a CUDA device.*use amp='bf16' on CPU"):
        SupervisedRunner().train(model=net, criterion=nn.MSELoss(), loaders=loaders(), amp="fp16",
                                 optimizer=torch.optim.SGD(net.parameters(), lr=0.1), callbacks=[Never()],
                                 engine=Engine(device="cpu"))  # on the CPU on a GPU machine too


def test_unknown_amp_value_names_the_choices():
    net = model()
    with pytest.raises(ValueError, match="amp must be None, 'bf16' or 'fp16'.*got 'fp8'"):
        SupervisedRunner().train(model=net, criterion=nn.MSELoss(), loaders=loaders(), amp="fp8",
                                 optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


def test_without_amp_autocast_is_one_shared_no_op_context():
    runner = SupervisedRunner(model=model())
    assert runner.autocast() is runner.autocast()  # no object is built per batch
    with runner.autocast():
        assert not torch.is_autocast_enabled("cpu")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_fp16_on_cuda_scales_the_loss_and_checkpoints_the_scaler(tmp_path):
    net = model()
    runner = SupervisedRunner().train(model=net, criterion=nn.MSELoss(), loaders=loaders(), amp="fp16",
                                      optimizer=torch.optim.Adam(net.parameters(), lr=1e-2), num_epochs=4,
                                      grad_clip_norm=1.0, logdir=str(tmp_path))
    assert isinstance(runner.scaler, torch.amp.GradScaler)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)
    assert checkpoint["scaler"]["scale"] == runner.scaler.get_scale()
    rows = (tmp_path / "logs" / "train.csv").read_text().splitlines()[1:]
    assert float(rows[-1].split(",")[3]) < float(rows[0].split(",")[3])


@cuda
def test_bf16_on_cuda_runs_forward_in_bf16():
    net, dtypes = model(), Dtypes()
    SupervisedRunner().train(model=net, criterion=nn.MSELoss(), loaders=loaders(), amp="bf16",
                             optimizer=torch.optim.Adam(net.parameters(), lr=1e-2), callbacks=[dtypes])
    assert dtypes.outputs == {torch.bfloat16}


def test_catalyst_fp16_is_float16_on_cuda_and_full_precision_elsewhere(caplog):
    """amp='fp16-or-full' (Catalyst's fp16=True): what Catalyst trained in on each device, logged."""
    import warnings

    from torchstage.strategies.precision import Precision
    with caplog.at_level(logging.INFO, logger="torchstage"):
        cpu = Precision.for_device("fp16-or-full", torch.device("cpu"))
    assert (cpu.dtype, cpu.scaler) == (None, None)
    assert "float16 needs CUDA; this run on cpu trains in full precision (float32), as Catalyst did" in caplog.text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a GradScaler made without CUDA warns that it is disabled
        cuda = Precision.for_device("fp16-or-full", torch.device("cuda"))
    assert cuda.dtype is torch.float16 and cuda.scaler is not None
