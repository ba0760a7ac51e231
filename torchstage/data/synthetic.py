"""Small deterministic datasets for examples, tests and smoke runs; no downloads."""
import torch
from torch.utils.data import TensorDataset


def synthetic_regression(num_samples: int = 1000, num_features: int = 10, seed: int = 0, noise: float = 0.1,
                         task_seed: int = 0) -> TensorDataset:
    """``(features [N, F], targets [N, 1])``, ``targets = features @ w + noise``: same arguments, same tensors.

    ``seed`` draws the samples and ``task_seed`` the weights ``w``, so two seeds give a train and a valid set
    of one task. Private generators: building it neither reads nor advances the global torch RNG.
    """
    weights = torch.randn(num_features, 1, generator=torch.Generator().manual_seed(task_seed))
    generator = torch.Generator().manual_seed(seed)
    features = torch.rand(num_samples, num_features, generator=generator)
    targets = features @ weights + noise * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(features, targets)


def synthetic_regression_splits(num_train: int = 1000, num_valid: int = 200, num_features: int = 10,
                                seed: int = 0) -> dict:
    """``{"train": ..., "valid": ...}`` of one synthetic task, e.g. for ``datasets: {_target_: ...}`` in a config."""
    return {"train": synthetic_regression(num_train, num_features, seed=seed),
            "valid": synthetic_regression(num_valid, num_features, seed=seed + 1)}


def synthetic_tokens(num_samples: int = 64, length: int = 128, vocab_size: int = 32000, seed: int = 0) -> TensorDataset:
    """``(tokens [N, length], next tokens [N, length])`` of random token sequences: a causal language model's batches
    (``torchstage.CausalLMLoss``), e.g. for ``torchstage plan`` of a transformers model in a config."""
    tokens = torch.randint(0, vocab_size, (num_samples, length + 1), generator=torch.Generator().manual_seed(seed))
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])
