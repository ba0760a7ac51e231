"""Output/target mismatches are reported at the first batch, naming both shapes and dtypes and a correct fix."""
import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, SupervisedRunner


class Batches(Callback):
    def __init__(self):
        self.started = 0

    def on_batch_start(self, runner):
        self.started += 1


def run(model, criterion, x, y, **kwargs):
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    batches = Batches()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as err:
        SupervisedRunner().train(model=model, criterion=criterion, loaders={"train": loader, "valid": loader},
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1), callbacks=[batches], **kwargs)
    assert batches.started == 1  # raised at the first batch
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # before any step
    return str(err.value)


def test_fewer_class_scores_than_classes():
    x, y = torch.randn(32, 4), torch.arange(32) * 3 % 10  # the first batch holds class 9
    message = run(torch.nn.Linear(4, 7), torch.nn.CrossEntropyLoss(), x, y)
    assert message == ("CrossEntropyLoss compares model output 'logits' of shape [8, 7] (float32) with target 'targets' "
                       "of shape [8] (int64): the target holds class 9 but the model gives 7 scores per sample "
                       "(classes 0..6); make the model output at least 10 (e.g. its last layer nn.Linear(..., 10))")


def test_shapes_that_do_not_broadcast_are_not_called_broadcast():
    x, y = torch.randn(32, 4), torch.randn(32)
    message = run(torch.nn.Linear(4, 3), torch.nn.MSELoss(), x, y)
    assert message.startswith("MSELoss compares model output 'logits' of shape [8, 3] (float32) with target 'targets' "
                              "of shape [8] (float32): the shapes do not broadcast; the model gives 3 value(s) per "
                              "sample and the target has 1: make the model output 1 per sample")
    assert "or give targets of shape [8, 3]" in message


@pytest.mark.parametrize("criterion, y, words", [
    (torch.nn.CrossEntropyLoss(), torch.rand(32), "for class indices pass integer targets (targets.long())"),
    (torch.nn.CrossEntropyLoss(), torch.zeros(32, 1, dtype=torch.long), "class-index targets need shape [8]"),
    (torch.nn.BCEWithLogitsLoss(), torch.rand(32), "it needs both of one shape; reshape one of them "
                                                   "(e.g. targets.view(8, 1))"),
    (torch.nn.MSELoss(), torch.zeros(32, 1, dtype=torch.long), "it needs float targets"),
])
def test_other_mismatches(criterion, y, words):
    model = torch.nn.Linear(4, 1)
    assert words in run(model, criterion, torch.randn(32, 4), y)


def test_broadcasting_shapes_warn_once_and_torch_does_not_repeat_it(caplog):
    x, y = torch.randn(32, 4), torch.randn(32)
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="torchstage"):
        warnings.simplefilter("always")
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders={"train": loader, "valid": loader},
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1), num_epochs=2)
    shape_warnings = [r.getMessage() for r in caplog.records if "broadcast" in r.getMessage()]
    assert shape_warnings == ["MSELoss compares model output 'logits' of shape [8, 1] (float32) with target "
                              "'targets' of shape [8] (float32): they broadcast to [8, 8], so every output is compared "
                              "with every target. Reshape one of them (e.g. targets.view(8, 1)) unless this is intended."]
    assert not [w for w in caught if "target size" in str(w.message)]


@pytest.mark.parametrize("dtype, cast", [(torch.int64, "features.float()"), (torch.float64, "features.float()")])
def test_features_of_another_dtype_than_the_model(dtype, cast):
    x, y = (torch.rand(32, 4) * 5).to(dtype), torch.rand(32, 1)
    message = run(torch.nn.Linear(4, 1), torch.nn.MSELoss(), x, y)
    name = str(dtype).replace("torch.", "")
    assert message.startswith(f"the model got input 'features' of shape [8, 4] ({name}) but its parameters are "
                              f"float32, and torch does not mix them (RuntimeError: ")
    assert message.endswith(f"give it float32 inputs: {cast} in the dataset or its collate_fn")


def test_integer_inputs_that_the_model_takes_keep_torchs_other_errors():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 3), torch.nn.Flatten(), torch.nn.Linear(5, 1))  # 12 != 5
    loader = DataLoader(TensorDataset(torch.randint(0, 10, (16, 4)), torch.rand(16, 1)), batch_size=8)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders={"train": loader, "valid": loader},
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_loss_that_is_not_a_scalar_names_the_criterion():
    x, y = torch.rand(32, 4), torch.rand(32, 1)
    message = run(torch.nn.Linear(4, 1), torch.nn.MSELoss(reduction="none"), x, y)
    assert message == ("the loss 'loss' of criterion MSELoss(reduction='none') has shape [8, 1], but the loss must be "
                       "a scalar to backpropagate: build the criterion with reduction='mean' or 'sum' (or reduce the "
                       "loss to one value in a callback before the backward)")


class TinyLM(torch.nn.Module):
    """Token ids [B, T] -> scores [B, T, V], as a language model gives; ``transpose`` follows the advice."""

    def __init__(self, vocab=11, transpose=False):
        super().__init__()
        self.embed, self.head, self.transpose = torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab), transpose

    def forward(self, tokens):
        logits = self.head(self.embed(tokens))
        return logits.transpose(1, 2) if self.transpose else logits


def _tokens():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 11, (32, 5), generator=g), torch.randint(0, 11, (32, 5), generator=g)


def test_language_model_scores_on_the_last_dimension_get_a_fix_that_works():
    """[B, T, V] logits and [B, T] targets: CrossEntropyLoss reads classes on dimension 1, and targets.view(-1)
    fails again; the message says to flatten both or transpose, and each fix trains."""
    x, y = _tokens()
    torch.manual_seed(0)
    message = run(TinyLM(), torch.nn.CrossEntropyLoss(), x, y)
    assert message.startswith("CrossEntropyLoss compares model output 'logits' of shape [8, 5, 11] (float32) with "
                              "target 'targets' of shape [8, 5] (int64): CrossEntropyLoss reads the classes on "
                              "dimension 1, and these scores hold them on the last one (11 classes for each of [8, 5] "
                              "targets, as a sequence model gives); "), message
    assert "logits.transpose(1, 2)" in message and "logits.reshape(-1, 11)" in message \
        and "targets.reshape(-1)" in message and "targets.view(-1)" not in message
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = TinyLM(transpose=True)  # the first fix: scores [B, V, T]
    SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(), loaders={"train": loader, "valid": loader},
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    class Flat(TinyLM):  # the second: both flattened
        def forward(self, tokens):
            return super().forward(tokens).reshape(-1, 11)
    flat = DataLoader(TensorDataset(x, y), batch_size=8, collate_fn=lambda rows: (
        torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]).reshape(-1)))
    model = Flat()
    SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(), loaders={"train": flat, "valid": flat},
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
