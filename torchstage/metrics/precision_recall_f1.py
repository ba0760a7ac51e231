"""Precision, recall and F1 from true-positive / predicted / actual counts summed across ranks."""
from typing import Optional

import torch

from torchstage.metrics._inputs import binary_inputs, binary_predictions, check_threshold, multiclass_inputs
from torchstage.metrics.base import AdditiveStateMetric, Values


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` with 0 where ``den == 0`` (sklearn's ``zero_division=0``)."""
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


class PrecisionRecallF1Metric(AdditiveStateMetric):
    """Precision, recall and F1; state ``[tp(C), predicted(C), actual(C), n]`` (C=1 in binary mode).

    - binary (``num_classes=None``): outputs ``(N,)``/``(N, 1)``, targets 0/1; predicted positive iff
      ``sigmoid(outputs) > threshold`` (``from_logits=True``) or ``outputs > threshold`` (probabilities).
      Values are for the positive class; ``average`` must be None.
    - multi-class (``num_classes=C >= 2``): outputs ``(N, C)``, targets ``(N,)`` class indices; the
      prediction is the argmax (threshold unused). ``average="macro"`` (default): unweighted mean of the
      per-class values over all C classes; ``"micro"``: from the summed counts (equals accuracy).

    A ratio with a zero denominator is 0.0, like sklearn's ``zero_division=0``.
    Keys: ``prefix + "precision"``, ``prefix + "recall"``, ``prefix + "f1"``.
    """

    def __init__(self, num_classes: Optional[int] = None, average: Optional[str] = None,
                 threshold: float = 0.5, from_logits: bool = True, prefix: str = ""):
        owner = "PrecisionRecallF1Metric"
        if num_classes is None:
            if average is not None:
                raise ValueError(f"{owner}: average={average!r} needs num_classes (multi-class mode); "
                                 "binary mode reports the positive class")
        elif isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"{owner}: num_classes must be an int >= 2 or None (binary), got {num_classes!r}")
        else:
            average = "macro" if average is None else average
            if average not in ("macro", "micro"):
                raise ValueError(f"{owner}: average must be 'macro' or 'micro', got {average!r}")
        self.num_classes, self.average = num_classes, average
        self.threshold = check_threshold(threshold, owner)
        self.from_logits = bool(from_logits)
        self._classes = num_classes or 1
        self._state_size = 3 * self._classes + 1
        super().__init__(prefix)

    def _update(self, outputs, targets) -> None:
        owner = "PrecisionRecallF1Metric"
        if self.num_classes is None:
            scores, positive = binary_inputs(outputs, targets, owner)
            predicted = binary_predictions(scores, self.threshold, self.from_logits)
            counts = torch.stack([(predicted & positive).sum(), predicted.sum(), positive.sum()])
            state = self._state_like(counts)
            state[:3] += counts
        else:
            scores, targets = multiclass_inputs(outputs, targets, owner, self.num_classes)
            predicted = scores.argmax(dim=1)
            state = self._state_like(scores)
            rows = state[:-1].view(3, self._classes)
            ones = torch.ones(targets.shape[0], dtype=torch.float64, device=state.device)
            rows[0].index_add_(0, targets, (predicted == targets).to(torch.float64))
            rows[1].index_add_(0, predicted, ones)
            rows[2].index_add_(0, targets, ones)
        state[-1] += scores.shape[0]

    def _names(self) -> tuple:
        return ("precision", "recall", "f1")

    def _compute(self) -> Values:
        state = self._checked_state()
        if float(state[-1]) == 0.0:
            raise self._empty_error()
        tp, predicted, actual = state[:-1].view(3, self._classes)
        if self.average == "micro":
            tp, predicted, actual = tp.sum(), predicted.sum(), actual.sum()
        precision, recall = _safe_div(tp, predicted), _safe_div(tp, actual)
        f1 = _safe_div(2 * tp, predicted + actual)
        return {"precision": precision.mean(), "recall": recall.mean(), "f1": f1.mean()}
