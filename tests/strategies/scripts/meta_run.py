"""A small transformer built on the meta device (or not) and trained under FSDP, HSDP, TP x FSDP or DDP, for the
meta-device tests.

Usage: python meta_run.py LOGDIR; the world comes from train(distributed=True, nprocs=NPROC).
Environment: STRATEGY (fsdp | hsdp | tp-dp | tp | ddp), NPROC (4), META (1: built under torch.device("meta")),
INIT_FROM (train(init_from=...)), RESUME ("last" or a checkpoint), TOPK (epoch checkpoints kept), EPOCHS (1), AC (1: activation_checkpointing=Block), INIT (normal: a custom
init_weights), SEED (3), PLAN (for tp: "miss" names no module at all, "typo" misspells one). Rank 0 writes LOGDIR/initial.pt (the full weights as training starts) and LOGDIR/losses.json
(each train batch's loss).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import FSDP, Callback, ModelParallel, SupervisedRunner

env = os.environ
DIM, HEADS, HIDDEN, LENGTH = 16, 4, 32, 5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.up, self.down = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, n, _ = x.shape
        h = self.norm(x)
        q, k, v = (f(h).view(b, n, -1, DIM // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))
        return x + self.down(self.drop(F.gelu(self.up(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean(1)


def plan(model, tensor_mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    layout = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
              "up": ColwiseParallel(), "down": RowwiseParallel()}
    if env.get("PLAN") == "miss":  # the names of another model: nothing matches
        layout = {"attention.wq": ColwiseParallel(), "attention.wo": RowwiseParallel()}
    elif env.get("PLAN") == "typo":
        layout["out"] = layout.pop("o")
    for block in model.blocks:
        parallelize_module(block, tensor_mesh, layout)
    return model


def small_normal(module):
    """A user init: every weight N(0, 0.02), every bias and norm shift 0, norm scales 1."""
    for name, tensor in module.named_parameters(recurse=False):
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(tensor) if name == "weight" else nn.init.zeros_(tensor)
        else:
            nn.init.normal_(tensor, std=0.02) if name == "weight" else nn.init.zeros_(tensor)


def full_state(model) -> dict:
    """The model's full weights (every rank takes part; rank 0 keeps them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class Record(Callback):
    order = 500

    def __init__(self, logdir):
        self.logdir, self.losses = logdir, []

    def on_experiment_start(self, runner):
        state = full_state(runner.model)
        if runner.engine.is_main:
            torch.save(state, os.path.join(self.logdir, "initial.pt"))

    def on_batch_end(self, runner):
        if runner.is_train_loader:
            self.losses.append(runner.batch_metrics["loss"].detach())

    def on_experiment_end(self, runner):
        if runner.engine.is_main:
            with open(os.path.join(self.logdir, "losses.json"), "w") as f:
                json.dump([float(v) for v in self.losses], f)


STRATEGIES = {"fsdp": lambda: FSDP(modules=Block), "hsdp": lambda: FSDP(modules=Block, replicate=2, shard=2),
              "tp-dp": lambda: ModelParallel(tensor=2, parallelize=plan, data_shard=2, modules=Block),
              "tp": lambda: ModelParallel(tensor=2, parallelize=plan, modules=Block), "ddp": lambda: "ddp"}


def data():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, LENGTH, 6, generator=g), torch.randn(64, 1, generator=g)
    return {"train": DataLoader(TensorDataset(x[:48], y[:48]), batch_size=4),
            "valid": DataLoader(TensorDataset(x[48:], y[48:]), batch_size=4)}


if __name__ == "__main__":
    logdir = sys.argv[1]
    os.makedirs(logdir, exist_ok=True)
    torch.manual_seed(0)
    if env.get("META", "1") == "1":
        with torch.device("meta"):
            model = Net()
    else:
        model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=optimizer, loaders=data(),
                             callbacks={"record": Record(logdir)}, logdir=logdir, num_epochs=int(env.get("EPOCHS", 1)),
                             seed=int(env.get("SEED", 3)), distributed=True, nprocs=int(env.get("NPROC", 4)),
                             strategy=STRATEGIES[env.get("STRATEGY", "fsdp")](), init_from=env.get("INIT_FROM"),
                             init_weights=small_normal if env.get("INIT") == "normal" else None,
                             activation_checkpointing=Block if env.get("AC") == "1" else None,
                             resume=env.get("RESUME"), overwrite=env.get("RESUME") != "last",
                             topk=int(env.get("TOPK", 0)))
