"""Bytes per rank of parameters, gradients and optimizer state, and step time: DDP against FSDP.

    python scripts/bench/fsdp_memory.py [--nprocs 2 4] [--width 1024] [--blocks 6] [--steps 8]

Trains a residual MLP of about 50M parameters (6 blocks of width 1024 by default) with AdamW through
``SupervisedRunner().train(distributed=True, strategy=...)`` on gloo/CPU (NCCL on GPUs), and reports
what each rank holds right before the optimizer step (the peak of the three) and the median time of a
training step after the first two. FSDP should hold about 1/N of each under N processes.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import FSDP, Callback, SupervisedRunner


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def build(width, blocks):
    torch.manual_seed(0)
    return nn.Sequential(*(Block(width) for _ in range(blocks)), nn.Linear(width, 1))


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


class Measure(Callback):
    """Rank 0's bytes right before the first optimizer step and after training, and the median step time after
    the first two, written to ``out`` as JSON; subclasses say what a strategy's ranks hold."""

    order = 500

    def __init__(self, out: str):
        self.out = out

    def on_experiment_start(self, runner):
        self.times, self.sizes, self.module = [], None, runner.unwrapped_model
        runner.optimizer.register_step_pre_hook(self.before_step)

    def before_step(self, optimizer, *_):
        if self.sizes is None:
            self.sizes = self.at_step(optimizer)

    def at_step(self, optimizer) -> dict:
        """Bytes of the parameters and gradients held when the optimizer steps."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params if p.grad is not None)}

    def optimizer_bytes(self, optimizer) -> int:
        return local_bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))

    def total_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def on_batch_start(self, runner):
        self.start = time.perf_counter()

    def on_batch_end(self, runner):
        if runner.is_train_loader:
            self.times.append(time.perf_counter() - self.start)

    def on_experiment_end(self, runner):
        result = {**self.sizes, "optimizer": self.optimizer_bytes(runner.optimizer),
                  "step_s": statistics.median(self.times[2:]), "total_params": self.total_params()}  # after warm-up
        if runner.engine.rank == 0:
            with open(self.out, "w") as f:
                json.dump(result, f)


def worker(args):
    """One run (inside each launched process): train a few steps, measure, write rank 0's numbers."""
    train(args, FSDP(modules=Block) if args.strategy == "fsdp" else "ddp", Measure(args.out))


def train(args, strategy, callback) -> None:
    """Train the benchmark's model for ``args.steps`` steps per rank under ``strategy``, measured by ``callback``."""
    model = build(args.width, args.blocks)
    samples = args.steps * args.batch * args.nprocs[0]  # ``steps`` training steps on every rank
    x, y = torch.randn(samples, args.width), torch.randn(samples, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch)
    valid = DataLoader(TensorDataset(x[: args.batch], y[: args.batch]), batch_size=args.batch)
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders={"train": loader, "valid": valid},
                             optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), callbacks=[callback],
                             num_epochs=1, distributed=True, nprocs=args.nprocs[0], strategy=strategy)


def main(run=worker, script=__file__, strategies=("ddp", "fsdp"), doc=__doc__,
         what="bytes held by rank 0 before the first optimizer step"):
    """Parse the arguments; in a launched worker ``run(args)``, else run ``script`` for each of ``strategies`` at
    each process count and print rank 0's bytes and step time against DDP's."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="samples per process and step")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.strategy:
        return run(args)
    rows = []
    for nprocs in args.nprocs:
        for strategy in strategies:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                command = [sys.executable, os.path.abspath(script), "--strategy", strategy, "--out", out,
                           "--nprocs", str(nprocs), "--width", str(args.width), "--blocks", str(args.blocks),
                           "--batch", str(args.batch), "--steps", str(args.steps)]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                with open(out) as f:
                    rows.append({"nprocs": nprocs, "strategy": strategy, **json.load(f)})
    mib = 2 ** 20
    print(f"model: {rows[0]['total_params'] / 1e6:.1f}M parameters, AdamW, batch {args.batch} per process; {what}")
    print(f"{'procs':>5} {'strategy':>8} {'params MiB':>11} {'grads MiB':>10} {'optim MiB':>10} {'step s':>8}"
          f" {'of DDP':>7}")
    for row in rows:
        ddp = next(r for r in rows if r["nprocs"] == row["nprocs"] and r["strategy"] == "ddp")
        share = (row["params"] + row["grads"] + row["optimizer"]) / (ddp["params"] + ddp["grads"] + ddp["optimizer"])
        print(f"{row['nprocs']:>5} {row['strategy']:>8} {row['params'] / mib:>11.1f} {row['grads'] / mib:>10.1f} "
              f"{row['optimizer'] / mib:>10.1f} {row['step_s']:>8.3f} {share:>7.2f}")


if __name__ == "__main__":
    main()
