"""A model larger than a rank may hold, trained under FSDP on NPROCS (4) processes each limited in memory, for the memory-limit
test.

Usage: python limited_run.py LOGDIR; environment: NPROCS (4), META (1: built on the meta device), WIDTH (896), BLOCKS (64),
BUDGET_MIB (the data memory each rank may add to what it holds once torch and torchstage are imported: its
RLIMIT_DATA, set before the model is built; 0: no limit). Each rank writes LOGDIR/rank<R>.json: the peak resident
memory it added (VmHWM less VmRSS before the model), the bytes of parameters, gradients and optimizer state it holds
at the first optimizer step, and the limit. The launching process holds no limit (it builds the model too, and starts
the ranks).
"""
import json
import os
import resource
import sys

import torch
import torch.distributed.checkpoint  # noqa: F401 (imported before the limit: what a run loads is not the model's)
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor  # noqa: F401
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import FSDP, Callback, SupervisedRunner

env = os.environ
WIDTH, BLOCKS = int(env.get("WIDTH", 896)), int(env.get("BLOCKS", 64))


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


def local_bytes(tensors) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


class Report(Callback):
    order = 10_001

    def __init__(self, logdir, base, limit):
        self.logdir, self.base, self.limit, self.held = logdir, base, limit, None

    def on_experiment_start(self, runner):
        runner.optimizer.register_step_post_hook(self.count)

    def count(self, optimizer, *_):
        if self.held is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
            self.held = {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params),
                         "optimizer": local_bytes(state)}

    def on_experiment_end(self, runner):
        with open(os.path.join(self.logdir, f"rank{runner.engine.rank}.json"), "w") as f:
            json.dump({"peak": status("VmHWM") - self.base, "limit": self.limit, **self.held}, f)


if __name__ == "__main__":
    logdir = sys.argv[1]
    os.makedirs(logdir, exist_ok=True)
    limit = None
    if env.get("RANK") is not None and int(env.get("BUDGET_MIB", 0)):  # a rank (not the launching process)
        resource.setrlimit(resource.RLIMIT_STACK, (2 ** 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))  # threads
        limit = status("VmData") + int(env["BUDGET_MIB"]) * 2 ** 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts over
    base = status("VmRSS")
    torch.manual_seed(0)
    if env.get("META", "1") == "1":
        with torch.device("meta"):
            model = Net()
    else:
        model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, WIDTH, generator=g), torch.randn(8, 1, generator=g)
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=optimizer,
                             loaders={"train": DataLoader(TensorDataset(x, y), batch_size=1)}, valid_loader="train",
                             callbacks=[Report(logdir, base, limit)], num_epochs=1, distributed=True, nprocs=int(env.get("NPROCS", 4)),
                             strategy=FSDP(modules=Block), seed=1)
