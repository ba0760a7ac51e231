"""Pure metric accumulators: ``update`` per batch on the device, ``sync(engine)`` across ranks, ``compute``."""
from torchstage.metrics.accuracy import AccuracyMetric, accuracy
from torchstage.metrics.auc import AUCMetric, roc_auc
from torchstage.metrics.average import AverageMetric, FunctionalMetric
from torchstage.metrics.base import AdditiveStateMetric, Metric
from torchstage.metrics.multilabel import MultiLabelAccuracyMetric
from torchstage.metrics.precision_recall_f1 import PrecisionRecallF1Metric
from torchstage.metrics.renamed import RenamedMetric

__all__ = [
    "AccuracyMetric", "accuracy", "AdditiveStateMetric", "AUCMetric", "AverageMetric", "FunctionalMetric", "Metric",
    "MultiLabelAccuracyMetric", "PrecisionRecallF1Metric", "RenamedMetric", "roc_auc",
]


def __getattr__(name):
    """Catalyst 22's ``metrics.AdditiveMetric`` (``AdditiveValueMetric``), a host-side mean/std meter from the
    Catalyst compat layer (noted once when built); torchstage's own spelling is :class:`AverageMetric`."""
    if name in ("AdditiveMetric", "AdditiveValueMetric"):
        from torchstage.metrics.meters import AdditiveMetric  # Catalyst 22's meter: built only when asked for
        return AdditiveMetric
    raise AttributeError(f"module 'torchstage.metrics' has no attribute {name!r}")
