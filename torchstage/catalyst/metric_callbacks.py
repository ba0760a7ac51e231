"""The metric callbacks that take Catalyst 20.12's or 22's arguments besides torchstage's: each is the core
callback of the same name (``isinstance`` holds both ways) built from the translated arguments, with Catalyst's
metric names where Catalyst's arguments ask for them (``accuracy01``)."""
from torchstage.callbacks.metrics import metric
from torchstage.catalyst.callback_args import accuracy_callback_args, metric_args, resolve_keys
from torchstage.catalyst.callback_args22 import functional_metric_args
from torchstage.catalyst.core_types import StandsForCore
from torchstage.metrics import MultiLabelAccuracyMetric


class MetricCallback(metric.MetricCallback, metaclass=StandsForCore, core=metric.MetricCallback):
    """Also Catalyst 20.12's ``MetricCallback(prefix, metric_fn, input_key=<target>, output_key=<model output>,
    multiplier=1.0, **metric_kwargs)``: ``metric_fn`` averaged over the loader by batch size."""

    def __init__(self, metric=None, input_key: str = None, target_key: str = None, loaders=None, *,
                 metric_fn=None, output_key: str = None, prefix: str = None, multiplier: float = 1.0,
                 **metric_kwargs):
        built, input_key, target_key, loaders = metric_args(
            type(self).__name__, metric, input_key, target_key, loaders, metric_fn, output_key, prefix, multiplier,
            metric_kwargs)
        super().__init__(built, input_key, target_key, loaders)


class AccuracyCallback(metric.AccuracyCallback, metaclass=StandsForCore, core=metric.AccuracyCallback):
    """Also Catalyst 20.12's and 22's arguments: see
    :func:`~torchstage.catalyst.callback_args.accuracy_callback_args`."""

    def __init__(self, input_key=None, target_key=None, topk=None, threshold=0.5, from_logits=True,
                 prefix="", loaders=None, *, output_key=None, num_classes=None, accuracy_args=None, topk_args=None,
                 suffix=None, log_on_batch=None):
        built, input_key, target_key = accuracy_callback_args(
            topk, prefix, input_key, target_key, output_key, num_classes, accuracy_args, topk_args, suffix,
            log_on_batch, lambda: None)
        if built is None:  # torchstage's arguments
            super().__init__(input_key, target_key, topk, threshold, from_logits, prefix, loaders)
        else:  # Catalyst's metric names
            metric.MetricCallback.__init__(self, built, input_key, target_key, loaders)


class MultiLabelAccuracyCallback(metric.MultiLabelAccuracyCallback, metaclass=StandsForCore,
                                 core=metric.MultiLabelAccuracyCallback):
    """Also Catalyst 20.12's spelling with ``output_key=`` (``input_key`` the target), where ``prefix`` is the
    whole metric name."""

    def __init__(self, input_key=None, target_key=None, threshold=0.5, activation="sigmoid", prefix="",
                 loaders=None, *, output_key=None):
        keys = resolve_keys("MultiLabelAccuracyCallback", input_key, target_key, output_key)
        if output_key is None:
            super().__init__(*keys, threshold, activation, prefix, loaders)
        else:
            metric.MetricCallback.__init__(self, MultiLabelAccuracyMetric(
                threshold=threshold, activation=activation, name=prefix or "multilabel_accuracy"), *keys, loaders)


class FunctionalMetricCallback(metric.FunctionalMetricCallback, metaclass=StandsForCore,
                               core=metric.FunctionalMetricCallback):
    """Also Catalyst 22's ``FunctionalMetricCallback(input_key, target_key, metric_fn, metric_key, prefix=,
    suffix=)`` (by position or by name; ``compute_on_call`` and ``log_on_batch`` change nothing here)."""

    def __init__(self, fn=None, name: str = None, input_key=None, target_key=None, prefix="", loaders=None, *,
                 metric_fn=None, metric_key: str = None, suffix: str = None, compute_on_call: bool = True,
                 log_on_batch: bool = True):
        built, input_key, target_key = functional_metric_args(
            fn, name, input_key, target_key, metric_fn, metric_key, prefix, suffix)
        metric.MetricCallback.__init__(self, built, input_key, target_key, loaders)
