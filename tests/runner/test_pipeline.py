"""Input pipeline and engine options: channels_last, prefetch, loader defaults for datasets={...}."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, Engine, SupervisedRunner
from torchstage.data.prefetch import prefetch_to_device


def conv_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 2))


class SeeInputs(Callback):
    def __init__(self):
        self.channels_last = []

    def on_batch_start(self, runner):
        x = runner.batch[0]
        self.channels_last.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())


def train_images(**kwargs):
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(24, 3, 8, 8, generator=g), torch.randint(0, 2, (24,), generator=g)
    loader = DataLoader(TensorDataset(X, y), batch_size=8)
    model = conv_net()
    seen = SeeInputs()
    SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             loaders={"train": loader, "valid": loader}, callbacks=[seen], num_epochs=2, **kwargs)
    return model, seen


def test_channels_last_converts_model_and_inputs_and_trains_the_same():
    plain, seen_plain = train_images()
    nhwc, seen = train_images(channels_last=True)
    assert all(seen.channels_last) and not any(seen_plain.channels_last)
    assert nhwc[0].weight.is_contiguous(memory_format=torch.channels_last) and not nhwc[0].weight.is_contiguous()
    for a, b in zip(plain.parameters(), nhwc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_prefetch_off_cuda_is_the_plain_iterator():
    items = [(1, torch.zeros(2)), (2, torch.ones(2))]
    assert list(prefetch_to_device(iter(items), Engine(device="cpu"))) == items
    plain, _ = train_images()
    prefetched, _ = train_images(prefetch=True)
    for a, b in zip(plain.parameters(), prefetched.parameters()):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefetch_on_cuda_trains_the_same_as_without():
    items = [(i, {"x": torch.full((1024,), float(i)).pin_memory()}) for i in range(5)]
    out = list(prefetch_to_device(iter(items), Engine(device="cuda")))
    assert [step for step, _ in out] == list(range(5))
    assert all(batch["x"].is_cuda and batch["x"][0].item() == step for step, batch in out)


def test_datasets_loaders_keep_workers_alive_and_pin_only_on_cuda():
    X, y = torch.randn(32, 4), torch.randn(32, 1)
    model = torch.nn.Linear(4, 1)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1), num_epochs=2,
                                      datasets={"batch_size": 8, "num_workers": 1, "train": TensorDataset(X, y),
                                                "valid": TensorDataset(X, y)})
    loader = runner.loaders["train"]
    on_cuda = runner.engine.device.type == "cuda"
    assert loader.persistent_workers is True and loader.pin_memory is on_cuda
    explicit = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                        datasets={"batch_size": 8, "num_workers": 1, "persistent_workers": False,
                                                  "train": TensorDataset(X, y), "valid": TensorDataset(X, y)})
    assert explicit.loaders["train"].persistent_workers is False
