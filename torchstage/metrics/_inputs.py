"""Shape checks shared by the classification metrics; they read only shapes and dtypes (no host sync)."""
import torch


def _tensor(x, what: str, owner: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner}: {what} must be a torch.Tensor, got {type(x).__name__}")
    return x.detach()


def binary_inputs(outputs, targets, owner: str):
    """Scores ``(N,)``/``(N, 1)`` and 0/1 targets ``(N,)``/``(N, 1)`` -> two ``(N,)`` tensors (targets bool)."""
    outputs, targets = _tensor(outputs, "outputs", owner), _tensor(targets, "targets", owner)
    if outputs.ndim == 2 and outputs.shape[1] == 1:
        outputs = outputs[:, 0]
    if targets.ndim == 2 and targets.shape[1] == 1:
        targets = targets[:, 0]
    if outputs.ndim != 1 or targets.shape != outputs.shape:
        raise ValueError(f"{owner}: binary mode expects outputs and targets of shape (N,) or (N, 1) with the "
                         f"same N, got outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)}")
    return outputs, targets == 1


def multiclass_inputs(outputs, targets, owner: str, num_classes=None):
    """Scores ``(N, C)`` and integer class indices ``(N,)`` -> the same tensors, checked."""
    outputs, targets = _tensor(outputs, "outputs", owner), _tensor(targets, "targets", owner)
    if outputs.ndim != 2 or targets.ndim != 1 or targets.shape[0] != outputs.shape[0]:
        hint = " (one-hot targets: pass targets.argmax(1))" if targets.shape == outputs.shape else ""
        raise ValueError(f"{owner}: multi-class mode expects outputs (N, C) and class-index targets (N,), "
                         f"got outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)}{hint}")
    if targets.is_floating_point() or targets.dtype == torch.bool or targets.is_complex():
        raise TypeError(f"{owner}: multi-class targets must be integer class indices, got dtype {targets.dtype}")
    if num_classes is not None and outputs.shape[1] != num_classes:
        raise ValueError(f"{owner}: num_classes={num_classes} but outputs have shape {tuple(outputs.shape)}")
    return outputs, targets


def binary_predictions(scores: torch.Tensor, threshold: float, from_logits: bool) -> torch.Tensor:
    """Positive iff probability > threshold; probability = sigmoid(scores) if ``from_logits`` else scores."""
    probs = torch.sigmoid(scores if scores.is_floating_point() else scores.double()) if from_logits else scores
    return probs > threshold


def check_threshold(threshold, owner: str) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"{owner}: threshold must be a probability in [0, 1], got {threshold!r}")
    return float(threshold)
