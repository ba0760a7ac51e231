"""A small transformer (embed, 4 blocks, pooling, head) trained under pipeline parallelism, alone or with data or
tensor parallelism, or under DDP as the reference, for the pipeline tests.

Usage: python pipeline_run.py LOGDIR [RESUME]. Environment as mesh_run.py's (NPROC, EPOCHS, BATCH, SAMPLES, SHUFFLE,
PERIOD, CLIP, KILL_AT_BATCH, KILL_RANK, ATTEMPT, FAIL_ONCE_AT_BATCH, MAX_RESTARTS, NAN_AT_BATCH, NAN_SAMPLE, ROLLBACK), and STRATEGY: ddp | pp (Pipeline over the world) | pp-dp
(pipeline 2 x data) | pp-tp (pipeline 2 x tensor 2); SCHEDULE (1F1B), MICRO (n_microbatches, 2), ACCUM (accumulation_steps, 1). Each rank records
what mesh_run.py's Report records.
"""
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mesh_run import (DIM, LENGTH, Block, Indexed, PoisonBatch, Report, SampleCount, env, logdir,  # noqa: E402
                      resume)

from torchstage import (Batch, Epoch, MetricCallback, ModelParallel, NonFiniteLossCallback, Pipeline,  # noqa: E402
                        SupervisedRunner)


class Pool(nn.Module):
    """The mean over the sequence: a piece of its own, so the model's forward is its pieces in order."""

    def forward(self, x):
        return x.mean(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.pool, self.head = Pool(), nn.Linear(DIM, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.pool(x))


def plan(part, tensor_mesh):
    """Each block of this rank's stages split Megatron-style (the blocks a rank holds are its part's)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    layout = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
              "up": ColwiseParallel(), "down": RowwiseParallel()}
    for module in part.modules():
        if isinstance(module, Block):
            parallelize_module(module, tensor_mesh, layout)
    return part


def strategy():
    kind, schedule, micro = env.get("STRATEGY", "pp-dp"), env.get("SCHEDULE", "1F1B"), int(env.get("MICRO", 2))
    if kind == "ddp":
        return "ddp"
    if kind == "pp":
        return Pipeline(int(env.get("PIPELINE", 2)), schedule=schedule, n_microbatches=micro, min_params=50)
    if kind == "pp-dp":
        return ModelParallel(pipeline=2, schedule=schedule, n_microbatches=micro, min_params=50)
    return ModelParallel(tensor=2, parallelize=plan, pipeline=2, schedule=schedule, n_microbatches=micro)


if __name__ == "__main__":
    os.makedirs(logdir, exist_ok=True)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(env.get("LR", 3e-3)), weight_decay=0.1,
                                  eps=float(env.get("EPS", 1e-6)))  # rounding noise of near-zero gradients: not amplified
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    g = torch.Generator().manual_seed(1)
    n = int(env.get("SAMPLES", 96))
    x, y = torch.randn(n + 16, LENGTH, 6, generator=g), torch.randn(n + 16, 1, generator=g)
    batch = int(env.get("BATCH", 4))
    loaders = {"train": DataLoader(Indexed(x[:n], y[:n]), batch_size=batch, shuffle=env.get("SHUFFLE", "1") == "1"),
               "valid": DataLoader(Indexed(x[n:], y[n:]), batch_size=batch)}
    period = int(env.get("PERIOD", 0))
    callbacks = {"report": Report(), "samples": MetricCallback(SampleCount())}
    if env.get("NAN_AT_BATCH") or env.get("NAN_SAMPLE"):
        callbacks["poison"] = PoisonBatch(int(env.get("NAN_AT_BATCH", 0)) or None,
                                          int(env["NAN_SAMPLE"]) if env.get("NAN_SAMPLE") else None)
    if env.get("ROLLBACK"):  # bad batches rolled back past, checked every ROLLBACK batches
        callbacks["nonfinite"] = NonFiniteLossCallback(mode="rollback", check_every=int(env["ROLLBACK"]))
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=optimizer, scheduler=scheduler,
                             loaders=loaders, callbacks=callbacks,
                             logdir=logdir, resume=resume, num_epochs=int(env.get("EPOCHS", 2)), seed=5,
                             distributed=True, nprocs=int(env.get("NPROC", 4)), strategy=strategy(),
                             checkpoint_period=(Batch(period), Epoch(1)) if period else Epoch(1),
                             grad_clip_norm=float(env["CLIP"]) if env.get("CLIP") else None,
                             accumulation_steps=int(env.get("ACCUM", 1)),
                             max_restarts=int(env["MAX_RESTARTS"]) if env.get("MAX_RESTARTS") else None,
                             verbose=bool(env.get("VERBOSE")), overwrite=resume is None)
