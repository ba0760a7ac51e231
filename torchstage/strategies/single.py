"""One process on one device: the strategy a run without ``strategy=...`` gets."""
from torchstage.strategies.base import Strategy


class SingleDevice(Strategy):
    """One process on one device: models are placed, never wrapped; the step and state are plain torch."""

    def setup(self, models, optimizers, plans=(), batch_size=None):
        """The models and optimizers as they are."""
        return dict(models), list(optimizers)
