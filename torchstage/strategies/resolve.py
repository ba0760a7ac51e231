"""The one place where ``train(strategy=...)`` (a name or an instance) becomes a strategy object."""
import difflib

from torchstage.strategies.base import Strategy
from torchstage.strategies.ddp import DDP
from torchstage.strategies.deepspeed import DeepSpeed
from torchstage.strategies.fsdp import FSDP
from torchstage.strategies.hsdp import HSDP

#: Names ``train(strategy=...)`` accepts, each with the class it makes.
NAMED = (DDP, FSDP, HSDP, DeepSpeed)


def resolve_strategy(strategy):
    """A strategy object for ``strategy``; raises ValueError, before training, for what cannot be used."""
    if isinstance(strategy, Strategy):
        return strategy
    for kind in NAMED:
        if strategy == kind.name:
            return kind()
    names = [repr(kind.name) for kind in NAMED]
    names = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    close = difflib.get_close_matches(strategy.lower(), [kind.name for kind in NAMED], n=1) \
        if isinstance(strategy, str) else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"strategy must be {names}, got {strategy!r}{hint} (or pass a strategy object such as "
                     f"torchstage.{NAMED[-1].__name__}(...))")
