"""The one place where ``train(strategy=...)`` (a name or an instance) becomes a strategy object."""
from torchstage.distributed.strategies.ddp import DDP
from torchstage.distributed.strategies.fsdp import FSDP
from torchstage.distributed.strategies.single import SingleDevice

#: Names ``train(strategy=...)`` accepts, each with the class it makes.
NAMED = (DDP, FSDP)


def resolve_strategy(strategy):
    """A strategy object for ``strategy``; raises ValueError, before training, for what cannot be used."""
    if isinstance(strategy, SingleDevice):
        return strategy
    for kind in NAMED:
        if strategy == kind.name:
            return kind()
    raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r} (or pass a strategy object such as "
                     f"torchstage.FSDP(min_params=...))")
