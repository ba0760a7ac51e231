"""Small deterministic datasets for examples, tests and smoke runs; no downloads."""
import torch
from torch.utils.data import TensorDataset


def synthetic_regression(num_samples: int = 1000, num_features: int = 10, seed: int = 0,
                         noise: float = 0.1) -> TensorDataset:
    """``(features [N, F], targets [N, 1])`` with ``targets = features @ w + noise``; same seed, same tensors.

    Uses its own generator, so building it neither reads nor advances the global torch RNG.
    """
    generator = torch.Generator().manual_seed(seed)
    features = torch.rand(num_samples, num_features, generator=generator)
    weights = torch.randn(num_features, 1, generator=generator)
    targets = features @ weights + noise * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(features, targets)


def synthetic_regression_splits(num_train: int = 1000, num_valid: int = 200, num_features: int = 10,
                                seed: int = 0) -> dict:
    """``{"train": ..., "valid": ...}`` from one synthetic task (same weights), e.g. for ``datasets: {_target_: ..}``."""
    full = synthetic_regression(num_train + num_valid, num_features, seed)
    features, targets = full.tensors
    return {"train": TensorDataset(features[:num_train], targets[:num_train]),
            "valid": TensorDataset(features[num_train:], targets[num_train:])}
