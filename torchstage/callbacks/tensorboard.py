"""TensorBoard scalars through tensorboardX: ``logdir/tensorboard/<loader>/``, one point per epoch."""
import os

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope


class TensorBoardLogger(Callback):
    """Adds every loader metric as a scalar at the global epoch step (tensorboardX is imported lazily)."""

    order = CallbackOrder.Logging
    scope = CallbackScope.Main
    name = "tensorboard"

    def __init__(self, logdir: str = None):
        self.logdir, self.writers = logdir, {}

    def on_loader_end(self, runner):
        writer = self.writers.get(runner.loader_key)
        if writer is None:
            from tensorboardX import SummaryWriter
            folder = os.path.join(self.logdir or runner.spec.logdir, "tensorboard", runner.loader_key)
            writer = self.writers[runner.loader_key] = SummaryWriter(folder)
        for key, value in runner.loader_metrics.items():
            writer.add_scalar(key, value, runner.global_epoch_step)
        writer.flush()

    def on_experiment_end(self, runner):
        self.close()

    def on_exception(self, runner):
        self.close()

    def close(self):
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
