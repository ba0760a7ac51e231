"""Writes the run's merged config to ``logdir/config.yml`` when the experiment starts (main rank)."""
import os

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope
from torchstage.files.atomic import write_atomic


class ConfigSaver(Callback):
    """Saves ``text`` (the YAML a config run was built from) so the run can be repeated from its logdir."""

    order = CallbackOrder.Logging
    scope = CallbackScope.Main
    name = "config"

    def __init__(self, text: str, filename: str = "config.yml"):
        self.text, self.filename = text, filename

    def attach(self, shared) -> None:
        shared.keep_config(self.text)  # the loggers log it with the hyperparameters

    def on_experiment_start(self, runner):
        write_atomic(os.path.join(runner.spec.logdir, self.filename), self.text.encode(), durable=False)
