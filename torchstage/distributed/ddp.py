"""The engine of one rank in a process group: its device, DDP/FSDP wrapping, gradient-sync control."""
import contextlib
from dataclasses import dataclass

import torch

from torchstage.distributed.engine import Engine
from torchstage.named import each

STRATEGIES = ("ddp", "fsdp")


@dataclass
class DistributedEngine(Engine):
    """An :class:`Engine` for rank ``rank`` of ``world_size`` with an initialised process group.

    ``strategy`` is ``"ddp"`` (DistributedDataParallel); ``"fsdp"`` is recognised and refused for now.
    Models are placed by :meth:`prepare_model` and wrapped by :meth:`wrap_model` after checkpoint loading.
    """

    strategy: str = "ddp"

    def __post_init__(self):
        super().__post_init__()
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP-wrap a model that has trainable parameters (others are returned as they are)."""
        if not self.is_distributed or not any(p.requires_grad for p in model.parameters()):
            return model
        if self.strategy == "fsdp":
            return _fully_shard(model)
        from torch.nn.parallel import DistributedDataParallel
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def no_sync(self, model):
        """Skip gradient all-reduce for the backward passes inside this context (accumulation steps)."""
        models = each(model)
        stack = contextlib.ExitStack()
        for m in models:
            if hasattr(m, "no_sync"):
                stack.enter_context(m.no_sync())
            elif hasattr(m, "set_requires_gradient_sync"):  # FSDP2
                m.set_requires_gradient_sync(False)
                stack.callback(m.set_requires_gradient_sync, True)
        return stack


def _fully_shard(model):
    """FSDP is refused clearly: sharding replaces the parameters the user's optimizer holds."""
    raise NotImplementedError(
        "strategy='fsdp' is not supported yet: FSDP replaces the model's parameters, so the optimizer given to "
        "train() would update stale tensors; use strategy='ddp'")
