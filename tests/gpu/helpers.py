"""Small models and loaders for the GPU tests: pinned host memory, seeded, a few batches."""
from functools import partial

import torch
from torch import nn

from tests import helpers

#: The GPU tests' task: 512 samples of 32 features, 10 classes from a linear map (or labels="images"), loaders in
#: pinned memory.
classification_loaders = partial(helpers.classification_loaders, n=512, features=32, classes=10, batch_size=64,
                                 labels="linear", pinned=True)


def mlp(features=32, classes=10, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, classes))


def convnet(classes=10, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
