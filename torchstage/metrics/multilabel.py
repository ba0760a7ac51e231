"""Multi-label accuracy: the fraction of (sample, label) pairs predicted right; counts summed across ranks."""
import torch

from torchstage.metrics._inputs import _tensor, check_threshold
from torchstage.metrics.base import AdditiveStateMetric, Values

_ACTIVATIONS = ("sigmoid", "softmax", "none")


class MultiLabelAccuracyMetric(AdditiveStateMetric):
    """Outputs ``(N, K)`` scores and 0/1 targets ``(N, K)``: label k of sample n is predicted present iff
    ``activation(outputs)[n, k] > threshold``; the result is the share of the N*K pairs predicted right.

    ``activation``: ``"sigmoid"`` (logits, the default), ``"softmax"`` or ``"none"`` (probabilities).
    Key: ``prefix + "multilabel_accuracy"``.
    """

    _state_size = 2

    def __init__(self, threshold: float = 0.5, activation: str = "sigmoid", prefix: str = "",
                 name: str = "multilabel_accuracy"):
        self.threshold = check_threshold(threshold, "MultiLabelAccuracyMetric")
        if not isinstance(activation, str) or activation.lower() not in _ACTIVATIONS:
            raise ValueError(f"MultiLabelAccuracyMetric: activation must be one of {_ACTIVATIONS}, got {activation!r}")
        self.activation, self.name = activation.lower(), name
        super().__init__(prefix)

    def _names(self) -> tuple:
        return (self.name,)

    def _update(self, outputs, targets) -> None:
        owner = "MultiLabelAccuracyMetric"
        outputs, targets = _tensor(outputs, "outputs", owner), _tensor(targets, "targets", owner)
        if outputs.shape != targets.shape or outputs.ndim != 2:
            raise ValueError(f"{owner}: expects outputs and 0/1 targets of the same shape (N, K), got outputs "
                             f"{tuple(outputs.shape)} and targets {tuple(targets.shape)}")
        scores = outputs.float()
        if self.activation == "sigmoid":
            scores = torch.sigmoid(scores)
        elif self.activation == "softmax":
            scores = torch.softmax(scores, dim=1)
        right = ((scores > self.threshold) == (targets > 0.5)).sum()
        state = self._state_like(right)
        state[0] += right
        state[1] += targets.numel()

    def _compute(self) -> Values:
        state = self._checked_state()
        if float(state[1]) == 0.0:
            raise self._empty_error()
        return {self.name: state[0] / state[1]}
