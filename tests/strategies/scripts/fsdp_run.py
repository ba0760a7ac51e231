"""A shuffled run with two parameter groups and a scheduler, under FSDP, DeepSpeed or DDP, for their tests.

Usage: python fsdp_run.py LOGDIR [RESUME]; the world comes from train(distributed=True, nprocs=NPROC).
Environment: STRATEGY (fsdp | ddp | fsdp-units | deepspeed1 | deepspeed2 | deepspeed3), NPROC (2), EPOCHS (3), PERIOD (batches between
checkpoints, 0: epochs only), CLIP (grad_clip_norm), ACC (accumulation_steps), AMP, KILL_AT_BATCH=n and
KILL_RANK=r (SIGKILL rank r after global train batch n, once every rank's saves landed), KILL_IN_SAVE=n
(SIGKILL the main rank when it switches the n-th checkpoint name, after every shard was written),
KILL_IN_FSYNC=n (SIGKILL rank KILL_RANK in its n-th fsync, while it writes its shards of a checkpoint), BARE=1
(plain SGD, whose state stays empty, and no scheduler).
Each rank writes LOGDIR/report-rank<R>.json.
"""
import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import FSDP, Batch, Callback, DeepSpeed, Epoch, SupervisedRunner

env = os.environ
logdir, resume = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
strategy = {"fsdp": "fsdp", "ddp": "ddp", "fsdp-units": FSDP(min_params=50), "deepspeed1": DeepSpeed(stage=1),
            "deepspeed2": DeepSpeed(stage=2), "deepspeed3": DeepSpeed(stage=3)}[env.get("STRATEGY", "fsdp")]
period = int(env.get("PERIOD", 0))


class Report(Callback):
    """Records what the tests check: the optimizer stepping the model's own parameters, lrs, metrics, weights."""

    order = 500

    def __init__(self):
        self.rank = int(env.get("RANK", 0))
        self.kill_at, self.kill_rank = int(env.get("KILL_AT_BATCH", 0)), int(env.get("KILL_RANK", -1))
        self.history = []

    def on_experiment_start(self, runner):
        model_params = {id(p) for p in runner.model.parameters()}
        self.same_optimizer = runner.optimizer is OPTIMIZER
        self.bound = all(id(p) in model_params for g in runner.optimizer.param_groups for p in g["params"])
        self.param_type = type(next(runner.model.parameters())).__name__

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.kill_at:
            runner.file_writer.wait()  # a kill between checkpoints: every rank's async save has landed
            runner.engine.barrier()
            if self.rank == self.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, runner):
        self.history.append({"epoch": runner.global_epoch_step, "lrs": [g["lr"] for g in runner.optimizer.param_groups],
                             "metrics": {k: dict(v) for k, v in runner.epoch_metrics.items()}})

    def on_experiment_end(self, runner):
        from torch.distributed.tensor import DTensor
        weights = {k: (v.full_tensor() if isinstance(v, DTensor) else v).double().sum().item()
                   for k, v in runner.unwrapped_model.state_dict().items()}
        report = {"rank": self.rank, "world_size": runner.engine.world_size, "same_optimizer": self.same_optimizer,
                  "bound": self.bound, "param_type": self.param_type, "history": self.history, "weights": weights,
                  "strategy": repr(runner.engine.strategy)}
        with open(os.path.join(logdir, f"report-rank{runner.engine.rank}.json"), "w") as f:
            json.dump(report, f)


def _kill_in_save(n):
    """SIGKILL the process inside the n-th os.replace of a checkpoint link (all shards already written)."""
    real, count = os.replace, [0]

    def replace(src, dst, *args, **kwargs):
        if str(src).endswith(".link"):
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst, *args, **kwargs)
    os.replace = replace


def _kill_in_fsync(n):
    """SIGKILL the process in its n-th os.fsync: while its shards of a checkpoint are being written."""
    real, count = os.fsync, [0]

    def fsync(fd):
        count[0] += 1
        if count[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(fd)
    os.fsync = fsync


if env.get("KILL_IN_SAVE") and env.get("RANK", "0") == "0" and env.get("TORCHSTAGE_LAUNCHED"):
    _kill_in_save(int(env["KILL_IN_SAVE"]))
if env.get("KILL_IN_FSYNC") and env.get("RANK") == env.get("KILL_RANK") and env.get("TORCHSTAGE_LAUNCHED"):
    _kill_in_fsync(int(env["KILL_IN_FSYNC"]))

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
GROUPS = [{"params": model[0].parameters(), "lr": 0.02},
          {"params": list(model[3].parameters()) + list(model[5].parameters()), "lr": 0.005, "weight_decay": 0.0}]
# BARE=1: plain SGD (its state stays empty) and no scheduler, what a run may hold that checkpoints drop easily
OPTIMIZER = torch.optim.SGD(GROUPS, lr=0.01) if env.get("BARE") else torch.optim.AdamW(GROUPS, weight_decay=0.1)
scheduler = None if env.get("BARE") else torch.optim.lr_scheduler.StepLR(OPTIMIZER, step_size=1, gamma=0.5)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(96, 6, generator=g), torch.randn(96, 1, generator=g)
loaders = {"valid": DataLoader(TensorDataset(x[80:], y[80:]), batch_size=4),
           "train": DataLoader(TensorDataset(x[:80], y[:80]), batch_size=4, shuffle=True)}
SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=OPTIMIZER, scheduler=scheduler,
                         loaders=loaders, callbacks=[Report()], logdir=logdir, resume=resume,
                         num_epochs=int(env.get("EPOCHS", 3)), seed=5, distributed=True,
                         nprocs=int(env.get("NPROC", 2)), strategy=strategy,
                         checkpoint_period=(Batch(period), Epoch(1)) if period else Epoch(1),
                         grad_clip_norm=float(env["CLIP"]) if env.get("CLIP") else None,
                         accumulation_steps=int(env.get("ACC", 1)), amp=env.get("AMP") or None,
                         overwrite=resume is None)
