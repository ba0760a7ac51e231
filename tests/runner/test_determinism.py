"""seed= and deterministic=: two runs with one seed give identical weights; another seed does not."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, SupervisedRunner


class Deterministic(Callback):
    def on_experiment_start(self, runner):
        self.enabled = torch.are_deterministic_algorithms_enabled()


def run(seed, **kwargs):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 8, generator=g), torch.randn(128, 1, generator=g)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
               "valid": DataLoader(TensorDataset(x, y), batch_size=32)}

    torch.manual_seed(12345)  # fixed init so only the run's seed (shuffle, dropout) differs
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.3), nn.Linear(32, 1))
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=loaders, num_epochs=2, seed=seed,
                             optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), **kwargs)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_same_seed_same_weights_other_seed_other_weights():
    torch.manual_seed(999)
    a = run(seed=3)
    torch.rand(5)  # disturb the global generator between runs
    b = run(seed=3)
    c = run(seed=4)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_deterministic_turns_on_torch_deterministic_algorithms():
    probe = Deterministic()
    try:
        run(seed=3, deterministic=True, callbacks=[probe])
        assert probe.enabled
    finally:
        torch.use_deterministic_algorithms(False)
