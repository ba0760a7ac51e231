"""Catalyst 22's metric-callback arguments translated to torchstage's, each noted once.

Catalyst 22 spells the keys as torchstage does (``input_key`` = the model output, ``target_key`` = the target);
what differs is the metric names (``accuracy01`` for torchstage's ``accuracy``) and a few arguments that exist only
in 22 (``num_classes`` with ``target_key``, ``suffix``, ``log_on_batch``, ``metric_fn``/``metric_key``).
"""
from torchstage.logging_setup import note_alias
from torchstage.catalyst.renamed import RenamedMetric
from torchstage.metrics import AccuracyMetric, FunctionalMetric


def default_topk(num_classes) -> list:
    """Catalyst's default top-k for ``num_classes``: 1, then 3 and 5 where there are more classes than that."""
    return [1] + [k for k in (3, 5) if num_classes is not None and num_classes > k]


def accuracy22(topk, num_classes, prefix, suffix) -> RenamedMetric:
    """Catalyst 22's ``AccuracyCallback(input_key, target_key, topk=, num_classes=, prefix=, suffix=)``: keys
    ``{prefix}accuracy01{suffix}``, ``{prefix}accuracy03{suffix}``... (top-k default from ``num_classes``)."""
    ks = tuple(topk) if topk is not None else tuple(default_topk(num_classes))
    note_alias("AccuracyCallback(input_key, target_key, num_classes=...) (keys accuracy01, accuracy03)",
               "AccuracyCallback(input_key, target_key, topk=(1, 3)) (keys accuracy, accuracy_top3)", version="22")
    prefix, suffix = prefix or "", suffix or ""
    return RenamedMetric(AccuracyMetric(topk=ks),
                         {("accuracy" if k == 1 else f"accuracy_top{k}"): f"{prefix}accuracy{k:02d}{suffix}"
                          for k in ks})


def functional_metric_args(fn, name, input_key, target_key, metric_fn, metric_key, prefix, suffix) -> tuple:
    """``(metric, input key, target key)`` of a FunctionalMetricCallback: torchstage's ``(fn, name, input_key=,
    target_key=)`` or Catalyst 22's ``(input_key, target_key, metric_fn, metric_key, prefix=, suffix=)``, by
    position (a str first) or by name."""
    owner = "FunctionalMetricCallback"
    if isinstance(fn, str):  # Catalyst 22 by position: (input_key, target_key, metric_fn, metric_key)
        fn, name, input_key, target_key, metric_fn, metric_key = (
            None, None, fn, name, _one(owner, "metric_fn", input_key, metric_fn),
            _one(owner, "metric_key", target_key, metric_key))
    if metric_fn is not None or metric_key is not None:
        if fn is not None or name is not None:
            raise TypeError(f"{owner}: give fn, name (torchstage) or Catalyst 22's metric_fn=, metric_key=, not both")
        if metric_fn is None or not isinstance(metric_key, str):
            raise TypeError(f"{owner}: Catalyst 22's spelling needs metric_fn=<callable> and metric_key=<name>, got "
                            f"metric_fn={metric_fn!r}, metric_key={metric_key!r}")
        note_alias(f"{owner}(input_key, target_key, metric_fn, metric_key)",
                   f"{owner}(fn, name, input_key=..., target_key=...)", version="22")
        fn, name, prefix = metric_fn, f"{prefix or ''}{metric_key}", ""
    if suffix is not None:
        name = f"{name}{suffix}"
    if not callable(fn):
        raise TypeError(f"{owner}: the metric function must be callable (outputs, targets) -> tensor, got {fn!r}")
    return FunctionalMetric(fn, name=name, prefix=prefix or ""), input_key or "logits", target_key or "targets"


def _one(owner: str, name: str, positional, keyword):
    """The value of a Catalyst 22 argument given by position or by name, not both."""
    if positional is not None and keyword is not None:
        raise TypeError(f"{owner}: {name} given by position and by name")
    return keyword if positional is None else positional
