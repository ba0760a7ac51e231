"""Accuracy: top-k for multi-class scores, thresholded for binary scores; counts summed across ranks."""
from typing import Sequence, Union

import torch

from torchstage.metrics._inputs import binary_inputs, binary_predictions, check_threshold, multiclass_inputs
from torchstage.metrics.base import AdditiveStateMetric, Values


class AccuracyMetric(AdditiveStateMetric):
    """Fraction of samples predicted right; state ``[correct@k for k in topk] + [total]``.

    The mode follows each batch's shape:

    - multi-class: outputs ``(N, C)`` scores (logits or probabilities), targets ``(N,)`` class
      indices; a sample is right at ``k`` when its target is among the ``k`` highest scores.
    - binary: outputs ``(N,)`` or ``(N, 1)``, targets 0/1 of the same shape; predicted positive iff
      ``sigmoid(outputs) > threshold`` (``from_logits=True``) or ``outputs > threshold``; ``topk`` must be ``(1,)``.

    Keys: ``prefix + "accuracy"`` for k=1 and ``prefix + f"accuracy_top{k}"`` for k>1.
    """

    def __init__(self, topk: Union[int, Sequence[int]] = (1,), threshold: float = 0.5,
                 from_logits: bool = True, prefix: str = ""):
        topk = (topk,) if isinstance(topk, int) else tuple(topk)
        if not topk or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in topk) \
                or len(set(topk)) != len(topk):
            raise ValueError(f"AccuracyMetric: topk must be distinct ints >= 1, got {topk!r}")
        self.topk = topk
        self.threshold = check_threshold(threshold, "AccuracyMetric")
        self.from_logits = bool(from_logits)
        self._state_size = len(topk) + 1
        super().__init__(prefix)

    def _names(self) -> tuple:
        return tuple("accuracy" if k == 1 else f"accuracy_top{k}" for k in self.topk)

    def _update(self, outputs, targets) -> None:
        owner = "AccuracyMetric"
        if isinstance(outputs, torch.Tensor) and (outputs.ndim == 1 or (outputs.ndim == 2 and outputs.shape[1] == 1)):
            if self.topk != (1,):
                raise ValueError(f"{owner}: binary outputs {tuple(outputs.shape)} allow only topk=(1,), "
                                 f"got topk={self.topk}")
            scores, positive = binary_inputs(outputs, targets, owner)
            correct = (binary_predictions(scores, self.threshold, self.from_logits) == positive).sum().reshape(1)
        else:
            scores, targets = multiclass_inputs(outputs, targets, owner)
            if max(self.topk) > scores.shape[1]:
                raise ValueError(f"{owner}: topk={self.topk} exceeds the {scores.shape[1]} classes of "
                                 f"outputs {tuple(scores.shape)}")
            hits = scores.topk(max(self.topk), dim=1).indices == targets[:, None]
            correct = torch.stack([hits[:, :k].any(dim=1).sum() for k in self.topk])
        state = self._state_like(correct)
        state[:-1] += correct
        state[-1] += scores.shape[0]

    def _compute(self) -> Values:
        state = self._checked_state()
        if float(state[-1]) == 0.0:
            raise self._empty_error()
        return {("accuracy" if k == 1 else f"accuracy_top{k}"): state[i] / state[-1]
                for i, k in enumerate(self.topk)}


def accuracy(outputs: torch.Tensor, targets: torch.Tensor, topk: Sequence[int] = (1,)) -> list:
    """Top-k accuracy of one batch, one 0-dim tensor per k (no host sync); Catalyst 20.12's
    ``metrics.accuracy``. For a loader-level value use :class:`AccuracyMetric` or ``AccuracyCallback``."""
    scores, targets = multiclass_inputs(outputs, targets, "accuracy")
    hits = scores.topk(max(topk), dim=1).indices == targets[:, None]
    return [hits[:, :k].any(dim=1).float().mean() for k in topk]
