"""Small models and loaders for the GPU tests: pinned host memory, seeded, a few batches."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def classification_loaders(n=512, features=32, classes=10, batch_size=64, images=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if images:  # the class is the quadrant of the image that is brightest
        x = torch.randn(n, 3, 16, 16, generator=g)
        y = torch.randint(0, 4, (n,), generator=g)
        for q in range(4):
            rows, cols = slice(8 * (q // 2), 8 * (q // 2) + 8), slice(8 * (q % 2), 8 * (q % 2) + 8)
            x[y == q, :, rows, cols] += 1.0
    else:  # the class is the argmax of a fixed linear map: learnable in a few epochs
        x = torch.randn(n, features, generator=g)
        y = (x @ torch.randn(features, classes, generator=g)).argmax(1)
    data = TensorDataset(x, y)
    return {"train": DataLoader(data, batch_size=batch_size, shuffle=True, pin_memory=True,
                                generator=torch.Generator().manual_seed(seed)),
            "valid": DataLoader(data, batch_size=batch_size, pin_memory=True)}


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
