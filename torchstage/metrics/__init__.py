"""Pure metric accumulators: ``update`` per batch on the device, ``sync(engine)`` across ranks, ``compute``."""
from torchstage.metrics.accuracy import AccuracyMetric
from torchstage.metrics.auc import AUCMetric, roc_auc
from torchstage.metrics.average import AverageMetric, FunctionalMetric
from torchstage.metrics.base import AdditiveMetric, Metric
from torchstage.metrics.precision_recall_f1 import PrecisionRecallF1Metric

__all__ = [
    "AccuracyMetric", "AdditiveMetric", "AUCMetric", "AverageMetric", "FunctionalMetric", "Metric",
    "PrecisionRecallF1Metric", "roc_auc",
]
