"""DistributedDataParallel: every rank holds the whole model; gradients are all-reduced in backward."""
import contextlib

from torch.nn.parallel import DistributedDataParallel

from torchstage.strategies.base import Strategy, gradients_of


class DDP(Strategy):
    """``strategy="ddp"``: models with trainable parameters are wrapped in DistributedDataParallel.

    On a single process nothing is wrapped (the run is a plain one-device run). Keyword arguments are
    passed on to ``DistributedDataParallel`` (for example ``find_unused_parameters=True``).
    """

    name = "ddp"

    def __init__(self, **ddp_kwargs):
        self.ddp_kwargs = ddp_kwargs

    def __repr__(self) -> str:
        return f"DDP({', '.join(f'{k}={v!r}' for k, v in self.ddp_kwargs.items())})"

    def setup(self, models, optimizers, plans=(), batch_size=None):
        """Each model that has trainable parameters in DistributedDataParallel (others as they are)."""
        return {name: self._wrap(model) for name, model in models.items()}, list(optimizers)

    def _wrap(self, model):
        if not self.engine.is_distributed or not any(p.requires_grad for p in model.parameters()):
            return model
        device_ids = [self.engine.device.index] if self.engine.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)

    def no_sync(self, model):
        """Skip DDP's gradient all-reduce for the backward passes inside this context (one model or a dict)."""
        models = model.values() if isinstance(model, dict) else [model]
        stack = contextlib.ExitStack()
        for m in models:
            if hasattr(m, "no_sync"):
                stack.enter_context(m.no_sync())
        return stack

    def finish_partial_group(self, optimizer, scale):
        """Rescale, and all-reduce and average the gradients that :meth:`no_sync` left local to this rank."""
        engine = self.engine
        if engine.world_size == 1:
            return super().finish_partial_group(optimizer, scale)
        for p in gradients_of(optimizer):
            engine.all_reduce_(p.grad).mul_(scale / engine.world_size)
