"""Two gloo ranks whose validation is slow: python slow_valid.py LOGDIR; LOGDIR/validating appears when it starts."""
import os
import sys
import time

from tests.resume_helpers import tiny_train_kwargs
from torchstage import Callback, SupervisedRunner


class SlowValid(Callback):
    def __init__(self, logdir):
        self.marker = os.path.join(logdir, "validating")

    def on_batch_start(self, runner):
        if not runner.is_train_loader:
            if runner.engine.is_main and not os.path.exists(self.marker):
                open(self.marker, "w").close()
            time.sleep(20)


if __name__ == "__main__":
    logdir = sys.argv[1]
    SupervisedRunner().train(**tiny_train_kwargs(logdir, num_epochs=1), callbacks=[SlowValid(logdir)],
                             distributed=True, nprocs=2)
