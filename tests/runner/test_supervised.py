"""SupervisedRunner: same weights as a hand-written loop, batch and output mapping."""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import regression_data
from torchstage import SupervisedRunner, set_seed


def hand_written(model, loader, epochs, lr):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [1, 2])
    criterion = torch.nn.MSELoss()
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            for x, y in loader:
                criterion(model(x), y)
        scheduler.step()
    return model


def test_final_weights_equal_hand_written_loop():
    X, y = regression_data(n=200)
    loader = DataLoader(TensorDataset(X, y), batch_size=16)  # no shuffling
    torch.manual_seed(3)
    reference = hand_written(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)),
                             loader, epochs=3, lr=0.01)
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
                                      scheduler=torch.optim.lr_scheduler.MultiStepLR(optimizer, [1, 2]),
                                      loaders={"train": loader, "valid": loader}, num_epochs=3)
    assert runner.model is model
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert runner.epoch_metrics["train"]["lr"] == pytest.approx(0.01 * 0.1 ** 2)


def test_loss_average_is_weighted_by_sample_count():
    X, y = regression_data(n=50)
    loader = DataLoader(TensorDataset(X, y), batch_size=16)  # 16, 16, 16, 2
    model = torch.nn.Linear(4, 1)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                      loaders={"train": loader, "valid": loader}, num_epochs=1)
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(model(X), y).item()
    assert runner.epoch_metrics["valid"]["loss"] == pytest.approx(expected, rel=1e-6)


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 1), torch.nn.Linear(3, 1)

    def forward(self, left, right):
        return {"logits": self.a(left) + self.b(right), "aux": left.sum(1, keepdim=True)}


def test_dict_batches_list_input_keys_and_dict_outputs():
    batches = [{"left": torch.rand(4, 2), "right": torch.rand(4, 3), "y": torch.rand(4, 1)} for _ in range(3)]
    model = TwoInputs()
    runner = SupervisedRunner(input_key=["left", "right"], target_key="y")
    runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                 loaders={"train": batches, "valid": batches}, num_epochs=1)
    assert set(runner.batch) == {"left", "right", "y", "logits", "aux"}
    torch.testing.assert_close(runner.batch["aux"], batches[-1]["left"].sum(1, keepdim=True))


def test_tuple_outputs_need_output_keys():
    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.fc(x), x

    batches = [(torch.rand(4, 2), torch.rand(4, 1))]
    model = Pair()
    runner = SupervisedRunner(output_key=["logits", "echo"])
    runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                 loaders={"train": batches, "valid": batches}, num_epochs=1)
    assert set(runner.batch) == {"features", "targets", "logits", "echo"}
    with pytest.raises(ValueError, match="model returned 2 outputs but output_key names 1"):
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 loaders={"train": batches, "valid": batches}, num_epochs=1)


def test_same_seed_same_weights_with_shuffling():
    X, y = regression_data(n=96)
    results = []
    for _ in range(2):
        set_seed(0)
        model = torch.nn.Linear(4, 1)
        loader = DataLoader(TensorDataset(X, y), batch_size=8, shuffle=True)
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 loaders={"train": loader, "valid": loader}, num_epochs=2, seed=5)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(results[0], results[1])


def test_broadcasting_shapes_get_one_clear_warning(caplog):
    X, y = regression_data(n=32)
    loader = DataLoader(TensorDataset(X, y.view(-1)), batch_size=8)
    model = torch.nn.Linear(4, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 loaders={"train": loader, "valid": loader}, num_epochs=2)
    assert not [w for w in caught if "target size" in str(w.message)]  # torch's own warning does not repeat ours
    ours = [r for r in caplog.records if "broadcast" in r.getMessage()]
    assert len(ours) == 1
    assert "[8, 1]" in ours[0].getMessage() and "[8]" in ours[0].getMessage()


class DictRows(torch.utils.data.Dataset):
    """Samples as dicts with their own key names."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": torch.ones(1)}


@pytest.mark.parametrize("runner, message", [
    (lambda: SupervisedRunner(),
     "SupervisedRunner(input_key='features') found no 'features' in the batch, a dict with keys ['x', 'y']: name "
     "the dataset's keys with SupervisedRunner(input_key='<input key>', target_key='<target key>')"),
    (lambda: SupervisedRunner(input_key="x"),
     "the loss (OutputLossesCallback(target_key='targets', input_key='logits')) found no 'targets' in the batch, a "
     "dict with keys ['logits', 'x', 'y']: name the target with SupervisedRunner(target_key='<its key>')"),
])
def test_dict_batches_without_the_keys_name_input_key_and_target_key(runner, message):
    model = torch.nn.Linear(3, 1)
    before = model.weight.detach().clone()
    loader = torch.utils.data.DataLoader(DictRows(), batch_size=4)
    with pytest.raises(KeyError) as error:
        runner().train(model=model, criterion=torch.nn.MSELoss(), loaders={"train": loader, "valid": loader},
                       optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert message in error.value.args[0]
    assert torch.equal(model.weight, before)  # at the first batch, before any step
