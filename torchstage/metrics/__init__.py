"""Pure metric accumulators: ``update`` per batch on the device, ``sync(engine)`` across ranks, ``compute``."""
from torchstage.metrics.accuracy import AccuracyMetric, accuracy
from torchstage.metrics.auc import AUCMetric, roc_auc
from torchstage.metrics.average import AverageMetric, FunctionalMetric
from torchstage.metrics.base import AdditiveStateMetric, Metric
from torchstage.metrics.multilabel import MultiLabelAccuracyMetric
from torchstage.metrics.precision_recall_f1 import PrecisionRecallF1Metric

__all__ = [
    "AccuracyMetric", "accuracy", "AdditiveStateMetric", "AUCMetric", "AverageMetric", "FunctionalMetric", "Metric",
    "MultiLabelAccuracyMetric", "PrecisionRecallF1Metric", "roc_auc",
]
