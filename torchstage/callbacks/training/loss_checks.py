"""First-batch checks of what the criterion compares: model output against target, with a correct fix.

Run once per stage, on the first batch, so torch's own errors (``Target 9 is out of bounds``, a raw shape
RuntimeError) become one message naming both shapes and dtypes, the criterion and what to change. The same is
said when torch refuses the model's input (a dtype other than the parameters') or a backward from a loss that is
not a scalar: explained where torch failed, at no cost to a batch that does not fail.
"""
import logging
import math
import re

import torch

logger = logging.getLogger("torchstage")
_CLASS_INDEX = ("CrossEntropyLoss", "NLLLoss")
_ELEMENTWISE = ("MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss")
_SAME_SHAPE = ("BCELoss", "BCEWithLogitsLoss")  # torch refuses any other shape, even a broadcastable one


def describe(key: str, tensor) -> str:
    """``'logits' of shape [32, 7] (float32)``."""
    return f"{key!r} of shape {list(tensor.shape)} ({str(tensor.dtype).replace('torch.', '')})"


def check_loss_inputs(criterion, outputs, targets, output_key: str, target_key: str) -> bool:
    """Raise ValueError if ``criterion`` cannot compare them; warn once if they broadcast to another shape.

    Returns True when the shapes differ but broadcast (the caller then silences torch's duplicate warning).
    """
    name = type(criterion).__name__
    if not (isinstance(outputs, torch.Tensor) and isinstance(targets, torch.Tensor)):
        return False
    what = f"{name} compares model output {describe(output_key, outputs)} with target {describe(target_key, targets)}"
    if name in _CLASS_INDEX:
        _check_class_index(criterion, outputs, targets, what)
        return False
    if name not in _ELEMENTWISE:
        return False
    if not targets.is_floating_point():
        raise ValueError(f"{what}: it needs float targets; pass {target_key!r} as floats (targets.float())")
    if outputs.shape == targets.shape:
        return False
    try:
        shape = torch.broadcast_shapes(outputs.shape, targets.shape)
    except RuntimeError:
        raise ValueError(f"{what}: the shapes do not broadcast{_per_sample_hint(outputs, targets)}") from None
    reshape = (f" (e.g. targets.view({', '.join(map(str, outputs.shape))}))"
               if targets.numel() == outputs.numel() else "")
    if name in _SAME_SHAPE:
        raise ValueError(f"{what}: it needs both of one shape; reshape one of them{reshape}")
    logger.warning("%s: they broadcast to %s, so every output is compared with every target. Reshape one of "
                   "them%s unless this is intended.", what, list(shape), reshape)
    return True


def _check_class_index(criterion, outputs, targets, what: str) -> None:
    if outputs.dim() < 2:
        raise ValueError(f"{what}: it needs one score per class, an output of shape [batch, classes]")
    if targets.is_floating_point():
        if targets.shape != outputs.shape:
            raise ValueError(f"{what}: float targets are class probabilities of the output's shape; for class "
                             f"indices pass integer targets (targets.long())")
        return
    expected = [outputs.shape[0], *outputs.shape[2:]]
    if list(targets.shape) != expected:
        if outputs.dim() >= 3 and list(targets.shape) == list(outputs.shape[:-1]):
            classes = outputs.shape[-1]
            raise ValueError(f"{what}: {type(criterion).__name__} reads the classes on dimension 1, and these scores "
                             f"hold them on the last one ({classes} classes for each of {list(targets.shape)} "
                             f"targets, as a sequence model gives); for a language model's logits [batch, "
                             f"tokens, vocabulary] use criterion=torchstage.CausalLMLoss(); else move the classes "
                             f"to dimension 1 (logits.transpose(1, 2) in the model's forward), or flatten both "
                             f"(logits.reshape(-1, {classes}) and targets.reshape(-1))")
        one_each = targets.numel() == outputs.shape[0]
        raise ValueError(f"{what}: class-index targets need shape {expected} (one class per sample)"
                         f"{'; e.g. targets.view(-1) if they hold one class each' if one_each else ''}")
    ignore = getattr(criterion, "ignore_index", -100)
    counted = targets[targets != ignore]
    if counted.numel() == 0:
        return
    low, high = (int(v) for v in torch.stack([counted.min(), counted.max()]).tolist())  # one read, first batch only
    classes = outputs.shape[1]
    if high >= classes:
        raise ValueError(f"{what}: the target holds class {high} but the model gives {classes} scores per sample "
                         f"(classes 0..{classes - 1}); make the model output at least {high + 1} (e.g. its last "
                         f"layer nn.Linear(..., {high + 1}))")
    if low < 0:
        raise ValueError(f"{what}: the target holds class {low}; classes are 0..{classes - 1} (or "
                         f"ignore_index={ignore})")


