"""A model on the meta device where it cannot be materialised, and modules nothing can initialise, are refused before
training with the fix; the module-by-module initialisation is seeded by the run's seed and each module's name."""
import pytest
import torch
from torch import nn

from tests.helpers import tiny_run
from torchstage import FSDP, Callback, DeepSpeed
from torchstage.strategies.single import SingleDevice
from torchstage.strategies.materialize import InitialWeights, is_meta, materialize, module_seed


class NoBatch(Callback):
    def on_batch_start(self, runner):
        raise AssertionError("a batch ran")


class WithPosition(nn.Module):
    """A module holding a parameter of its own, which no reset_parameters() initialises."""

    def __init__(self):
        super().__init__()
        self.position = nn.Parameter(torch.zeros(4))
        self.linear = nn.Linear(4, 1)

    def forward(self, x):
        return self.linear(x + self.position)


def meta(build=lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))):
    with torch.device("meta"):
        return build()


def test_a_meta_model_under_ddp_is_refused_before_any_process_starts(tmp_path):
    with pytest.raises(ValueError, match=r"the model is on the meta device \(built under torch.device\('meta'\)\): DDP: "
                                         r"this strategy holds the whole model on every process, so it would be built "
                                         r"in full anyway: build it on a device \(drop torch.device\('meta'\)\), or "
                                         r"shard it with strategy='fsdp'"):
        tiny_run(meta(), strategy="ddp", distributed=True, nprocs=2, callbacks=[NoBatch()], logdir=tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_a_meta_model_on_one_process_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"strategy='fsdp' on one process has nothing to shard it over: start several processes "
                                         r"\(distributed=True, nprocs=N, or a launcher\), or build the model on a "
                                         r"device"):
        tiny_run(meta(), strategy="fsdp", callbacks=[NoBatch()])
    with pytest.raises(ValueError, match=r"SingleDevice: this strategy holds the whole model"):
        tiny_run(meta(), strategy=SingleDevice(), callbacks=[NoBatch()])


def test_deepspeed_refuses_a_meta_model_naming_zero_init():
    with pytest.raises(ValueError, match=r"DeepSpeed: .*deepspeed.zero.Init"):
        tiny_run(meta(), strategy=DeepSpeed(stage=3), distributed=True, nprocs=2, callbacks=[NoBatch()])


def test_a_module_without_reset_parameters_is_named_with_the_fix():
    with pytest.raises(ValueError, match=r"these modules lack: \(the model itself\) \(WithPosition: position\). Pass "
                                         r"init_weights=fn \(fn\(module\) initialises a module's own tensors"):
        tiny_run(meta(WithPosition), strategy=FSDP(), distributed=True, nprocs=2, callbacks=[NoBatch()])


def test_an_init_function_covers_such_modules():
    def init(module):
        for tensor in module.parameters(recurse=False):
            nn.init.constant_(tensor, 0.5)

    model = meta(WithPosition)
    materialize(model, "cpu", InitialWeights(init=init, seed=1))
    assert not is_meta(model)
    assert torch.equal(model.position, torch.full((4,), 0.5)) and torch.equal(model.linear.bias, torch.full((1,), 0.5))


def test_initialisation_is_seeded_by_the_seed_and_the_module_name():
    def weights(seed):
        model = meta()
        materialize(model, "cpu", InitialWeights(seed=seed))
        return model.state_dict()

    a, b, c = weights(1), weights(1), weights(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["0.weight"], c["0.weight"])
    # each module draws from its own seed: what reset_parameters() gives under torch.manual_seed(module_seed(...))
    torch.manual_seed(module_seed(1, "2"))
    reference = nn.Linear(8, 1)
    assert torch.equal(a["2.weight"], reference.weight) and torch.equal(a["2.bias"], reference.bias)


def test_materialising_does_not_touch_the_runs_random_stream():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    materialize(meta(), "cpu", InitialWeights(seed=5))
    assert torch.equal(torch.rand(3), expected)


def test_tied_parameters_stay_tied():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = meta(Tied)
    materialize(model, "cpu", InitialWeights(seed=0))
    assert model.head.weight is model.embed.weight and not model.embed.weight.is_meta
