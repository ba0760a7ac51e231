"""``train()`` switches that are no callback's argument (``amp``, ``compile``, ``check``, ``timeit``), and ``torch.compile``.

Arguments that configure a callback (``accumulation_steps``, ``valid_every``, ``overfit``, periods...) are
checked by that callback, built in :mod:`torchstage.runner.defaults`.
"""
import torch

from torchstage.one_or_many import map_named
from torchstage.strategies.precision import amp_dtype


def check_switches(spec) -> None:
    """Raise TypeError/ValueError naming the argument if a switch is malformed."""
    amp_dtype(spec.amp)
    if not isinstance(spec.compile, (bool, dict)):
        raise TypeError(f"compile must be True/False or a dict of torch.compile arguments "
                        f"(e.g. {{'mode': 'reduce-overhead'}}), got {spec.compile!r}")
    for name in ("check", "timeit", "monitor"):
        if not isinstance(getattr(spec, name), bool):
            raise TypeError(f"{name} must be True or False, got {getattr(spec, name)!r}")


def compile_models(runner, compile) -> None:
    """``compile=True`` (or a dict of torch.compile arguments): compile each placed model."""
    if not compile:
        return
    kwargs = {} if compile is True else dict(compile)
    runner.model = map_named(lambda model: torch.compile(model, **kwargs), runner.model)
