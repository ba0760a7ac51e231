"""CausalLMLoss: logits [B, T, V] (or a model output holding them) against targets [B, T]; CrossEntropyLoss given
that layout says how to fix it."""
import pytest
import torch
from torch import nn

from tests.helpers import tiny_run
from torchstage import CausalLMLoss


def test_the_mean_token_cross_entropy_with_padding_left_out():
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(2, 5, 7, generator=g), torch.randint(0, 7, (2, 5), generator=g)
    targets[1, 3:] = -100
    expected = nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100)
    assert torch.allclose(CausalLMLoss()(logits, targets), expected)

    from types import SimpleNamespace
    assert torch.allclose(CausalLMLoss()(SimpleNamespace(logits=logits), targets), expected)  # a model output
    shifted = CausalLMLoss(shift=True)(logits, targets)
    assert torch.allclose(shifted, nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), targets[:, 1:]))
    with pytest.raises(ValueError, match=r"CausalLMLoss compares logits \[batch, tokens, vocabulary\] with targets "
                                         r"\[batch, tokens\], got logits of shape \[2, 5, 7\] and targets of shape "
                                         r"\[10\]"):
        CausalLMLoss()(logits, targets.flatten())


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(11, 8), nn.Linear(8, 11)

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def lm_loaders():
    tokens = torch.randint(0, 11, (16, 7), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)
    return {"train": loader, "valid": loader}


def test_cross_entropy_on_language_model_logits_names_the_fix_and_the_fix_trains():
    with pytest.raises(ValueError, match=r"CrossEntropyLoss reads the classes on dimension 1, and these scores hold "
                                         r"them on the last one .*; for a language model's logits \[batch, tokens, "
                                         r"vocabulary\] use criterion=torchstage.CausalLMLoss\(\)"):
        tiny_run(TinyLM(), loaders=lm_loaders(), criterion=nn.CrossEntropyLoss())
    runner = tiny_run(TinyLM(), loaders=lm_loaders(), criterion=CausalLMLoss())
    assert runner.epoch_metrics["train"]["loss"] > 0
