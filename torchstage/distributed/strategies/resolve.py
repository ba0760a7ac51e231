"""The one place where ``train(strategy=...)`` (a name or an instance) becomes a strategy object."""
from torchstage.distributed.strategies.ddp import DDP
from torchstage.distributed.strategies.single import SingleDevice

#: Names ``train(strategy=...)`` accepts, each with the class it makes.
NAMED = (DDP,)


def resolve_strategy(strategy):
    """A strategy object for ``strategy``; raises ValueError, before training, for what cannot be used."""
    if isinstance(strategy, SingleDevice):
        return strategy
    if strategy == "fsdp":
        raise ValueError("strategy='fsdp' is not supported yet: sharding replaces the parameters that the "
                         "optimizer given to train() holds, so it would update stale tensors; use strategy='ddp'")
    for kind in NAMED:
        if strategy == kind.name:
            return kind()
    raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
