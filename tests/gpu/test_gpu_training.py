"""The CUDA paths of a run on a real GPU: fp16 loss scaling, bf16, prefetch, channels_last, compile,
pinned memory, and no host-device sync inside the default chain's steps."""
import torch
from torch import nn

from tests.gpu.helpers import classification_loaders, convnet, mlp, weights
from tests.helpers import tiny_run
from torchstage import Callback, CallbackOrder, SupervisedRunner


def train(model, loaders, lr=0.05, **kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return tiny_run(model, criterion=nn.CrossEntropyLoss(), optimizer=optimizer, loaders=loaders,
                    **{"num_epochs": 2, **kwargs})


class Scale(nn.Module):
    """Multiplies the logits by ``factor`` on the train forward number ``at`` (1-based): fp16 gradients overflow."""

    def __init__(self, factor, at):
        super().__init__()
        self.factor, self.at, self.calls = factor, at, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                return x * self.factor
        return x


class StepRecorder(Callback):
    """After every train batch: the weights and the grad scaler's scale."""

    order = CallbackOrder.External

    def __init__(self, model):
        self.model, self.weights, self.scales = model, [], []

    def on_batch_end(self, runner):
        if runner.is_train_loader:
            self.weights.append(weights(self.model))
            self.scales.append(float(runner.scaler.get_scale()))


def test_fp16_scales_the_loss_and_skips_the_step_whose_gradients_overflow():
    blow_at = 6
    body = mlp()
    model = nn.Sequential(body, Scale(1e4, blow_at))
    recorder = StepRecorder(model)
    runner = train(model, classification_loaders(), amp="fp16", callbacks=[recorder], num_epochs=1)
    assert runner.scaler is not None
    before, after = recorder.weights[blow_at - 2], recorder.weights[blow_at - 1]
    assert all(torch.equal(before[k], after[k]) for k in before), "the overflowing step was applied"
    assert recorder.scales[blow_at - 1] == recorder.scales[blow_at - 2] * 0.5  # backoff on overflow
    assert any(not torch.equal(recorder.weights[-1][k], recorder.weights[blow_at - 1][k]) for k in before)
    assert all(v.is_cuda and v.dtype == torch.float32 for v in recorder.weights[-1].values())
    assert all(torch.isfinite(v).all() for v in recorder.weights[-1].values())


class OutputDtype(Callback):
    order = CallbackOrder.Metric

    def __init__(self):
        self.dtypes = set()

    def on_batch_end(self, runner):
        self.dtypes.add(runner.batch["logits"].dtype)


def test_bf16_autocasts_the_forward_keeps_fp32_weights_and_learns():
    model, dtypes = mlp(), OutputDtype()
    runner = train(model, classification_loaders(), amp="bf16", callbacks=[dtypes], num_epochs=4, lr=0.1)
    assert dtypes.dtypes == {torch.bfloat16}
    assert all(p.is_cuda and p.dtype == torch.float32 for p in model.parameters())
    assert runner.scaler is None
    assert runner.epoch_metrics["train"]["loss"] < 1.4  # chance level is ln 10 = 2.30; about 0.84 on CPU


def test_prefetch_gives_the_same_weights_as_plain_copies():
    results = []
    for prefetch in (False, True):
        model = mlp()
        train(model, classification_loaders(), prefetch=prefetch)
        results.append(weights(model))
    plain, prefetched = results
    assert all(torch.allclose(plain[k], prefetched[k], atol=1e-6) for k in plain)


class InputLayout(Callback):
    order = CallbackOrder.Metric

    def __init__(self):
        self.channels_last = []

    def on_batch_end(self, runner):
        self.channels_last.append(runner.batch["features"].is_contiguous(memory_format=torch.channels_last))


def test_channels_last_moves_model_and_images_to_nhwc_and_learns():
    model, layout = convnet(), InputLayout()
    runner = train(model, classification_loaders(labels="images"), channels_last=True, callbacks=[layout],
                   num_epochs=4, lr=0.1)
    assert all(layout.channels_last)
    conv = model[0].weight
    assert conv.is_cuda and conv.is_contiguous(memory_format=torch.channels_last)
    assert runner.epoch_metrics["train"]["loss"] < 1.2  # chance level is ln 4 = 1.39; about 1.0 on CPU


def test_compile_trains_like_eager():
    eager, compiled = mlp(), mlp()
    train(eager, classification_loaders())
    train(compiled, classification_loaders(), compile=True)
    a, b = weights(eager), weights(compiled)
    assert all(torch.allclose(a[k], b[k], atol=1e-4, rtol=1e-4) for k in a)


def test_datasets_loaders_pin_host_memory_on_cuda():
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 32, generator=g), torch.randint(0, 10, (256,), generator=g))
    model = mlp()
    runner = SupervisedRunner().train(
        model=model, criterion=nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        datasets={"batch_size": 64, "num_workers": 1, "train": data, "valid": data}, num_epochs=1)
    assert runner.loaders["train"].pin_memory and runner.loaders["valid"].pin_memory
    assert next(model.parameters()).is_cuda


class SyncGuard(Callback):
    """``torch.cuda.set_sync_debug_mode("error")`` from the first handler of a batch to the last one."""

    def __init__(self, start: bool, after: int = 2):
        self.order = -10**6 if start else 10**6
        self.start, self.after, self.guarded = start, after, 0

    def on_batch_start(self, runner):
        if self.start and runner.batch_step > self.after:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")

    def on_batch_end(self, runner):
        if not self.start:
            if torch.cuda.get_sync_debug_mode() != 0:
                self.guarded += 1
            torch.cuda.set_sync_debug_mode("default")

    def on_exception(self, runner):
        torch.cuda.set_sync_debug_mode("default")


def test_default_chain_makes_no_host_sync_per_batch(tmp_path):
    model = mlp()
    start, end = SyncGuard(start=True), SyncGuard(start=False)
    try:
        train(model, classification_loaders(n=1024), callbacks={"sync_on": start, "sync_off": end},
              logdir=str(tmp_path), num_epochs=2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert end.guarded >= 2 * (1024 // 64 - 2) * 2 - 4  # train and valid batches ran under the guard
