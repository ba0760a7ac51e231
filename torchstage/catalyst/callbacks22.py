"""Catalyst 22's metric callbacks with no torchstage class of their own: each a :class:`MetricCallback` with
Catalyst 22.04's keys and numbers, noted once with torchstage's nearest spelling.

The multilabel ones read outputs that are already activated (scores or 0/1 predictions, e.g. written by a
``BatchTransformCallback``): no sigmoid is applied, unlike torchstage's ``MultiLabelAccuracyCallback``.
"""
from torchstage.callbacks.metrics.metric import MetricCallback
from torchstage.catalyst.classification22 import PrecisionRecallF1SupportMetric
from torchstage.logging_setup import note_alias
from torchstage.metrics import MultiLabelAccuracyMetric

_PRF = ("PrecisionRecallF1Callback(input_key, target_key, num_classes=..., average='macro'|'micro') (keys precision, "
        "recall, f1; F1 = 2tp / (predicted + actual), without Catalyst's 1e-5)")


class MultilabelAccuracyCallback(MetricCallback):
    """Share of (sample, label) pairs with ``(outputs > threshold) == targets``, outputs already activated;
    key ``{prefix}accuracy{suffix}`` (Catalyst 22)."""

    def __init__(self, input_key: str, target_key: str, threshold: float = 0.5, log_on_batch: bool = True,
                 prefix: str = None, suffix: str = None, loaders=None):
        note_alias("MultilabelAccuracyCallback(input_key=<scores>, ...) (key accuracy)",
                   "MultiLabelAccuracyCallback(input_key=<scores>, activation='none') (key multilabel_accuracy)",
                   version="22")
        name = f"{prefix or ''}accuracy{suffix or ''}"
        super().__init__(MultiLabelAccuracyMetric(threshold=threshold, activation="none", name=name),
                         input_key, target_key, loaders)


class PrecisionRecallF1SupportCallback(MetricCallback):
    """Catalyst 22's multi-class precision, recall and F1 (micro, macro, support-weighted) from the logits' argmax;
    ``num_classes`` defaults to the logits' width."""

    _multilabel = False

    def __init__(self, input_key: str, target_key: str, num_classes: int = None, zero_division: int = 0,
                 log_on_batch: bool = True, compute_per_class_metrics: bool = False, prefix: str = None,
                 suffix: str = None, loaders=None):
        note_alias(f"{type(self).__name__}(input_key, target_key, ...) (keys precision/_macro, f1/_micro...)", _PRF,
                   version="22")
        metric = PrecisionRecallF1SupportMetric(num_classes, self._multilabel, zero_division, compute_per_class_metrics,
                                                prefix, suffix)
        super().__init__(metric, input_key, target_key, loaders)


class MultilabelPrecisionRecallF1SupportCallback(PrecisionRecallF1SupportCallback):
    """Catalyst 22's multi-label precision, recall and F1 per label column; a label counts as predicted where the
    output equals 1 (Catalyst 22 compares, it does not threshold: give 0/1 predictions)."""

    _multilabel = True
