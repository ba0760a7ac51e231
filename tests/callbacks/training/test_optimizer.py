"""OptimizerCallback: accumulation equals one big batch, clipping bounds gradients, scaler path, hooks."""
import contextlib

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from tests.helpers import tiny_run
from torchstage import Callback, CallbackOrder, OptimizerCallback, Runner, SingleDevice, SupervisedRunner


def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)


def linear():
    torch.manual_seed(1)
    return nn.Linear(6, 1)


def train(model, x, y, batch_size, optimizer=None, epochs=1, train_loader=None, **kwargs):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    if train_loader is None:
        train_loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    loaders = {"train": train_loader,
               "valid": DataLoader(TensorDataset(x[:8], y[:8]), batch_size=8)}
    return tiny_run(model, optimizer=optimizer, loaders=loaders, num_epochs=epochs, **kwargs)


def test_accumulating_4_batches_of_8_equals_one_batch_of_32():
    x, y = data(64)
    big, small = linear(), linear()
    train(big, x, y, batch_size=32, epochs=2)
    train(small, x, y, batch_size=8, accumulation_steps=4, epochs=2)
    unaccumulated = linear()
    train(unaccumulated, x, y, batch_size=8, epochs=2)
    for a, b, c in zip(big.parameters(), small.parameters(), unaccumulated.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert (a - c).abs().max() > 1e-3  # 8 small steps really are different: the comparison can fail


def _manual_two_groups(x, y):
    """SGD on the mean loss of the first 32 samples, then on the last 8 alone."""
    model = linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for sl in (slice(0, 32), slice(32, 40)):
        opt.zero_grad()
        nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
        opt.step()
    return model


def test_last_partial_group_is_one_batch_of_its_own_size():
    x, y = data(40)
    model = linear()
    train(model, x, y, batch_size=8, accumulation_steps=4)
    for a, b in zip(model.parameters(), _manual_two_groups(x, y).parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


class Stream(IterableDataset):
    """Batches without a length, so the callback cannot know where the last group ends."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter([(self.x[i:i + 8], self.y[i:i + 8]) for i in range(0, len(self.x), 8)])


def test_partial_group_of_a_loader_without_length_is_rescaled_at_loader_end():
    x, y = data(40)
    model = linear()
    train(model, x, y, batch_size=8, accumulation_steps=4,
          train_loader=DataLoader(Stream(x, y), batch_size=None))
    for a, b in zip(model.parameters(), _manual_two_groups(x, y).parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


class RecordingSGD(torch.optim.SGD):
    """Records the total gradient norm and largest |gradient| seen by each step."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.norms, self.maxes = [], []

    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())
        self.maxes.append(max(g.abs().max().item() for g in grads))
        return super().step(closure)


def test_clipping_by_norm_bounds_the_gradient_norm():
    x, y = data(64)
    y = y * 50  # large errors, large gradients
    free, clipped = linear(), linear()
    opt_free, opt_clipped = RecordingSGD(free.parameters(), 1e-3), RecordingSGD(clipped.parameters(), 1e-3)
    train(free, x, y, batch_size=16, optimizer=opt_free)
    train(clipped, x, y, batch_size=16, optimizer=opt_clipped, grad_clip_norm=1.0)
    assert min(opt_free.norms) > 1.0
    assert len(opt_clipped.norms) == 4 and max(opt_clipped.norms) <= 1.0 + 1e-5


def test_clipping_by_value_bounds_each_gradient():
    x, y = data(64)
    y = y * 50
    model = linear()
    opt = RecordingSGD(model.parameters(), 1e-3)
    train(model, x, y, batch_size=16, optimizer=opt, grad_clip_value=0.5)
    assert max(opt.maxes) == pytest.approx(0.5)


class InstallScaler(Callback):
    """Puts a CPU GradScaler on the runner, to run the fp16 code path (scale, unscale_, step, update)."""

    order = CallbackOrder.Internal

    def on_stage_start(self, runner):
        runner.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)


