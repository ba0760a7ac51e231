"""Bytes per rank of parameters, gradients and optimizer state, and step time: DDP against DeepSpeed ZeRO 1, 2, 3.

    python scripts/bench/deepspeed_memory.py [--nprocs 2 4] [--width 1024] [--blocks 6] [--steps 6]

The model, data and optimizer of ``fsdp_memory.py`` (a residual MLP of about 50M parameters, AdamW, fp32),
trained through ``SupervisedRunner().train(distributed=True, strategy=...)`` on gloo/CPU. Right before the
first optimizer step it counts what rank 0 holds: the model's parameters (a ZeRO-3 parameter's own shard),
and every gradient (the model's and the ZeRO partitions'); after training, the optimizer state: AdamW's
moments and, under DeepSpeed, its fp32 master copy of the rank's partition. DDP is measured in the same run.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_memory import build  # noqa: E402

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def nbytes(tensors) -> int:
    """Bytes of the tensors' own storage, each counted once (a ZeRO-3 parameter: its shard ``ds_tensor``)."""
    seen, total = set(), 0
    for t in tensors:
        t = getattr(t, "ds_tensor", t)
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def worker(args):
    """One run (inside each launched process): train a few steps, measure, write rank 0's numbers."""
    from torchstage import Callback, DeepSpeed, SupervisedRunner

    class Measure(Callback):
        order = 500

        def on_experiment_start(self, runner):
            self.times, self.sizes = [], None
            self.module = runner.unwrapped_model
            runner.optimizer.register_step_pre_hook(self.before_step)

        def before_step(self, optimizer, *_):
            if self.sizes is None:
                own = [p for g in optimizer.param_groups for p in g["params"]]  # DeepSpeed: its fp32 partitions
                module = list(self.module.parameters())
                self.master = 0 if args.strategy == "ddp" else nbytes(own)
                self.sizes = {"params": nbytes(module), "grads": nbytes(
                    p.grad for p in module + own if p.grad is not None)}

        def on_batch_start(self, runner):
            self.start = time.perf_counter()

        def on_batch_end(self, runner):
            if runner.is_train_loader:
                self.times.append(time.perf_counter() - self.start)

        def on_experiment_end(self, runner):
            state = [v for s in runner.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
            result = {**self.sizes, "optimizer": nbytes(state) + self.master,
                      "step_s": statistics.median(self.times[2:]),  # after warm-up
                      "total_params": sum(getattr(p, "ds_numel", p.numel()) for p in self.module.parameters())}
            if runner.engine.rank == 0:
                with open(args.out, "w") as f:
                    json.dump(result, f)

    model = build(args.width, args.blocks)
    samples = args.steps * args.batch * args.nprocs[0]  # ``steps`` training steps on every rank
    x, y = torch.randn(samples, args.width), torch.randn(samples, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch)
    valid = DataLoader(TensorDataset(x[: args.batch], y[: args.batch]), batch_size=args.batch)
    strategy = "ddp" if args.strategy == "ddp" else DeepSpeed(stage=int(args.strategy[-1]))
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders={"train": loader, "valid": valid},
                             optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), callbacks=[Measure()],
                             num_epochs=1, distributed=True, nprocs=args.nprocs[0], strategy=strategy)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="samples per process and step")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.strategy:
        return worker(args)
    rows = []
    for nprocs in args.nprocs:
        for strategy in STRATEGIES:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                command = [sys.executable, os.path.abspath(__file__), "--strategy", strategy, "--out", out,
                           "--nprocs", str(nprocs), "--width", str(args.width), "--blocks", str(args.blocks),
                           "--batch", str(args.batch), "--steps", str(args.steps)]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                with open(out) as f:
                    rows.append({"nprocs": nprocs, "strategy": strategy, **json.load(f)})
    mib = 2 ** 20
    print(f"model: {rows[0]['total_params'] / 1e6:.1f}M parameters, AdamW, fp32, batch {args.batch} per process; "
          f"bytes held by rank 0 (optimizer state: moments, and DeepSpeed's fp32 master partition)")
    print(f"{'procs':>5} {'strategy':>8} {'params MiB':>11} {'grads MiB':>10} {'optim MiB':>10} {'step s':>8}"
          f" {'of DDP':>7}")
    for row in rows:
        ddp = next(r for r in rows if r["nprocs"] == row["nprocs"] and r["strategy"] == "ddp")
        share = (row["params"] + row["grads"] + row["optimizer"]) / (ddp["params"] + ddp["grads"] + ddp["optimizer"])
        print(f"{row['nprocs']:>5} {row['strategy']:>8} {row['params'] / mib:>11.1f} {row['grads'] / mib:>10.1f} "
              f"{row['optimizer'] / mib:>10.1f} {row['step_s']:>8.3f} {share:>7.2f}")


if __name__ == "__main__":
    main()
