"""The metric contract: accumulate on the device per batch, reduce across ranks once, compute at the end.

A metric never syncs the host inside ``update`` (no ``.item()``, ``.cpu()``, ``.tolist()``, no
data-dependent shapes), so a loader runs without stalls; ``sync`` and ``compute`` run once per loader.
"""
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Dict, Optional

import torch

if TYPE_CHECKING:  # a type only: importing the metrics loads no engine
    from torchstage.distributed.engine import Engine

Values = Dict[str, torch.Tensor]


class Metric(ABC):
    """Base class: ``update`` per batch, ``sync(engine)`` once at loader end, then ``compute``.

    ``compute`` returns ``{prefix + name: 0-dim tensor}`` so one metric can report several values
    (precision, recall, f1). Lifecycle: ``reset`` -> ``update``* -> ``sync`` -> ``compute``; an
    ``update`` after ``sync`` raises (the state is global by then), ``reset`` starts over.
    """

    def __init__(self, prefix: str = ""):
        if not isinstance(prefix, str):
            raise TypeError(f"{type(self).__name__}: prefix must be a str, got {type(prefix).__name__}")
        self.prefix = prefix
        self.reset()

    def reset(self) -> None:
        """Forget everything accumulated; the metric is as new."""
        self._synced = False
        self._reset_state()

    def update(self, outputs, targets) -> None:
        """Accumulate one batch; device tensors only, never a host sync."""
        if self._synced:
            raise RuntimeError(f"{type(self).__name__}.update() after sync(): the state is already global; "
                               "call reset() first")
        self._update(outputs, targets)

    def sync(self, engine: Optional["Engine"]) -> None:
        """Reduce the state across the ranks of ``engine`` in place; every rank must call it.

        Afterwards every rank holds the global state, so ``compute`` gives the same numbers on all
        ranks. A second ``sync`` before ``reset`` is a no-op; on one process it only marks the state.
        """
        if self._synced:
            return
        if engine is not None and engine.is_distributed:
            self._sync(engine)
        self._synced = True

    def state_dict(self) -> dict:
        """This rank's partial state (tensors on the CPU), for a checkpoint written in the middle of a loader."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s partial state (the metric is reset first)."""
        self.reset()

    def merge_state_dicts(self, states: list) -> dict:
        """One partial state holding what every rank's :meth:`state_dict` held (a run resumed mid-loader on
        another number of processes continues from it on one rank); TypeError where the metric cannot say."""
        raise TypeError(f"{type(self).__name__} cannot merge the partial states of several processes")

    @property
    def names(self) -> tuple:
        """The result keys known before any data (``prefix`` included), to check ``valid_metric`` early."""
        return tuple(self.prefix + name for name in self._names())

    def _names(self) -> tuple:
        return ()

    def compute(self) -> Values:
        """``{prefix + name: 0-dim tensor}`` on the state's device; raises if nothing was accumulated."""
        return {self.prefix + name: value for name, value in self._compute().items()}

    # ---- to implement ----------------------------------------------------------------------
    @abstractmethod
    def _reset_state(self) -> None: ...

    @abstractmethod
    def _update(self, outputs, targets) -> None: ...

    @abstractmethod
    def _sync(self, engine) -> None: ...

    @abstractmethod
    def _compute(self) -> Values: ...

    def _empty_error(self) -> ValueError:
        return ValueError(f"{type(self).__name__}.compute() called with no samples accumulated "
                          "(no update() since reset(), or only empty batches)")


class AdditiveStateMetric(Metric):
    """A metric whose whole state is one float64 vector of sums and counts: one all-reduce syncs it.

    Subclasses call ``_add(vector)`` or write ``_state_like(ref)[i] += x`` in ``_update`` and read
    ``self._state`` in ``_compute``. The vector is created lazily on the first batch's device.
    """

    _state_size: int = 0

    def _reset_state(self) -> None:
        self._state: Optional[torch.Tensor] = None

    def _state_like(self, ref: torch.Tensor) -> torch.Tensor:
        """The state vector, created as zeros on ``ref``'s device if this is the first batch."""
        if self._state is None:
            self._state = torch.zeros(self._state_size, dtype=torch.float64, device=ref.device)
        return self._state

    def state_dict(self) -> dict:
        return {} if self._state is None else {"state": self._state.detach().cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.reset()
        if "state" in state:
            self._state = state["state"].clone()

    def merge_state_dicts(self, states: list) -> dict:
        parts = [state["state"] for state in states if "state" in state]
        return {"state": torch.stack(parts).sum(0)} if parts else {}

    def _add(self, vector: torch.Tensor) -> None:
        self._state_like(vector).add_(vector.detach().to(torch.float64))

    def _sync(self, engine) -> None:
        if self._state is None:  # this rank saw no batch: contribute zeros, still join the collective
            self._state = torch.zeros(self._state_size, dtype=torch.float64, device=engine.device)
        self._state = self._state.to(engine.device)
        engine.all_reduce_samples_(self._state)

    def _checked_state(self) -> torch.Tensor:
        if self._state is None:
            raise self._empty_error()
        return self._state