def test_grad_scaler_path_unscales_before_clipping_and_is_checkpointed(tmp_path):
    x, y = data(64)
    y = y * 50
    plain, scaled = linear(), linear()
    opt_plain, opt_scaled = RecordingSGD(plain.parameters(), 1e-3), RecordingSGD(scaled.parameters(), 1e-3)
    train(plain, x, y, batch_size=16, optimizer=opt_plain, grad_clip_norm=1.0, accumulation_steps=2)
    runner = train(scaled, x, y, batch_size=16, optimizer=opt_scaled, grad_clip_norm=1.0, accumulation_steps=2,
                   callbacks=[InstallScaler()], logdir=str(tmp_path))
    assert max(opt_scaled.norms) <= 1.0 + 1e-5  # unscaled: a scaled norm would be ~1024x larger
    for a, b in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)
    assert checkpoint["scaler"]["scale"] == runner.scaler.get_scale() == 1024.0


def test_gradients_are_none_after_training():
    x, y = data(40)
    model = linear()
    train(model, x, y, batch_size=8, accumulation_steps=2)
    assert all(p.grad is None for p in model.parameters())


class NoSyncStrategy(SingleDevice):
    """A one-process strategy that counts how often the optimizer callback asks to skip gradient sync."""

    calls = 0

    @contextlib.contextmanager
    def no_sync(self, model):
        NoSyncStrategy.calls += 1
        yield


def test_intermediate_backwards_run_under_the_strategys_no_sync():
    x, y = data(64)
    model = linear()
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=8),
               "valid": DataLoader(TensorDataset(x, y), batch_size=8)}
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, strategy=NoSyncStrategy(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=4)
    assert NoSyncStrategy.calls == 6  # 8 batches = 2 groups of 4: 3 unsynced backwards each


class PlanRecorder(SingleDevice):
    """A one-process strategy that keeps what its joint setup was given."""

    def setup(self, models, optimizers, plans=(), batch_size=None):
        self.given = (sorted(models), list(optimizers), list(plans), batch_size)
        return super().setup(models, optimizers, plans, batch_size)


def test_the_strategy_sets_up_for_the_step_plans_the_chain_declares():
    """The default OptimizerCallback's plan and that of a stepping callback of one's own reach the strategy's setup."""
    from torchstage.strategies.base import StepPlan

    class OwnStepper(Callback):
        def __init__(self):
            super().__init__(order=CallbackOrder.Optimizer + 1)

        def step_plans(self, stage):
            return (StepPlan(stage.optimizer, accumulation_steps=1, grad_clip_norm=0.5),)

    x, y = data(32)
    model, strategy = linear(), PlanRecorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, x, y, batch_size=8, optimizer=optimizer, strategy=strategy, callbacks={"own": OwnStepper()})
    names, optimizers, plans, batch_size = strategy.given
    assert names == ["model"] and optimizers == [optimizer] and batch_size == 8
    assert plans == [StepPlan(optimizer), StepPlan(optimizer, 1, 0.5)]


@pytest.mark.parametrize("kwargs, message", [
    ({"accumulation_steps": 0}, "accumulation_steps must be an integer >= 1, got 0"),
    ({"grad_clip_norm": -1}, "grad_clip_norm must be a number > 0 or None, got -1"),
    ({"grad_clip_value": "1"}, "grad_clip_value must be a number > 0 or None, got '1'"),
])
def test_bad_optimizer_arguments_fail_before_training(kwargs, message):
    x, y = data(16)
    with pytest.raises(ValueError, match=message):
        train(linear(), x, y, batch_size=8, **kwargs)


def test_train_argument_contradicting_a_given_optimizer_callback_fails():
    x, y = data(16)
    with pytest.raises(ValueError, match="accumulation_steps=4 was given to train.. but the OptimizerCallback"):
        train(linear(), x, y, batch_size=8, accumulation_steps=4,
              callbacks={"optimizer": OptimizerCallback(accumulation_steps=2)})


def test_optimizer_arguments_without_an_optimizer_callback_fail():
    class Custom(Runner):
        produces = ("loss",)

        def handle_batch(self, batch):
            self.batch_metrics["loss"] = self.model(batch[0]).mean()

    x, y = data(16)
    model = linear()
    with pytest.raises(ValueError, match="grad_clip_norm=1.0 is applied by an OptimizerCallback"):
        Custom().train(model=model, loaders={"train": DataLoader(TensorDataset(x, y), batch_size=8),
                                             "valid": DataLoader(TensorDataset(x, y), batch_size=8)},
                       grad_clip_norm=1.0)
