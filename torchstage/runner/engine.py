"""The engine as a run shows it to its runner, callbacks and ``handle_batch`` (``runner.engine``).

It is the process's :class:`~torchstage.distributed.engine.Engine` (the same values, made once per run) with the
run's strategy at hand for two spellings of user code: Catalyst 22's ``self.engine.backward(loss)`` and
``self.engine.strategy``. The strategy itself is the runner's (``runner.strategy``) and was connected to the plain
engine, which knows no strategy; code below the runner reads only the Engine's fields.
"""
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from torchstage.distributed.engine import Engine


@dataclass(frozen=True)
class RunEngine(Engine):
    """An :class:`~torchstage.distributed.engine.Engine` of a run, with its ``strategy`` (``runner.strategy``)."""

    strategy: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, engine: Engine, strategy) -> "RunEngine":
        """``engine``'s values with ``strategy`` at hand."""
        return cls(**{f.name: getattr(engine, f.name) for f in fields(Engine)}, strategy=strategy)

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` through the strategy (scaled under float16): a custom ``handle_batch``'s backward,
        as Catalyst 22's ``self.engine.backward(loss)``."""
        self.strategy.backward(loss, None)
