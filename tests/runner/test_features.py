"""Feature arguments of train(): compile=, and the checks that run before training."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import tiny_run
from torchstage import load_checkpoint

g = torch.Generator().manual_seed(0)
X, Y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
LOADERS = {"train": DataLoader(TensorDataset(X, Y), batch_size=16),
           "valid": DataLoader(TensorDataset(X, Y), batch_size=16)}


def train(model, **kwargs):
    return tiny_run(model, loaders=LOADERS, num_epochs=2, sgd_lr=0.05, **kwargs)


def linear():
    torch.manual_seed(0)
    return nn.Linear(4, 1)


def test_compile_wraps_the_model_trains_the_same_and_saves_clean_names(tmp_path):
    plain, compiled = linear(), linear()
    train(plain)
    runner = train(compiled, compile={"backend": "eager"}, logdir=str(tmp_path))
    assert isinstance(runner.model, torch._dynamo.eval_frame.OptimizedModule)
    assert runner.unwrapped_model is compiled
    torch.testing.assert_close(compiled.weight, plain.weight)
    assert set(load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["models"]["model"]) == {"weight", "bias"}


@pytest.mark.parametrize("kwargs, error, message", [
    ({"compile": "yes"}, TypeError, "compile must be True/False or a dict of torch.compile arguments"),
    ({"timeit": "no"}, TypeError, "timeit must be True or False, got 'no'"),
    ({"grad_clip_norm": True}, ValueError, "grad_clip_norm must be a number > 0 or None, got True"),
])
def test_bad_feature_arguments_fail_before_training(kwargs, error, message):
    with pytest.raises(error, match=message):
        train(linear(), **kwargs)
