"""A training script that records what each rank saw, for the distributed tests.

Usage: python probe.py LOGDIR; settings from env: PROBE_SAMPLES (1001), PROBE_EPOCHS (3), PROBE_ACC (2),
PROBE_FAIL="rank:epoch" (raise there, time in LOGDIR/failed-at), PROBE_SLEEP (seconds per batch), PROBE_SAMPLER ("weighted").
Each rank writes LOGDIR/report-rank<R>.json and LOGDIR/pids/<pid> at start.
"""
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

from torchstage import Callback, CallbackOrder, OptimizerCallback, SupervisedRunner

logdir = sys.argv[1]
samples = int(os.environ.get("PROBE_SAMPLES", 1001))
epochs = int(os.environ.get("PROBE_EPOCHS", 3))
fail = tuple(int(x) for x in os.environ["PROBE_FAIL"].split(":")) if os.environ.get("PROBE_FAIL") else None
sleep = float(os.environ.get("PROBE_SLEEP", 0))


class Points(Dataset):
    """Fixed random points in 10-d with 3 classes; each item carries its index."""

    def __init__(self, n):
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 10, generator=generator)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "targets": self.y[i], "index": i}


class Probe(Callback):
    """Accuracy as a batch metric; records indices read, lr, metrics, gradient syncs and final weights."""

    order = CallbackOrder.Metric + 1
    produces = ("accuracy",)

    def on_experiment_start(self, runner):
        os.makedirs(os.path.join(logdir, "pids"), exist_ok=True)
        open(os.path.join(logdir, "pids", str(os.getpid())), "w").close()
        self.syncs, self.history, self.indices = [0], [], {}
        if hasattr(runner.model, "register_comm_hook"):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counting(state, bucket):
                state[0] += bucket.index() == 0  # one sync per backward, whatever the bucket count
                return allreduce_hook(None, bucket)
            runner.model.register_comm_hook(self.syncs, counting)
        self.wrapped = type(runner.model).__name__

    def on_epoch_start(self, runner):
        if fail and runner.engine.rank == fail[0] and runner.epoch == fail[1]:
            with open(os.path.join(logdir, "failed-at"), "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError(f"probe failure on rank {runner.engine.rank} at epoch {runner.epoch}")

    def on_batch_end(self, runner):
        logits, targets = runner.batch["logits"], runner.batch["targets"]
        runner.batch_metrics["accuracy"] = (logits.argmax(dim=1) == targets).float().mean()
        self.indices.setdefault(f"{runner.epoch}/{runner.loader_key}", []).extend(runner.batch["index"].tolist())
        if sleep:
            time.sleep(sleep)

    def on_epoch_end(self, runner):
        self.history.append({"metrics": {k: dict(v) for k, v in runner.epoch_metrics.items()},
                             "lr": runner.optimizer.param_groups[0]["lr"]})

    def on_experiment_end(self, runner):
        best = runner.callbacks["checkpoint"].best
        report = {"rank": runner.engine.rank, "world_size": runner.engine.world_size, "history": self.history,
                  "indices": self.indices, "syncs": self.syncs[0], "wrapped": self.wrapped,
                  "best_epoch": best["epoch"] if best else None,
                  "weights": [float(p.detach().double().sum()) for p in runner.unwrapped_model.parameters()]}
        with open(os.path.join(logdir, f"report-rank{runner.engine.rank}.json"), "w") as f:
            json.dump(report, f)


torch.manual_seed(0)
data = Points(samples)
if os.environ.get("PROBE_SAMPLER") == "weighted":
    weights = torch.linspace(0.1, 1.0, samples)
    train = DataLoader(data, batch_size=32, sampler=WeightedRandomSampler(weights, samples))
else:
    train = DataLoader(data, batch_size=32, shuffle=True)
valid = DataLoader(data, batch_size=50)
model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.CrossEntropyLoss(), optimizer=optimizer,
             scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0),
             loaders={"valid": valid, "train": train}, num_epochs=epochs, logdir=logdir,
             callbacks={"probe": Probe(), "optimizer": OptimizerCallback(accumulation_steps=int(os.environ.get("PROBE_ACC", 2)))},
             valid_metric="accuracy", minimize_valid_metric=False, distributed=True)
print(f"plain model after training: {type(runner.model).__name__}")
