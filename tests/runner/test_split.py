"""datasets={"train": ds, "valid_ratio": r}: a fixed, disjoint split, the same in every process."""
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchstage import SupervisedRunner
from torchstage.data.datasets import build_datasets, dataset_loader_names

DATA = TensorDataset(torch.arange(100).float().unsqueeze(1), torch.zeros(100, 1))


def indices(datasets):
    built = build_datasets(datasets)
    return {name: list(ds.indices) for name, ds in built.items()}


def test_split_is_disjoint_complete_and_sized():
    datasets = {"batch_size": 8, "train": DATA, "valid_ratio": 0.25}
    assert dataset_loader_names(datasets) == ["train", "valid"]
    split = indices(datasets)
    assert list(split) == ["train", "valid"]
    assert len(split["train"]) == 75 and len(split["valid"]) == 25
    assert sorted(split["train"] + split["valid"]) == list(range(100))


def test_split_ignores_the_global_seed_and_follows_split_seed():
    torch.manual_seed(1)
    a = indices({"batch_size": 8, "train": DATA, "valid_ratio": 0.2})
    torch.manual_seed(2)
    torch.rand(10)
    b = indices({"batch_size": 8, "train": DATA, "valid_ratio": 0.2})
    c = indices({"batch_size": 8, "train": DATA, "valid_ratio": 0.2, "split_seed": 7})
    assert a == b and a["valid"] != c["valid"]


def test_split_is_identical_in_another_process():
    code = ("import torch; from torch.utils.data import TensorDataset; from torchstage.data.datasets import "
            "build_datasets; torch.manual_seed(123); d = TensorDataset(torch.zeros(100, 1)); "
            "print(build_datasets({'batch_size': 8, 'train': d, 'valid_ratio': 0.2})['valid'].indices)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(indices({"batch_size": 8, "train": DATA, "valid_ratio": 0.2})["valid"])


def test_split_with_a_dataset_factory():
    split = indices({"batch_size": 8, "get_datasets_fn": lambda: {"train": DATA}, "valid_ratio": 0.1})
    assert len(split["valid"]) == 10


def test_training_uses_the_split():
    model = nn.Linear(1, 1)
    runner = SupervisedRunner().train(model=model, criterion=nn.MSELoss(), num_epochs=1,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.001),
                                      datasets={"batch_size": 10, "train": DATA, "valid_ratio": 0.3})
    assert len(runner.loaders["train"].dataset) == 70 and len(runner.loaders["valid"].dataset) == 30


@pytest.mark.parametrize("datasets, message", [
    ({"train": DATA, "valid_ratio": 1.5}, r"datasets\['valid_ratio'\] must be a number between 0 and 1"),
    ({"train": DATA, "valid": DATA, "valid_ratio": 0.1}, "has both 'valid' and 'valid_ratio'"),
    ({"data": DATA, "valid_ratio": 0.1}, r"splits datasets\['train'\], which is missing"),
    ({"train": DATA, "split_seed": 3}, r"datasets\['split_seed'\] is set but datasets\['valid_ratio'\] is not"),
])
def test_bad_split_options(datasets, message):
    with pytest.raises(ValueError, match=message):
        dataset_loader_names({"batch_size": 8, **datasets})
