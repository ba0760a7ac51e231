"""``train(activation_checkpointing=Block)``: each block of those classes keeps only its input from forward and runs
its forward again in backward (less activation memory, about one more forward of compute).

Built on torch's ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``): each matching sub-module is
replaced in its parent by a wrapper holding it, so parameter names gain ``_checkpoint_wrapped_module.`` (state dicts
and checkpoints do not: the wrapper removes it, and torchstage's names ignore it). Random draws in a block (dropout)
are replayed alike in the recomputation, so the losses and gradients are those of the run without it.
"""
import torch


def check_classes(value, model=None) -> tuple:
    """``value`` (a module class or a tuple/list of them) as a tuple; TypeError for anything else, ValueError when
    ``model`` (a module or a dict of them) holds no sub-module of any of them."""
    classes = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not classes or not all(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
        raise TypeError(f"activation_checkpointing must be the class of the model's blocks (an nn.Module subclass, "
                        f"e.g. activation_checkpointing=Block) or a tuple of them, got {value!r}")
    if model is None:
        return classes
    models = model.values() if isinstance(model, dict) else [model]
    found = {type(m) for root in models for name, m in root.named_modules() if name}
    if not any(issubclass(kind, classes) for kind in found):
        names = sorted({kind.__name__ for kind in found})
        raise ValueError(f"activation_checkpointing={_names(classes)} matches no sub-module of the model, whose "
                         f"module classes are {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}; name the "
                         f"class of its repeated blocks")
    return classes


def checkpoint_blocks(model: torch.nn.Module, classes: tuple) -> torch.nn.Module:
    """``model`` with every sub-module of ``classes`` wrapped in an activation checkpoint (in place; the model itself
    is never wrapped)."""
    if not classes:
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # heavy; runs that ask for it only
        CheckpointWrapper, apply_activation_checkpointing)
    apply_activation_checkpointing(model, check_fn=lambda m: m is not model and isinstance(m, classes)
                                   and not isinstance(m, CheckpointWrapper))
    return model


def checkpointed_count(model: torch.nn.Module) -> int:
    """How many blocks of ``model`` are wrapped in an activation checkpoint."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    return sum(isinstance(m, CheckpointWrapper) for m in model.modules())


def _names(classes: tuple) -> str:
    """How a message writes the classes given."""
    return classes[0].__name__ if len(classes) == 1 else "(" + ", ".join(c.__name__ for c in classes) + ")"
