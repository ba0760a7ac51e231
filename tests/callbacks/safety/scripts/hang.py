"""A 2-rank training run that hangs or has uneven batches on purpose, for the watchdog tests.

Usage: python hang.py LOGDIR; settings from env: HANG_MODE (none | sleep | deadlock | recv | uneven |
uneven-unknown), HANG_RANK (the rank that misbehaves, 1), HANG_TIMEOUT (train's hang_timeout, 3),
HANG_BATCH (the train batch of epoch 1 after which the rank hangs, 3), HANG_SLEEP (seconds per batch, 0).
Each rank writes LOGDIR/pids/<pid> at start; the hanging rank writes LOGDIR/stuck-at (time) before it hangs.
"""
import os
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from torchstage import Callback, SupervisedRunner

logdir = sys.argv[1]
mode = os.environ.get("HANG_MODE", "none")
bad_rank = int(os.environ.get("HANG_RANK", 1))
rank = int(os.environ.get("RANK", 0))
hang_batch = int(os.environ.get("HANG_BATCH", 3))
per_batch = float(os.environ.get("HANG_SLEEP", 0))


def stuck_in_user_code():
    """Sleep far longer than any test waits."""
    time.sleep(3600)


def deadlocked_in_user_code():
    """Take a lock this thread already holds: a classic self-deadlock."""
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def waiting_for_a_message():
    """Receive from a peer that never sends: stuck inside torch.distributed."""
    torch.distributed.recv(torch.zeros(1), src=0 if rank else 1)  # the recv nobody sends to


class Misbehave(Callback):
    def on_experiment_start(self, runner):
        os.makedirs(os.path.join(logdir, "pids"), exist_ok=True)
        open(os.path.join(logdir, "pids", str(os.getpid())), "w").close()

    def on_batch_end(self, runner):
        if per_batch:
            time.sleep(per_batch)
        if (mode in ("sleep", "deadlock", "recv") and runner.engine.rank == bad_rank and runner.is_train_loader
                and runner.epoch == 1 and runner.batch_step == hang_batch):
            with open(os.path.join(logdir, "stuck-at"), "w") as f:
                f.write(repr(time.time()))
            if mode == "recv":
                waiting_for_a_message()
            else:
                stuck_in_user_code() if mode == "sleep" else deadlocked_in_user_code()


class Batches(IterableDataset):
    """``n`` batches of 8 samples (already batched); a length only if ``sized``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        generator = torch.Generator().manual_seed(rank)
        for _ in range(self.n):
            yield torch.randn(8, 4, generator=generator), torch.randint(0, 2, (8,), generator=generator)


class SizedBatches(Batches):
    def __len__(self):
        return self.n


data = TensorDataset(torch.randn(96, 4), torch.randint(0, 2, (96,)))
train = DataLoader(data, batch_size=8, shuffle=True)
if mode.startswith("uneven"):  # rank-dependent shards that torchstage uses as given
    n = 6 if rank == bad_rank else 5
    train = DataLoader(SizedBatches(n) if mode == "uneven" else Batches(n), batch_size=None)
model = torch.nn.Linear(4, 2)
SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         loaders={"train": train, "valid": DataLoader(data, batch_size=16)}, num_epochs=2,
                         callbacks={"misbehave": Misbehave()}, distributed=True,
                         hang_timeout=float(os.environ.get("HANG_TIMEOUT", 3)))
print(f"rank {rank} finished")
