"""The run control part of ``train()``'s arguments: reproducibility (``seed``, ``deterministic``), what the run
shows and logs, and how much of it runs (``check``, ``overfit``, validation every few epochs or batches)."""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class RunControl:
    """Seeding, output and how much runs. ``overfit``, ``valid_every``, ``valid_period`` and ``log_period`` configure
    callbacks of the default chain, which check their values (:mod:`torchstage.runner.defaults`); ``loggers`` (name
    -> logger callback, Catalyst 22's ``train(loggers=)``) are added to the chain, each logger checked there."""

    seed: int = 42
    deterministic: bool = False
    verbose: bool = False
    check: bool = False
    overfit: Any = False
    timeit: bool = False
    monitor: bool = False
    valid_every: int = 1
    valid_period: Any = None
    log_period: Any = None
    loggers: Optional[Mapping] = None

    def validate(self, runner) -> None:
        """``seed`` an integer, the switches that configure no callback True or False, ``loggers`` a dict."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be int, got {self.seed!r}")
        for name in ("check", "timeit", "monitor"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.loggers is not None and not isinstance(self.loggers, Mapping):
            raise TypeError(f"loggers must be a dict name -> logger callback, got {type(self.loggers).__name__}")
