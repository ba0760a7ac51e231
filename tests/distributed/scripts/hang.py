"""Two gloo ranks; rank HANG_RANK sleeps for an hour in a callback at global train batch 3: python hang.py LOGDIR"""
import os
import sys
import time

from tests.resume_helpers import tiny_train_kwargs
from torchstage import Callback, SupervisedRunner


class SleepForever(Callback):
    def __init__(self, rank):
        self.rank = rank

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == 3 and runner.engine.rank == self.rank:
            deep_in_user_code()


def deep_in_user_code():
    time.sleep(3600)


if __name__ == "__main__":
    SupervisedRunner().train(**tiny_train_kwargs(sys.argv[1], num_epochs=2), callbacks=[SleepForever(
        int(os.environ.get("HANG_RANK", 1)))], distributed=True, nprocs=2, hang_timeout=5)
