"""A small transformer block trained under DDP, FSDP, HSDP or tensor parallel + FSDP, for the mesh tests.

Usage: python mesh_run.py LOGDIR [RESUME]; the world comes from train(distributed=True, nprocs=NPROC).
Environment: STRATEGY (ddp | fsdp | hsdp | hsdp-name | hsdp-half | tp | tp-dp | tp-hsdp), NPROC (4; 0: as
launched), EPOCHS (2), BATCH (per process, 4), SAMPLES (96), SHUFFLE (1), PERIOD (batches between checkpoints, 0:
epochs only), CLIP (grad_clip_norm), KILL_AT_BATCH=n and KILL_RANK=r (SIGKILL rank r after global train batch n,
once every rank's saves landed), FAIL_ONCE_AT_BATCH=n (SIGKILL of rank KILL_RANK after batch n in the first attempt
only, for restarts), MAX_RESTARTS, MONITOR=1, NAN_AT_BATCH=n (the loss of batch n is NaN), NAN_SAMPLE=i (that of each batch holding
sample i), ROLLBACK=k (NonFiniteLossCallback(mode="rollback", check_every=k)), HANG_AT_BATCH=n (rank
KILL_RANK sleeps there) with HANG_TIMEOUT. Loader metric ``samples`` counts the samples of each loader over the world.
Each rank appends to LOGDIR/seen-rank<R>.jsonl the sample indices of every train batch (global batch step, epoch,
attempt: ATTEMPT plus the restart count, whether the rank counts its samples, indices) and writes
LOGDIR/report-rank<R>.json at the end (weights, metrics per epoch, its place in the mesh).
"""
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchstage import (FSDP, HSDP, Batch, Callback, Epoch, MetricCallback, ModelParallel, NonFiniteLossCallback,
                        SupervisedRunner)
from torchstage.metrics import AdditiveStateMetric

env = os.environ
logdir, resume = (sys.argv[1:] + [None, None])[:2]  # LOGDIR [RESUME]; importable for Net (no arguments then)
DIM, HEADS, HIDDEN, LENGTH = 16, 4, 32, 5


class Block(nn.Module):
    """Pre-norm attention and MLP; heads counted from the projections' width, so a tensor-parallel rank runs its own
    heads."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        # no bias on the keys: softmax ignores it, so its gradient is rounding noise that AdamW would amplify
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=name != "k") for name in "qkvo")
        self.up, self.down = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        b, n, _ = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, n, -1, DIM // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(6, DIM), Block(), nn.Linear(DIM, 1)

    def forward(self, x):
        return self.head(self.block(self.embed(x)).mean(1))


def plan(model, tensor_mesh):
    """Attention projections and the MLP split column-wise, their outputs row-wise (Megatron's layout)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    layout = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
              "up": ColwiseParallel(), "down": RowwiseParallel()}
    parallelize_module(model.block, tensor_mesh, layout)
    return model


class Indexed(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "targets": self.y[i], "index": i}


class SampleCount(AdditiveStateMetric):
    """How many samples a loader had over the world (each once, whatever the mesh)."""

    _state_size = 1

    def _update(self, outputs, targets):
        self._add(torch.ones(1, device=outputs.device) * outputs.shape[0])

    def _names(self):
        return ("samples",)

    def _compute(self):
        return {"samples": self._checked_state()[0]}


