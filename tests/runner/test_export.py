"""runner.trace (TorchScript and torch.export through predict_batch) and runner.infer over inference loaders."""
import pytest
import torch
from torch import nn

import torchstage as dl
from tests.conftest import regression_loaders


def trained(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1))
    runner = dl.SupervisedRunner()
    runner.train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                 loaders=regression_loaders(), num_epochs=2, logdir=str(tmp_path))
    return runner, model


def test_trace_from_a_loader_matches_the_model_in_eval_mode_and_is_saved(tmp_path):
    runner, model = trained(tmp_path)
    x = regression_loaders()["valid"].dataset.tensors[0]
    traced = runner.trace(loader=regression_loaders()["valid"], logdir=str(tmp_path))
    assert isinstance(traced, torch.jit.ScriptModule)
    with torch.no_grad():
        expected = model.eval()(x)
    torch.testing.assert_close(traced(x), expected)
    loaded = torch.jit.load(str(tmp_path / "trace" / "traced-forward.pth"))
    torch.testing.assert_close(loaded(x), expected)


def test_trace_with_torch_export_and_restores_the_model(tmp_path):
    runner, model = trained(tmp_path)
    model.train()
    flags = [p.requires_grad for p in model.parameters()]
    x = regression_loaders()["valid"].dataset.tensors[0]
    exported = runner.trace(batch=(x[:5], None), backend="export", logdir=str(tmp_path))
    assert isinstance(exported, torch.export.ExportedProgram)
    assert model.training and [p.requires_grad for p in model.parameters()] == flags
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x[:5]), model.eval()(x[:5]))
    assert (tmp_path / "trace" / "traced-forward.pt2").exists()


def test_trace_of_a_custom_runner_uses_its_predict_batch():
    class Custom(dl.Runner):
        def predict_batch(self, batch):
            return self.model(batch[0].view(batch[0].shape[0], -1))

    model = nn.Linear(6, 2)
    traced = Custom(model=model).trace(batch=(torch.randn(3, 2, 3), None))
    x = torch.randn(7, 6)
    torch.testing.assert_close(traced(x), model(x))


@pytest.mark.parametrize("kwargs, message", [({}, r"needs batch=... or loader="),
                                             ({"batch": 1, "backend": "onnx"}, r"backend='onnx'"),
                                             ({"batch": 1, "fp16": True}, r"full precision"),
                                             ({"batch": 1, "method_name": "encode"}, r"only 'forward'")])
def test_trace_refuses_what_it_cannot_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.SupervisedRunner(model=nn.Linear(2, 2)).trace(**kwargs)


class Collect(dl.Callback):
    def __init__(self):
        super().__init__(dl.CallbackOrder.External)
        self.outputs, self.grad = [], set()

    def on_batch_end(self, runner):
        self.outputs.append(runner.output["logits"])
        self.grad.add(torch.is_grad_enabled())


def test_infer_runs_callbacks_over_inference_loaders_with_checkpoint_weights(tmp_path):
    runner, model = trained(tmp_path)
    best = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    collect = Collect()
    runner.infer(loaders={"infer": regression_loaders()["valid"]}, callbacks=[collect],
                 resume=tmp_path / "checkpoints" / "last.pth")
    x = regression_loaders()["valid"].dataset.tensors[0]
    model.load_state_dict(best)
    with torch.no_grad():
        expected = model.eval()(x)
    torch.testing.assert_close(torch.cat(collect.outputs), expected)
    assert collect.grad == {False}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    predictions = torch.cat([p["logits"] for p in dl.SupervisedRunner().predict_loader(
        regression_loaders()["valid"], model=model, resume=tmp_path / "checkpoints" / "last.pth")])
    torch.testing.assert_close(predictions, torch.cat(collect.outputs))
    with pytest.raises(ValueError, match=r"loaders \['train'\] would train"):
        runner.infer(loaders=regression_loaders())
