"""A dict criterion: one loss per model output plus regularizers, summed with weights into ``loss``."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchstage import Loss, Regularizer, SupervisedRunner


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1), nn.Linear(8, 2)

    def forward(self, features):
        h = self.body(features).relu()
        return {"out_a": self.a(h), "out_b": self.b(h)}


class Pairs(Dataset):
    """``(features, {"out_a": ya, "out_b": yb})``, plus ``b_targets`` for the target-key variant."""

    def __init__(self, n=48):
        g = torch.Generator().manual_seed(0)
        self.x, self.ya, self.yb = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g), torch.randn(n, 2, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "targets": {"out_a": self.ya[i], "out_b": self.yb[i]}, "b_targets": self.yb[i]}


def run(criterion, **kwargs):
    torch.manual_seed(0)
    model, data = TwoHeads(), Pairs()
    loaders = {"train": DataLoader(data, batch_size=16), "valid": DataLoader(data, batch_size=48)}
    runner = SupervisedRunner().train(model=model, criterion=criterion, loaders=loaders, num_epochs=2,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.05), **kwargs)
    return runner, model, data


def test_each_output_loss_is_logged_and_the_weighted_sum_is_the_loss():
    criterion = {"out_a": nn.MSELoss(), "out_b": Loss(nn.L1Loss(), weight=0.5),
                 "size": Regularizer(lambda out_a, out_b: out_a.pow(2).mean() + out_b.pow(2).mean(), weight=0.1)}
    runner, model, data = run(criterion, valid_metric="loss_out_b")
    valid = runner.epoch_metrics["valid"]
    with torch.no_grad():  # the valid loader is one batch of everything, after the last update
        out = model(data.x)
    expected = {"loss_out_a": nn.functional.mse_loss(out["out_a"], data.ya).item(),
                "loss_out_b": nn.functional.l1_loss(out["out_b"], data.yb).item(),
                "loss_size": (out["out_a"].pow(2).mean() + out["out_b"].pow(2).mean()).item()}
    for key, value in expected.items():
        assert valid[key] == pytest.approx(value, rel=1e-5)
    total = expected["loss_out_a"] + 0.5 * expected["loss_out_b"] + 0.1 * expected["loss_size"]
    assert valid["loss"] == pytest.approx(total, rel=1e-5)


def test_loss_can_read_targets_from_a_batch_key():
    runner, model, data = run({"out_b": Loss(nn.MSELoss(), target="b_targets")})
    with torch.no_grad():
        expected = nn.functional.mse_loss(model(data.x)["out_b"], data.yb).item()
    assert runner.epoch_metrics["valid"]["loss_out_b"] == pytest.approx(expected, rel=1e-5)


def test_unknown_loss_name_as_valid_metric_fails_before_training():
    with pytest.raises(ValueError, match="valid_metric='loss_out_c' is produced by no callback.*'loss_out_a'"):
        run({"out_a": nn.MSELoss()}, valid_metric="loss_out_c")


def test_a_non_callable_entry_fails_before_training():
    with pytest.raises(TypeError, match=r"criterion\['out_a'\] must be a loss \(callable\), Loss\(...\) or "
                                        r"Regularizer\(...\), got str"):
        run({"out_a": "mse"})


def test_missing_target_says_where_targets_are_read():
    with pytest.raises(KeyError, match=r"criterion\['out_c'\] reads batch\['out_c'\]"):
        run({"out_c": nn.MSELoss()})
    with pytest.raises(KeyError, match=r"size.*reads batch\['embedding'\], which is not there"):
        run({"size": Regularizer(lambda embedding: embedding.mean())})
