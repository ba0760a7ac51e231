"""Metric callbacks: feed ``batch[input_key]``/``batch[target_key]`` to an accumulator, publish at loader end."""
import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.metrics import (AccuracyMetric, AUCMetric, FunctionalMetric, Metric, MultiLabelAccuracyMetric,
                                PrecisionRecallF1Metric)


class MetricCallback(Callback):
    """Runs any :class:`~torchstage.metrics.Metric` over each loader; results go to ``runner.loader_metrics``.

    Updates stay on the device; at loader end the state is reduced across ranks once and turned into
    floats with one host copy. ``loaders`` limits it to some loaders (default: all).
    """

    order = CallbackOrder.Metric
    state_per_rank = True  # the partial state of a mid-loader checkpoint differs between ranks

    def __init__(self, metric: Metric, input_key: str = "logits", target_key: str = "targets", loaders=None):
        if not isinstance(metric, Metric):
            raise TypeError(f"metric must be a torchstage.metrics.Metric, got {type(metric).__name__}")
        _check_keys(type(self).__name__, input_key, target_key)
        self.metric, self.input_key, self.target_key = metric, input_key, target_key
        self.loaders = None if loaders is None else ({loaders} if isinstance(loaders, str) else set(loaders))
        self._in_loader, self._resumed = False, None

    @property
    def produces(self):
        return self.metric.names

    def attach(self, shared) -> None:
        shared.add_metric(self)  # copied for a validation pass in the middle of an epoch

    def _active(self, runner) -> bool:
        return self.loaders is None or runner.loop.loader_key in self.loaders

    def on_loader_start(self, runner):
        self.metric.reset()
        if self._resumed:  # a run resumed mid-loader (or rolled back) continues the partial state
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
                self.metric.update(runner.loop.batch[self.input_key], runner.loop.batch[self.target_key])

    def on_loader_end(self, runner):
        self._in_loader = False
        if not self._active(runner):
            return
        self.metric.sync(runner.engine)
        values = self.metric.compute()
        floats = torch.stack([v.reshape(()).double() for v in values.values()]).tolist()
        runner.loop.loader_metrics.update(zip(values, floats))


class AccuracyCallback(MetricCallback):
    """Top-k accuracy (multi-class logits) or thresholded binary accuracy: ``accuracy``, ``accuracy_top{k}``
    (``topk`` default ``(1,)``)."""

    def __init__(self, input_key="logits", target_key="targets", topk=None, threshold=0.5, from_logits=True,
                 prefix="", loaders=None):
        super().__init__(AccuracyMetric(topk=topk or (1,), threshold=threshold, from_logits=from_logits,
                                        prefix=prefix), input_key, target_key, loaders)


class MultiLabelAccuracyCallback(MetricCallback):
    """Share of (sample, label) pairs right, ``activation(outputs) > threshold`` vs 0/1 targets ``(N, K)``:
    ``{prefix}multilabel_accuracy``."""

    def __init__(self, input_key="logits", target_key="targets", threshold=0.5, activation="sigmoid", prefix="",
                 loaders=None):
        super().__init__(MultiLabelAccuracyMetric(threshold=threshold, activation=activation,
                                                  name=prefix + "multilabel_accuracy"), input_key, target_key, loaders)


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
    """Any ``fn(outputs, targets) -> tensor`` (a batch mean), averaged over the loader by batch size, as ``name``."""

    def __init__(self, fn, name: str, input_key="logits", target_key="targets", prefix="", loaders=None):
        if not callable(fn):
            raise TypeError(f"FunctionalMetricCallback: the metric function must be callable (outputs, targets) -> "
                            f"tensor, got {fn!r}")
        super().__init__(FunctionalMetric(fn, name=name, prefix=prefix or ""), input_key, target_key, loaders)


def _check_keys(owner: str, input_key, target_key) -> None:
    """Both keys name entries of ``runner.batch`` (strings), and not the same one."""
    for name, value in (("input_key", input_key), ("target_key", target_key)):
        if not isinstance(value, str):
            raise TypeError(f"{owner}: {name} must be a str (a key of runner.batch), got {value!r}")
    if input_key == target_key:
        raise ValueError(f"{owner}(input_key={input_key!r}, target_key={target_key!r}) would compare batch"
                         f"[{input_key!r}] with itself: input_key names the model output, target_key the target (where "
                         f"Catalyst 20.12's input_key named the target)")
