"""A 4-rank training run in which one rank (FAULT_RANK, 1) misbehaves at train batch 3 of epoch 1, for the
diagnosis tests.

Usage: python faults.py LOGDIR; FAULT (from env): extra_collective (the rank runs an all_reduce the others do
not), extra_same_shape (the rank's extra all_reduce has the shape of the gradients' all-reduce: the
weight is frozen, the bias's 2 floats remain),
shape_mismatch (every rank all-reduces, the rank with another shape), stalled_loader (the rank's dataset
never returns), sigkill (the rank is killed), sigkill_peers_wait (the rank is killed once the others wait in a
recv from one another, which its death never ends), exit0 (the rank calls sys.exit(0)); HANG_TIMEOUT (30).
With TORCHSTAGE_MAX_RESTARTS, a restarted attempt runs without the fault.
Each rank writes its pid to LOGDIR/started-<rank> at start; the faulting rank writes LOGDIR/fault-at (time) just before.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from torchstage import Callback, SupervisedRunner

logdir, fault = sys.argv[1], os.environ["FAULT"]
bad_rank = int(os.environ.get("FAULT_RANK", 1))
rank = int(os.environ.get("RANK", 0))
restarted = os.environ.get("TORCHSTAGE_RESTART_COUNT", "0") != "0"  # faults happen on a first attempt only
AT_BATCH = 3


def mark_fault():
    with open(os.path.join(logdir, "fault-at"), "w") as f:
        f.write(repr(time.time()))


class Data(Dataset):
    """32 samples; on the faulting rank under FAULT=stalled_loader, the sample of train batch 4 never comes."""

    def __init__(self, stall_at=None):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(128, 4, generator=g), torch.randint(0, 2, (128,), generator=g)
        self.stall_at, self.calls = stall_at, 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        self.calls += 1
        if self.stall_at is not None and self.calls == self.stall_at:
            mark_fault()
            time.sleep(3600)
        return self.x[index], self.y[index]


class Fault(Callback):
    def on_experiment_start(self, runner):
        with open(os.path.join(logdir, f"started-{runner.engine.rank}"), "w") as f:
            f.write(str(os.getpid()))

    def on_batch_end(self, runner):
        if not (runner.is_train_loader and runner.epoch == 1 and runner.batch_step == AT_BATCH) or restarted:
            return
        if fault == "shape_mismatch":
            if runner.engine.rank == bad_rank:
                mark_fault()
            dist.all_reduce(torch.ones(3 if runner.engine.rank == bad_rank else 1))  # the mismatched all_reduce
        if fault == "sigkill_peers_wait" and runner.engine.rank != bad_rank:
            survivors = [r for r in range(runner.engine.world_size) if r != bad_rank]
            source = survivors[(survivors.index(runner.engine.rank) + 1) % len(survivors)]
            open(os.path.join(logdir, f"waiting-{runner.engine.rank}"), "w").close()
            dist.recv(torch.zeros(1), src=source)  # the recv of the survivors: nobody sends
        if runner.engine.rank != bad_rank:
            return
        if fault == "extra_collective":
            mark_fault()
            dist.all_reduce(torch.ones(1))  # the extra all_reduce
        elif fault == "extra_same_shape":
            mark_fault()
            dist.all_reduce(torch.ones(2))  # the extra all_reduce of the gradients' shape
        elif fault in ("sigkill", "sigkill_peers_wait"):
            others = [os.path.join(logdir, f"waiting-{r}") for r in range(runner.engine.world_size) if r != bad_rank]
            deadline = time.monotonic() + 60
            while fault == "sigkill_peers_wait" and not all(map(os.path.exists, others)) and time.monotonic() < deadline:
                time.sleep(0.01)  # every survivor in its recv (its backward done): none can notice the death
            mark_fault()
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "exit0":
            mark_fault()
            sys.exit(0)  # the rank leaves


# 4 samples per rank and batch: train batch 4 of epoch 1 on this rank starts at its 13th sample
train_data = Data(stall_at=AT_BATCH * 4 + 1 if fault == "stalled_loader" and rank == bad_rank else None)
model = torch.nn.Linear(4, 2)
model.weight.requires_grad_(fault != "extra_same_shape")
SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         loaders={"train": DataLoader(train_data, batch_size=4),
                                  "valid": DataLoader(Data(), batch_size=16)},
                         num_epochs=2, logdir=logdir, callbacks={"fault": Fault()}, distributed=True,
                         hang_timeout=float(os.environ.get("HANG_TIMEOUT", 30)))
print(f"rank {rank} finished")