def _per_sample_hint(outputs, targets) -> str:
    if outputs.dim() == 0 or targets.dim() == 0 or outputs.shape[0] != targets.shape[0]:
        return ""
    per_output, per_target = math.prod(outputs.shape[1:]), math.prod(targets.shape[1:])
    return (f"; the model gives {per_output} value(s) per sample and the target has {per_target}: make the model "
            f"output {per_target} per sample (e.g. its last layer nn.Linear(..., {per_target})), or give targets "
            f"of shape {list(outputs.shape)}")


def explain_failure(criterion, exc: Exception, outputs, targets, output_key: str, target_key: str) -> ValueError:
    """The error of a criterion that failed on the first batch, naming what it was given."""
    parts = [describe(k, t) if isinstance(t, torch.Tensor) else f"{k!r} ({type(t).__name__})"
             for k, t in ((output_key, outputs), (target_key, targets))]
    return ValueError(f"{type(criterion).__name__} failed on the first batch with model output {parts[0]} and "
                      f"target {parts[1]}: {type(exc).__name__}: {exc}")


def missing_key_message(owner: str, key, batch, fix: str) -> str:
    """Why ``batch[key]`` failed: the keys the batch has (a dict), and the argument that names them."""
    given = f"a dict with keys {sorted(map(str, batch))}" if isinstance(batch, dict) else f"a {type(batch).__name__}"
    return f"{owner} found no {key!r} in the batch, {given}: {fix}"


def input_dtype_error(model, inputs: dict, exc: Exception):
    """The error of a model that torch refused an input of another dtype than its parameters (int64 features into
    a float model, float64 from numpy), naming both dtypes and the fix; None when ``exc`` is about something else."""
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    if weight is None:
        return None
    for key, tensor in inputs.items():
        if isinstance(tensor, torch.Tensor) and tensor.dtype != weight.dtype and _names_dtype(str(exc), tensor.dtype):
            wanted = str(weight.dtype).replace("torch.", "")
            cast = f"{key}.float()" if weight.dtype == torch.float32 else f"{key}.to(torch.{wanted})"
            return ValueError(f"the model got input {describe(key, tensor)} but its parameters are {wanted}, and "
                              f"torch does not mix them ({type(exc).__name__}: {exc}); give it {wanted} inputs: "
                              f"{cast} in the dataset or its collate_fn")
    return None


def _names_dtype(message: str, dtype) -> bool:
    """Whether torch's ``message`` speaks of ``dtype`` ('Long', 'long int', 'torch.int64'...)."""
    name = torch.empty(0, dtype=dtype).type().replace("torch.", "").replace("Tensor", "")  # Long, Double, Byte...
    words = {name, {"Byte": "unsigned char", "Char": "signed char"}.get(name, name)}
    return str(dtype) in message or any(re.search(rf"\b{w}\b", message, re.IGNORECASE) for w in words)


def nonscalar_loss_error(criterion, metric_key: str, loss):
    """The error of a backward from a loss of several values (a criterion with ``reduction='none'``), naming the
    criterion: torch's own is ``grad can be implicitly created only for scalar outputs``; None for a scalar loss."""
    if not isinstance(loss, torch.Tensor) or loss.numel() == 1:
        return None
    source = ""
    if criterion is not None and not isinstance(criterion, dict):
        reduction = getattr(criterion, "reduction", None)
        source = f" of criterion {type(criterion).__name__}" + (f"(reduction={reduction!r})" if reduction else "")
    return ValueError(f"the loss {metric_key!r}{source} has shape {list(loss.shape)}, but the loss must be a scalar "
                      f"to backpropagate: build the criterion with reduction='mean' or 'sum' (or reduce the loss to "
                      f"one value in a callback before the backward)")
