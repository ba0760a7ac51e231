"""The run control part of ``train()``'s arguments: reproducibility (``seed``, ``deterministic``), what the run
shows and logs, and how much of it runs (``check``, ``overfit``, validation every few epochs or batches)."""
from collections.abc import Mapping


def check_run_control(spec, runner) -> None:
    """``seed`` an integer, the switches that configure no callback True or False, ``loggers`` a dict. ``overfit``,
    ``valid_every``, ``valid_period`` and ``log_period`` configure callbacks of the default chain, which check their
    values (:mod:`torchstage.runner.defaults`); ``loggers`` (name -> logger callback, Catalyst 22's
    ``train(loggers=)``) are added to the chain, each logger checked there."""
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, int):
        raise TypeError(f"seed must be int, got {spec.seed!r}")
    for name in ("check", "timeit", "monitor"):
        if not isinstance(getattr(spec, name), bool):
            raise TypeError(f"{name} must be True or False, got {getattr(spec, name)!r}")
    if spec.loggers is not None and not isinstance(spec.loggers, Mapping):
        raise TypeError(f"loggers must be a dict name -> logger callback, got {type(spec.loggers).__name__}")
