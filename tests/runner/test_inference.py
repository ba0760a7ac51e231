"""predict_loader and evaluate_loader: outputs and metrics of a pass without training."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, CallbackOrder, SupervisedRunner

g = torch.Generator().manual_seed(0)
X, Y = torch.randn(50, 4, generator=g), torch.randn(50, 1, generator=g)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))


def test_predict_loader_yields_eval_outputs_batch_by_batch():
    model = net()
    model.train()
    runner = SupervisedRunner(model=model)
    outputs = list(runner.predict_loader(DataLoader(TensorDataset(X, Y), batch_size=16), to_cpu=True))
    assert [o["logits"].shape[0] for o in outputs] == [16, 16, 16, 2]
    model.eval()
    with torch.no_grad():
        expected = model(X)
    torch.testing.assert_close(torch.cat([o["logits"] for o in outputs]), expected)  # dropout was off
    assert all(not o["logits"].requires_grad for o in outputs)


def test_predict_loader_restores_model_mode_and_leaves_grad_mode_alone():
    model = net()
    model.train()
    outputs = SupervisedRunner(model=model).predict_loader([X[:4], X[4:8]])
    next(outputs)
    assert torch.is_grad_enabled()  # the generator is suspended: the caller's grad mode is untouched
    outputs.close()
    assert model.training


class Count(Callback):
    order = CallbackOrder.Metric + 1

    def __init__(self):
        self.samples = 0

    def on_batch_end(self, runner):
        self.samples += runner.batch_size
        runner.batch_metrics["abs_out"] = runner.batch["logits"].abs().mean()


def test_evaluate_loader_returns_the_metrics_of_one_pass():
    model = net()
    counter = Count()
    metrics = SupervisedRunner(model=model).evaluate_loader(DataLoader(TensorDataset(X, Y), batch_size=16),
                                                            criterion=nn.MSELoss(), callbacks=[counter])
    model.eval()
    with torch.no_grad():
        out = model(X)
    assert metrics["loss"] == pytest.approx(nn.functional.mse_loss(out, Y).item(), rel=1e-6)
    assert metrics["abs_out"] == pytest.approx(out.abs().mean().item(), rel=1e-6)
    assert counter.samples == 50


def test_evaluate_after_training_uses_the_runners_criterion_and_keeps_its_state():
    model = net()
    loaders = {"train": DataLoader(TensorDataset(X, Y), batch_size=10),
               "valid": DataLoader(TensorDataset(X, Y), batch_size=10)}
    runner = SupervisedRunner().train(model=model, criterion=nn.L1Loss(), loaders=loaders, num_epochs=2,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    before = (runner.epoch, runner.global_batch_step, runner.epoch_metrics, list(runner.callbacks))
    metrics = runner.evaluate_loader(loaders["valid"])
    assert metrics["loss"] == pytest.approx(runner.epoch_metrics["valid"]["loss"], rel=1e-6)
    assert (runner.epoch, runner.global_batch_step, runner.epoch_metrics, list(runner.callbacks)) == before


def test_evaluate_without_a_model_says_what_to_do():
    with pytest.raises(ValueError, match=r"evaluate_loader needs a model: pass SupervisedRunner\(model=...\)"):
        SupervisedRunner().evaluate_loader([X])
