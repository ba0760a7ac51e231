"""train(activation_checkpointing=Block) on one process: the same losses and weights as without it, compiled or not;
checkpoints keep the model's own names; a class that names no block is refused before training."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, SupervisedRunner
from torchstage.strategies.activation_checkpointing import checkpointed_count


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.drop = nn.Linear(8, 32), nn.Linear(32, 8), nn.Dropout(0.2)

    def forward(self, x):
        return x + self.down(self.drop(torch.tanh(self.up(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


class Losses(Callback):
    order = 500

    def __init__(self):
        self.losses = []

    def on_batch_end(self, runner):
        if runner.is_train_loader:
            self.losses.append(float(runner.batch_metrics["loss"].detach()))


def run(tmp_path=None, **kwargs):
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(48, 8, generator=g), torch.randn(48, 1, generator=g)
    losses = Losses()
    runner = SupervisedRunner()
    runner.train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                 loaders={"train": DataLoader(TensorDataset(x, y), batch_size=8)}, valid_loader="train",
                 callbacks=[losses], num_epochs=2, seed=4, logdir=tmp_path, **kwargs)
    return runner, losses.losses, model


def test_the_same_losses_and_weights_with_and_without_it(tmp_path):
    _, plain, plain_model = run()
    runner, checkpointed, model = run(tmp_path, activation_checkpointing=Block)
    assert checkpointed_count(runner.unwrapped_model) == 2
    assert checkpointed == plain  # dropout replayed alike in the recomputation
    for a, b in zip(model.state_dict().values(), plain_model.state_dict().values()):
        assert torch.equal(a, b)
    saved = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)["models"]["model"]
    assert sorted(saved) == sorted(plain_model.state_dict())  # no wrapper in the names


def test_with_compile_too():
    _, plain, _ = run(compile={"backend": "aot_eager"})
    _, checkpointed, _ = run(compile={"backend": "aot_eager"}, activation_checkpointing=(Block,))
    assert checkpointed == pytest.approx(plain, abs=1e-6)


@pytest.mark.parametrize("value, error, message", [
    (nn.LSTM, ValueError, r"activation_checkpointing=LSTM matches no sub-module of the model, whose module classes "
                          r"are Block, Dropout, Linear, Sequential, Tanh|activation_checkpointing=LSTM matches no"),
    ("Block", TypeError, r"activation_checkpointing must be the class of the model's blocks"),
])
def test_a_class_that_names_no_block_is_refused_before_training(value, error, message):
    with pytest.raises(error, match=message):
        run(activation_checkpointing=value)
