"""Metric callbacks: feed ``batch[input_key]``/``batch[target_key]`` to an accumulator, publish at loader end."""
import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.catalyst.callback_args import accuracy_callback_args, metric_args, resolve_keys
from torchstage.catalyst.callback_args22 import functional_metric_args
from torchstage.metrics import (AccuracyMetric, AUCMetric, Metric, MultiLabelAccuracyMetric,
                                PrecisionRecallF1Metric)


class MetricCallback(Callback):
    """Runs any :class:`~torchstage.metrics.Metric` over each loader; results go to ``runner.loader_metrics``.

    Updates stay on the device; at loader end the state is reduced across ranks once and turned into
    floats with one host copy. ``loaders`` limits it to some loaders (default: all).
    Catalyst 20.12's ``MetricCallback(prefix, metric_fn, input_key=<target>, output_key=<model output>,
    multiplier=1.0, **metric_kwargs)`` also works: ``metric_fn`` averaged over the loader by batch size.
    """

    order = CallbackOrder.Metric
    state_per_rank = True  # the partial state of a mid-loader checkpoint differs between ranks

    def __init__(self, metric: Metric = None, input_key: str = None, target_key: str = None, loaders=None, *,
                 metric_fn=None, output_key: str = None, prefix: str = None, multiplier: float = 1.0,
                 **metric_kwargs):
        metric, input_key, target_key, loaders = metric_args(  # Catalyst 20.12's spelling translated
            type(self).__name__, metric, input_key, target_key, loaders, metric_fn, output_key, prefix, multiplier,
            metric_kwargs)
        if not isinstance(metric, Metric):
            raise TypeError(f"metric must be a torchstage.metrics.Metric, got {type(metric).__name__}")
        self.metric, self.input_key, self.target_key = metric, input_key, target_key
        self.loaders = None if loaders is None else ({loaders} if isinstance(loaders, str) else set(loaders))
        self._in_loader, self._resumed = False, None

    @property
    def produces(self):
        return self.metric.names

    def _active(self, runner) -> bool:
        return self.loaders is None or runner.loader_key in self.loaders

    def on_loader_start(self, runner):
        self.metric.reset()
        if self._resumed is not None:  # a run resumed mid-loader continues the partial state
            self.metric.load_state_dict({k: v.to(runner.engine.device) for k, v in self._resumed.items()})
            self._resumed = None
        self._in_loader = True

    def state_dict(self):
        """The metric's partial state while a loader runs (a mid-loader checkpoint), else nothing."""
        return self.metric.state_dict() if self._in_loader else {}

    def load_state_dict(self, state):
        self._resumed = state

    def merge_rank_states(self, states: list) -> dict:
        return self.metric.merge_state_dicts(states)

    def on_batch_end(self, runner):
        if self._active(runner):
            with torch.no_grad():
                self.metric.update(runner.batch[self.input_key], runner.batch[self.target_key])

    def on_loader_end(self, runner):
        self._in_loader = False
        if not self._active(runner):
            return
        self.metric.sync(runner.engine)
        values = self.metric.compute()
        floats = torch.stack([v.reshape(()).double() for v in values.values()]).tolist()
        runner.loader_metrics.update(zip(values, floats))


class AccuracyCallback(MetricCallback):
    """Top-k accuracy (multi-class logits) or thresholded binary accuracy: ``accuracy``, ``accuracy_top{k}``
    (``topk`` default ``(1,)``). Catalyst 20.12's and 22's arguments also work: see
    :func:`~torchstage.catalyst.callback_args.accuracy_callback_args`."""

    def __init__(self, input_key=None, target_key=None, topk=None, threshold=0.5, from_logits=True,
                 prefix="", loaders=None, *, output_key=None, num_classes=None, accuracy_args=None, topk_args=None,
                 suffix=None, log_on_batch=None):
        metric, input_key, target_key = accuracy_callback_args(  # Catalyst 20.12's and 22's spellings translated
            topk, prefix, input_key, target_key, output_key, num_classes, accuracy_args, topk_args, suffix,
            log_on_batch, lambda: AccuracyMetric(topk=topk or (1,), threshold=threshold, from_logits=from_logits,
                                                 prefix=prefix))
        super().__init__(metric, input_key, target_key, loaders)


class MultiLabelAccuracyCallback(MetricCallback):
    """Share of (sample, label) pairs right, ``activation(outputs) > threshold`` vs 0/1 targets ``(N, K)``:
    ``multilabel_accuracy`` (Catalyst 20.12's spelling with ``output_key=``: ``prefix`` is the whole name)."""

    def __init__(self, input_key=None, target_key=None, threshold=0.5, activation="sigmoid", prefix="",
                 loaders=None, *, output_key=None):
        name = (prefix or "multilabel_accuracy") if output_key is not None else prefix + "multilabel_accuracy"
        super().__init__(MultiLabelAccuracyMetric(threshold=threshold, activation=activation, name=name),
                         *resolve_keys("MultiLabelAccuracyCallback", input_key, target_key, output_key), loaders)


class PrecisionRecallF1Callback(MetricCallback):
    """Binary (``num_classes=None``) or multi-class macro/micro ``precision``, ``recall`` and ``f1``."""

    def __init__(self, input_key="logits", target_key="targets", num_classes=None, average=None, threshold=0.5,
                 from_logits=True, prefix="", loaders=None):
        super().__init__(PrecisionRecallF1Metric(num_classes=num_classes, average=average, threshold=threshold,
                                                 from_logits=from_logits, prefix=prefix),
                         input_key, target_key, loaders)


class AUCCallback(MetricCallback):
    """ROC AUC over the whole loader (state gathered across ranks): ``auc`` and ``auc/<class>``."""

    def __init__(self, input_key="logits", target_key="targets", average="macro", class_names=None, prefix="",
                 loaders=None):
        super().__init__(AUCMetric(average=average, class_names=class_names, prefix=prefix),
                         input_key, target_key, loaders)


class FunctionalMetricCallback(MetricCallback):
    """Any ``fn(outputs, targets) -> tensor`` (a batch mean), averaged over the loader by batch size, as ``name``.

    Catalyst 22's ``FunctionalMetricCallback(input_key, target_key, metric_fn, metric_key, prefix=, suffix=)``
    also works (by position or by name)."""

    def __init__(self, fn=None, name: str = None, input_key=None, target_key=None, prefix="", loaders=None, *,
                 metric_fn=None, metric_key: str = None, suffix: str = None, compute_on_call: bool = True,
                 log_on_batch: bool = True):
        metric, input_key, target_key = functional_metric_args(  # Catalyst 22's spelling translated
            fn, name, input_key, target_key, metric_fn, metric_key, prefix, suffix)
        super().__init__(metric, input_key, target_key, loaders)
