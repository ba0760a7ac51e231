"""An optimizer given to train() that nothing steps (a custom handle_batch that only writes the loss, no stepping
callback) is refused at the end of the first train loader, naming the fix, instead of ending with exit 0 and the
weights unchanged; runners that step their own optimizers are untouched."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import OptimizerCallback, Runner


class LossOnly(Runner):
    """The tester's runner: the loss written, nothing steps."""

    def handle_batch(self, batch):
        x, y = batch
        self.batch_metrics["loss"] = nn.functional.mse_loss(self.model(x), y)


class StepsItself(Runner):
    """Backward and step in handle_batch, as Catalyst 22 runners and GANs do."""

    def handle_batch(self, batch):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.batch_metrics["loss"] = loss
        if self.is_train_loader:
            self.engine.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()


def _kwargs(**overrides):
    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    model = nn.Linear(4, 1)
    kwargs = dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  loaders={"train": DataLoader(TensorDataset(x, y), batch_size=8),
                           "valid": DataLoader(TensorDataset(x, y), batch_size=8)}, num_epochs=2)
    kwargs.update(overrides)
    return kwargs


def test_an_optimizer_nothing_steps_is_refused_naming_the_fix():
    kwargs = _kwargs()
    before = kwargs["model"].weight.detach().clone()
    with pytest.raises(ValueError) as error:
        LossOnly().train(**kwargs)
    message = str(error.value)
    assert message.startswith("the optimizer given to train() (SGD) was not stepped in the first train loader "
                              "'train' (4 batches), and no callback of the chain steps it: training changes nothing. "), \
        message
    assert "callbacks=[BackwardCallback(), OptimizerCallback()]" in message and "self.engine.backward(loss)" in message
    assert torch.equal(kwargs["model"].weight, before)  # refused after one loader, before a checkpoint or epoch 2


def test_following_the_advice_trains():
    from torchstage import BackwardCallback
    kwargs = _kwargs()
    before = kwargs["model"].weight.detach().clone()
    LossOnly().train(**kwargs, callbacks=[BackwardCallback(), OptimizerCallback()])
    assert not torch.equal(kwargs["model"].weight, before)


def test_a_runner_that_steps_its_own_optimizer_trains_as_before():
    kwargs = _kwargs()
    before = kwargs["model"].weight.detach().clone()
    StepsItself().train(**kwargs)
    assert not torch.equal(kwargs["model"].weight, before)


def test_a_dict_of_optimizers_names_the_one_never_stepped():
    class StepsOne(Runner):
        def handle_batch(self, batch):
            x, y = batch
            loss = nn.functional.mse_loss(self.model["a"](x) + self.model["b"](x), y)
            self.batch_metrics["loss"] = loss
            if self.is_train_loader:
                loss.backward()
                self.optimizer["a"].step()
    torch.manual_seed(0)
    models = {"a": nn.Linear(4, 1), "b": nn.Linear(4, 1)}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}
    with pytest.raises(ValueError, match=r"the optimizer 'b' given to train\(\) \(SGD\) was not stepped in the "
                                           r"first train loader 'train'"):
        StepsOne().train(**_kwargs(model=models, optimizer=optimizers))
