"""A one-line summary per loader at each epoch's end, through the ``torchstage`` logger."""
import logging

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope

logger = logging.getLogger("torchstage")


def format_metrics(metrics: dict) -> str:
    """``loss=0.0812 lr=0.001`` with 4 significant digits."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


class ConsoleLogger(Callback):
    """Logs ``[stage] epoch e/n | train: loss=... | valid: loss=...`` on the main rank."""

    order = CallbackOrder.Logging
    scope = CallbackScope.Main
    name = "console"

    def on_epoch_end(self, runner):
        loop = runner.loop
        parts = [f"{loader}: {format_metrics(metrics)}" for loader, metrics in loop.epoch_metrics.items()]
        logger.info("[%s] epoch %d/%d | %s", loop.stage_key, loop.epoch, loop.num_epochs, " | ".join(parts))
