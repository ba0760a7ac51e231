"""``datasets={"get_datasets_fn": fn}``: torchstage calls ``fn`` with every generator seeded with the run's seed, so
unseeded data made there is the same whatever the generators' state before (each rank's differs), and the training's
own random stream is left as it was."""
import random

import numpy as np
import torch
from torch.utils.data import TensorDataset

from torchstage.data.datasets import build_datasets


def draw(num_features: int):
    X = torch.rand(16, num_features)
    return {"train": TensorDataset(X, torch.tensor(np.random.rand(16)) + random.random())}


def test_get_datasets_fn_draws_the_same_data_under_the_run_seed_whatever_the_state_before():
    datasets = {"batch_size": 4, "get_datasets_fn": draw, "num_features": 3}
    made = []
    for rank_seed in (42, 43):  # train(seed=42) seeds rank r with 42 + r before the data is made
        torch.manual_seed(rank_seed)
        np.random.seed(rank_seed)
        random.seed(rank_seed)
        state = torch.get_rng_state()
        made.append(build_datasets(datasets, seed=42)["train"].tensors)
        assert torch.equal(torch.get_rng_state(), state)  # the rank's own stream goes on untouched
    assert all(torch.equal(a, b) for a, b in zip(*made))
    assert not torch.equal(build_datasets(datasets, seed=7)["train"].tensors[0], made[0][0])
