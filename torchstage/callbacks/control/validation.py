"""``train(valid_every=N)``: run the non-train loaders only every N epochs (and at each stage's last epoch)."""
from torchstage.arguments import check_int
from torchstage.callbacks.base import Callback, CallbackOrder


class ValidEveryCallback(Callback):
    """Skips every loader whose name does not start with ``train`` on epochs not divisible by ``every``.

    Skipped loaders fire no event at all, so they log nothing and keep no metrics for that epoch; the
    last epoch of a stage always validates, so a stage ends with fresh valid metrics.
    """

    order = CallbackOrder.Internal
    name = "valid_every"

    def __init__(self, every: int):
        self.every, self._all = check_int("every", every), None

    def on_epoch_start(self, runner):
        if runner.loop.epoch % self.every and runner.loop.epoch != runner.loop.num_epochs:
            self._all = runner.loop.loaders
            runner.loop.loaders = {k: v for k, v in runner.loop.loaders.items() if k.startswith("train")}

    def on_epoch_end(self, runner):
        if self._all is not None:
            runner.loop.loaders, self._all = self._all, None