class Report(Callback):
    """Records the samples each rank trains, and what the tests compare at the end."""

    order = 500

    def __init__(self):
        self.rank = int(env.get("RANK", 0))
        self.kill_at, self.kill_rank = int(env.get("KILL_AT_BATCH", 0)), int(env.get("KILL_RANK", -1))
        self.fail_at, self.hang_at = int(env.get("FAIL_ONCE_AT_BATCH", 0)), int(env.get("HANG_AT_BATCH", 0))
        self.history, self.seen = [], None

    def on_experiment_start(self, runner):
        self.seen = open(os.path.join(logdir, f"seen-rank{runner.engine.rank}.jsonl"), "a")

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        self.seen.write(json.dumps({"step": runner.global_batch_step, "epoch": runner.global_epoch_step,
                                    "attempt": int(env.get("ATTEMPT", 0)) + int(env.get("TORCHSTAGE_RESTART_COUNT", 0)),
                                    "counts": runner.engine.counts_samples,
                                    "indices": runner.batch["index"].tolist()}) + "\n")
        self.seen.flush()
        if runner.global_batch_step == self.kill_at:
            runner.file_writer.wait()  # a kill between checkpoints: every rank's async save has landed
            runner.engine.barrier()
            if self.rank == self.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
        if runner.global_batch_step == self.hang_at and self.rank == self.kill_rank:
            time.sleep(3600)
        if runner.global_batch_step == self.fail_at and self.rank == self.kill_rank \
                and env.get("TORCHSTAGE_RESTART_COUNT", "0") == "0":
            runner.file_writer.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, runner):
        self.history.append({"epoch": runner.global_epoch_step, "lrs": [g["lr"] for g in runner.optimizer.param_groups],
                             "metrics": {k: dict(v) for k, v in runner.epoch_metrics.items()}})

    def on_experiment_end(self, runner):
        from torch.distributed.tensor import DTensor
        weights = {k: (v.full_tensor() if isinstance(v, DTensor) else v).double().sum().item()
                   for k, v in runner.unwrapped_model.state_dict().items()}
        engine = runner.engine
        report = {"rank": self.rank, "world_size": engine.world_size, "dp_rank": engine.dp_rank,
                  "dp_size": engine.dp_size, "tp_rank": engine.tp_rank, "tp_size": engine.tp_size,
                  "history": self.history, "weights": weights, "strategy": repr(engine.strategy),
                  "param_type": type(next(runner.model.parameters())).__name__,
                  "node": env.get("SLURMD_NODENAME"), "shard_group": _group(engine.strategy, "shard"),
                  "replicate_group": _group(engine.strategy, "replicate")}
        with open(os.path.join(logdir, f"report-rank{engine.rank}.json"), "w") as f:
            json.dump(report, f)
        self.seen.close()


def _group(strategy, dim):
    """The global ranks of this rank's group along mesh dimension ``dim`` (None without a mesh)."""
    mesh = getattr(strategy, "mesh", None)
    return None if mesh is None else sorted(int(r) for r in mesh[dim].mesh.flatten().tolist())


class PoisonBatch(Callback):
    """Makes the loss of one train batch NaN, as a bad sample would: the batch of global step ``at``, or each batch
    holding sample ``sample``."""

    order = 21  # after the criterion (20), before the non-finite check (25) and the backward (50)

    def __init__(self, at=None, sample=None):
        self.at, self.sample = at, sample

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        if runner.global_batch_step == self.at or self.sample in runner.batch["index"].tolist():
            runner.batch_metrics["loss"] = runner.batch_metrics["loss"] * float("nan")


STRATEGIES = {"ddp": lambda: "ddp", "fsdp": lambda: FSDP(min_params=50),
              "hsdp": lambda: FSDP(min_params=50, replicate=2, shard=2), "hsdp-name": lambda: "hsdp",
              "hsdp-default": lambda: HSDP(min_params=50), "hsdp-half": lambda: HSDP(min_params=50, replicate=2),
              "tp": lambda: ModelParallel(tensor=2, parallelize=plan, min_params=50),
              "tp-dp": lambda: ModelParallel(tensor=2, parallelize=plan, data_shard=2, min_params=50),
              "tp-hsdp": lambda: ModelParallel(tensor=2, parallelize=plan, data_replicate=2, min_params=50)}

if __name__ == "__main__":
    os.makedirs(logdir, exist_ok=True)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(env.get("LR", 3e-3)), weight_decay=0.1)
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
                             loaders=loaders, callbacks=callbacks, logdir=logdir, resume=resume,
                             num_epochs=int(env.get("EPOCHS", 2)), seed=5, distributed=True,
                             nprocs=int(env.get("NPROC", 4)) or None,  # 0: the launcher's world (srun)
                             strategy=STRATEGIES[env.get("STRATEGY", "hsdp")](),
                             checkpoint_period=(Batch(period), Epoch(1)) if period else Epoch(1),
                             grad_clip_norm=float(env["CLIP"]) if env.get("CLIP") else None,
                             monitor=bool(env.get("MONITOR")), verbose=bool(env.get("VERBOSE")),
                             max_restarts=int(env["MAX_RESTARTS"]) if env.get("MAX_RESTARTS") else None,
                             hang_timeout=float(env.get("HANG_TIMEOUT", 300)),
                             overwrite=resume is None)
