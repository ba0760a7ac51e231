"""Catalyst 20.12's callback arguments translated to torchstage's, each noted once; the ambiguous ones refused.

Each callback class with 20.12 arguments calls one function of this module from its constructor.

Key names: in torchstage ``input_key`` names the model output a callback reads and ``target_key`` the
target. In Catalyst 20.12 ``input_key`` named the target (a key of the batch) and ``output_key`` the model
output. Giving ``output_key`` selects 20.12's meaning; ``input_key`` alone keeps torchstage's, and an
``input_key`` that names the target itself (20.12's ``input_key="targets"``) is refused with both spellings.
"""
from torchstage.catalyst.callback_args22 import accuracy22, default_topk
from torchstage.logging_setup import note_alias
from torchstage.catalyst.renamed import RenamedMetric
from torchstage.metrics import AccuracyMetric, FunctionalMetric

_BOTH = ("use input_key=<model output>, target_key=<target> (torchstage) or input_key=<target>, "
         "output_key=<model output> (Catalyst 20.12), not a mix")


def resolve_keys(owner: str, input_key, target_key, output_key, catalyst: bool = False) -> tuple:
    """``(prediction key, target key)`` from either spelling; ``catalyst=True`` when a 20.12-only argument
    (``prefix=`` of a criterion, ``metric_fn=``, ``accuracy_args=``...) already chose 20.12's meaning."""
    for name, value in (("input_key", input_key), ("target_key", target_key), ("output_key", output_key)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{owner}: {name} must be a str (a key of runner.batch), got {value!r}")
    if output_key is not None or catalyst:
        if target_key is not None:
            raise TypeError(f"{owner}(target_key={target_key!r}) with Catalyst 20.12 arguments: {_BOTH}")
        note_alias(f"{owner}(input_key=<target>, output_key=<model output>)",
                   f"{owner}(input_key=<model output>, target_key=<target>)")
        prediction, target = output_key or "logits", input_key or "targets"
    else:
        prediction, target = input_key or "logits", target_key or "targets"
    if prediction == target:
        raise ValueError(f"{owner}(input_key={input_key!r}) would compare batch[{prediction!r}] with itself: in "
                         f"torchstage input_key names the model output and target_key the target, while Catalyst "
                         f"20.12's input_key named the target. Write {owner}(input_key='logits', "
                         f"target_key={target!r}) or, in 20.12's spelling, add output_key='logits'")
    return prediction, target


def renamed_argument(owner: str, old: str, old_value, new: str, new_value, default=None, version: str = "20.12"):
    """The value of torchstage's ``new=`` argument, or of Catalyst ``version``'s ``old=`` name for it (noted once);
    TypeError when both are given."""
    if old_value is None:
        return new_value
    if new_value != default:
        raise TypeError(f"{owner}: give {new}=... or Catalyst {version}'s {old}=..., not both")
    note_alias(f"{owner}({old}=...)", f"{owner}({new}=...)", version=version)
    return old_value


def criterion_args(owner: str, input_key, target_key, output_key, metric_key, prefix) -> tuple:
    """``(prediction key, target key, loss name)`` of a criterion callback from either spelling."""
    keys = resolve_keys(owner, input_key, target_key, output_key, catalyst=prefix is not None)
    return (*keys, metric_name(owner, metric_key, prefix))


def metric_name(owner: str, metric_key, prefix, default: str = "loss") -> str:
    """The batch-metric name: torchstage's ``metric_key`` or Catalyst 20.12's ``prefix`` (a criterion's)."""
    if prefix is not None:
        if metric_key is not None:
            raise TypeError(f"{owner}: give metric_key=... or Catalyst 20.12's prefix=..., not both")
        note_alias(f"{owner}(prefix=...)", f"{owner}(metric_key=...)")
        return prefix
    return default if metric_key is None else metric_key


def optimizer_args(metric_key, loss_key, grad_clip_norm, grad_clip_value, grad_clip_params, decouple_weight_decay,
                   use_amp, use_apex) -> tuple:
    """``(metric_key, grad_clip_norm, grad_clip_value)`` of an OptimizerCallback from either spelling; 20.12's
    arguments that torchstage handles elsewhere (weight decay, apex, amp) are refused with where they went."""
    grad_clip_norm, grad_clip_value = grad_clip_from_params(grad_clip_params, grad_clip_norm, grad_clip_value)
    refuse_catalyst_optimizer_args(decouple_weight_decay, use_amp, use_apex)
    return (metric_key if loss_key is None else loss_key), grad_clip_norm, grad_clip_value


def grad_clip_from_params(params, grad_clip_norm, grad_clip_value) -> tuple:
    """``(grad_clip_norm, grad_clip_value)`` from Catalyst 20.12's ``grad_clip_params`` dict."""
    if params is None:
        return grad_clip_norm, grad_clip_value
    if grad_clip_norm is not None or grad_clip_value is not None:
        raise TypeError("OptimizerCallback: give grad_clip_norm/grad_clip_value or Catalyst 20.12's "
                        "grad_clip_params, not both")
    expected = ("expected {'func': 'clip_grad_norm_', 'max_norm': x} (norm_type 2) or "
                "{'func': 'clip_grad_value_', 'clip_value': x}")
    if not isinstance(params, dict):
        raise TypeError(f"OptimizerCallback: grad_clip_params must be a dict, {expected}; got {params!r}")
    params = dict(params)
    func = params.pop("func", None)
    if func in ("clip_grad_norm_", "ClipGradNorm") and set(params) <= {"max_norm", "norm_type"} \
            and "max_norm" in params and params.get("norm_type", 2) in (2, 2.0):
        note_alias("OptimizerCallback(grad_clip_params={'func': 'clip_grad_norm_', ...})",
                   "OptimizerCallback(grad_clip_norm=...) or train(grad_clip_norm=...)")
        return params["max_norm"], None
    if func in ("clip_grad_value_", "ClipGradValue") and set(params) == {"clip_value"}:
        note_alias("OptimizerCallback(grad_clip_params={'func': 'clip_grad_value_', ...})",
                   "OptimizerCallback(grad_clip_value=...) or train(grad_clip_value=...)")
        return None, params["clip_value"]
    raise ValueError(f"OptimizerCallback: grad_clip_params={dict(params, func=func)!r} is not supported; "
                     f"{expected}")


def refuse_catalyst_optimizer_args(decouple_weight_decay: bool, use_amp, use_apex) -> None:
    """OptimizerCallback arguments of Catalyst 20.12 that torchstage handles elsewhere or not at all."""
    if decouple_weight_decay:
        raise ValueError("OptimizerCallback(decouple_weight_decay=True) is gone: use torch.optim.AdamW (or SGD "
                         "with its own weight_decay), which decouples weight decay itself")
    if use_apex:
        raise ValueError("OptimizerCallback(use_apex=True): apex was removed from torchstage; pass "
                         "train(amp='fp16'/'bf16') (Catalyst's fp16=True also works)")
    if use_amp:
        raise ValueError("OptimizerCallback(use_amp=True): mixed precision is set for the whole run with "
                         "train(amp='fp16'/'bf16'/'auto') (Catalyst's fp16=True also works)")


def metric_args(owner: str, metric, input_key, target_key, loaders, metric_fn, output_key, prefix, multiplier,
                metric_kwargs) -> tuple:
    """``(metric, prediction key, target key, loaders)`` of a MetricCallback: torchstage's ``(metric, input_key,
    target_key, loaders)``, or Catalyst 20.12's ``(prefix, metric_fn, input_key=<target>, output_key=...)``."""
    if isinstance(metric, str) or metric_fn is not None or prefix is not None:
        return catalyst_metric_args(metric, input_key, target_key, loaders, metric_fn, output_key, prefix, multiplier,
                                    metric_kwargs)
    if metric_kwargs:
        raise TypeError(f"{owner}() got unexpected argument(s) {sorted(metric_kwargs)}")
    return (metric, *resolve_keys(owner, input_key, target_key, output_key), loaders)


def accuracy_callback_args(topk, prefix, input_key, target_key, output_key, num_classes, accuracy_args_, topk_args,
                           suffix, log_on_batch, torchstage_metric) -> tuple:
    """``(metric, prediction key, target key)`` of an AccuracyCallback: ``torchstage_metric()`` with torchstage's
    keys; Catalyst 20.12's ``num_classes=, accuracy_args=[1, 3]`` or Catalyst 22's ``target_key=, num_classes=``
    (``suffix=``, ``log_on_batch=``) metric, both named ``accuracy01``, ``accuracy03``. The arguments given pick
    the version: ``output_key``/``accuracy_args``/``topk_args`` exist only in 20.12, ``target_key`` with
    ``num_classes`` and ``suffix``/``log_on_batch`` only in 22; a mix is refused with both spellings."""
    given20 = [n for n, v in (("output_key", output_key), ("accuracy_args", accuracy_args_),
                              ("topk_args", topk_args)) if v is not None]
    given22 = [n for n, v in (("suffix", suffix), ("log_on_batch", log_on_batch)) if v is not None]
    if num_classes is not None and target_key is not None:
        given22.insert(0, "target_key with num_classes")
    if given20 and given22:
        raise TypeError(f"AccuracyCallback: {', '.join(given20)} (Catalyst 20.12) with {', '.join(given22)} (Catalyst "
                        f"22): write AccuracyCallback(input_key=<target>, output_key=<model output>, num_classes=...,"
                        f" accuracy_args=[1, 3]) (20.12) or AccuracyCallback(input_key=<model output>, "
                        f"target_key=<target>, num_classes=..., topk=(1, 3)) (22), not a mix")
    if given22:
        return (accuracy22(topk, num_classes, prefix, suffix), input_key or "logits", target_key or "targets")
    if given20 or num_classes is not None:
        metric = catalyst_accuracy(topk, prefix, num_classes, accuracy_args_, topk_args)
        return (metric, *resolve_keys("AccuracyCallback", input_key, target_key, output_key, catalyst=True))
    return (torchstage_metric(), *resolve_keys("AccuracyCallback", input_key, target_key, output_key))


def catalyst_metric_args(metric, input_key, target_key, loaders, metric_fn, output_key, prefix, multiplier,
                         metric_kwargs) -> tuple:
    """``(metric, prediction key, target key, loaders)`` for Catalyst 20.12's ``MetricCallback(prefix, metric_fn,
    input_key="targets", output_key="logits", multiplier=1.0, **metric_kwargs)``, by position or by name."""
    owner = "MetricCallback"
    if isinstance(metric, str):  # positional 20.12 order: prefix, metric_fn, input_key, output_key
        if prefix is not None:
            raise TypeError(f"{owner}: the first argument {metric!r} is Catalyst 20.12's prefix; prefix= given too")
        prefix = metric
        if metric_fn is None and callable(input_key):
            metric_fn, input_key, target_key = input_key, target_key, None
            if isinstance(loaders, str) and output_key is None:
                output_key, loaders = loaders, None
    elif metric is not None:
        raise TypeError(f"{owner}: give a torchstage Metric or Catalyst 20.12's prefix/metric_fn, not both")
    if not isinstance(prefix, str) or not prefix:
        raise TypeError(f"{owner}(metric_fn=...) needs prefix=<metric name> (a non-empty str), got {prefix!r}")
    if not callable(metric_fn):
        raise TypeError(f"{owner}: metric_fn must be callable (outputs, targets, **kwargs), got {metric_fn!r}")
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
        raise TypeError(f"{owner}: multiplier must be a number, got {multiplier!r}")
    note_alias("MetricCallback(prefix, metric_fn, ...)", "FunctionalMetricCallback(fn, name, ...)")
    prediction, target = resolve_keys(owner, input_key, target_key, output_key, catalyst=True)

    def fn(outputs, targets):
        value = metric_fn(outputs, targets, **metric_kwargs)
        return value if multiplier == 1 else value * multiplier

    return FunctionalMetric(fn, name=prefix), prediction, target, loaders


def catalyst_accuracy(topk, prefix: str, num_classes, accuracy_args, topk_args):
    """Catalyst 20.12's ``AccuracyCallback(num_classes=, accuracy_args=[1, 3])``: ``accuracy01``, ``accuracy03``."""
    if topk is not None:
        raise TypeError("AccuracyCallback: give topk=... or Catalyst 20.12's accuracy_args/topk_args/num_classes, "
                        "not both")
    ks = topk_args or accuracy_args or default_topk(num_classes)
    note_alias("AccuracyCallback(accuracy_args=..., num_classes=...)", "AccuracyCallback(topk=(1, 3), ...)")
    prefix = prefix or "accuracy"
    return RenamedMetric(AccuracyMetric(topk=tuple(ks)),
                         {("accuracy" if k == 1 else f"accuracy_top{k}"): f"{prefix}{k:02}" for k in ks})
