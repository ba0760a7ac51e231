"""Training from a torchdata StatefulDataLoader (2 workers) that records the sample ids of every batch per rank.

Usage: python stateful_loader_run.py LOGDIR KIND [resume]; KIND is "iterable" (a sharded stream with its own
state: position and a shuffle seed drawn when a pass starts) or "map" (a shuffled map-style dataset).
KILL_AT_BATCH=n SIGKILLs every rank after global train batch n, once the checkpoints handed to the file
writer landed (a kill between checkpoints, not inside a write); last.pth is written every 5 train batches.
TORCHSTAGE_NPROC=2 runs 2 gloo processes. Each rank appends "epoch batch id,id,..." lines to
LOGDIR/ids-rank<R>-<first|resumed>.txt.
"""
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from torchstage import Batch, Callback, Epoch, SupervisedRunner

N = 96
X = torch.randn(N, 4, generator=torch.Generator().manual_seed(0))
Y = X.sum(1, keepdim=True)


class Stream(IterableDataset):
    """This rank's and worker's ids in an order drawn at the start of each pass; resumable mid-pass."""

    def __init__(self):
        self.pos, self.seed, self.loaded = 0, None, False

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        if not self.loaded:  # a new pass: a new order, from the worker's seeded RNG
            self.pos, self.seed = 0, int(torch.randint(0, 2**31, ()))
        self.loaded = False
        ids = list(range(rank * workers + worker, N, world * workers))
        order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(self.seed)).tolist()
        while self.pos < len(ids):
            i = ids[order[self.pos]]
            self.pos += 1
            yield {"features": X[i], "targets": Y[i], "id": i}

    def state_dict(self):
        return {"pos": self.pos, "seed": self.seed}

    def load_state_dict(self, state):
        self.pos, self.seed, self.loaded = state["pos"], state["seed"], True


class Points(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"features": X[i], "targets": Y[i], "id": i}


class Record(Callback):
    order = 500

    def __init__(self, logdir, resumed):
        self.logdir, self.suffix = logdir, "resumed" if resumed else "first"
        self.kill_at = int(os.environ.get("KILL_AT_BATCH", 0))

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        path = os.path.join(self.logdir, f"ids-rank{runner.engine.rank}-{self.suffix}.txt")
        with open(path, "a") as f:
            f.write(f"{runner.epoch} {runner.batch_step} {','.join(map(str, runner.batch['id'].tolist()))}\n")
        if runner.global_batch_step == self.kill_at:
            runner.file_writer.wait()  # the checkpoints handed over have landed: a kill between writes
            os.kill(os.getpid(), signal.SIGKILL)


def main(logdir, kind, resume=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    if kind == "iterable":
        train = StatefulDataLoader(Stream(), batch_size=4, num_workers=2)
    else:
        train = StatefulDataLoader(Points(), batch_size=4, shuffle=True, num_workers=2)
    valid = StatefulDataLoader(Points(), batch_size=8)
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders={"train": train, "valid": valid},
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.01), num_epochs=2,
                             callbacks=[Record(logdir, resume is not None)], logdir=logdir, resume=resume, seed=3,
                             checkpoint_period=(Batch(5), Epoch(1)), distributed=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
