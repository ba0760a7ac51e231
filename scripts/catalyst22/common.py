"""Offline data and a weights fingerprint shared by the Catalyst 22-style scripts (imports torch only, so the
same file serves the run on Catalyst 22.04 and on torchstage)."""
import hashlib

import torch
from torch.utils.data import DataLoader, TensorDataset


def digits(num_samples: int = 640, seed: int = 0):
    """Synthetic 8x8 "digits" (10 noisy prototypes) standing in for MNIST: ``(images, labels)``."""
    generator = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(10, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (num_samples,), generator=generator)
    images = (prototypes[labels] + 0.6 * torch.randn(num_samples, 1, 8, 8, generator=generator)).clamp(0, 1)
    return images, labels


def digit_loaders(batch_size: int = 32) -> dict:
    """Train and valid loaders of :func:`digits`, unshuffled: both frameworks see the same batches in order."""
    images, labels = digits()
    return {"train": DataLoader(TensorDataset(images[:512], labels[:512]), batch_size=batch_size),
            "valid": DataLoader(TensorDataset(images[512:], labels[512:]), batch_size=batch_size)}


def fingerprint(models) -> str:
    """``sha=<sha256 of every weight's bytes> sum=<their sum>``: equal sha means bitwise equal weights."""
    models = models if isinstance(models, dict) else {"model": models}
    digest, total = hashlib.sha256(), 0.0
    for name in sorted(models):
        for key, value in models[name].state_dict().items():
            digest.update(key.encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
            total += float(value.double().sum())
    return f"sha={digest.hexdigest()[:16]} sum={total:.10f}"
