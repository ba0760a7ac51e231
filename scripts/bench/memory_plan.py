"""The memory plan (``torchstage plan``, ``plan_memory``) against the peak each rank of a real run reaches, per
strategy: DDP, FSDP, HSDP 2x2 and tensor parallel 2 x FSDP 2 on 4 processes.

    python scripts/bench/memory_plan.py [--width 1024] [--blocks 4] [--steps 4] [--strategies ddp fsdp hsdp tp]

The model is scripts/bench/parallelism.py's transformer (4 blocks of width 1024: 50.4M parameters) with AdamW, a batch
of 2 x 8 tokens per data-parallel rank. Each strategy trains in worlds of 4 fresh processes; each rank resets its
peak resident size (``VmHWM``) before building the model (on the meta device for the sharded strategies, on the CPU
for DDP) and reports the peak the run added (``VmHWM`` at the end minus ``VmRSS`` at the start), the largest over
the ranks. Three worlds per strategy: the model with glibc's default allocator settings, the model with a fixed
mmap threshold (``MALLOC_MMAP_THRESHOLD_=65536``: freed blocks go back to the system instead of raising the
threshold and staying in the heap), and the same run with a model of ~0.1M parameters (the runtime: libraries
loaded, the process group, the launcher's threads), which the plan does not count. The plan is made in this process
from a meta-device model, without a world; the ratio is the plan's peak over the fixed-threshold peak less the
runtime.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallelism import LABELS, Block, Net, _status, plan  # noqa: E402 (the same model and plan)

STRATEGIES = ("ddp", "fsdp", "hsdp", "tp")


def strategy_of(name: str):
    from torchstage import FSDP, ModelParallel
    return {"ddp": "ddp", "fsdp": FSDP(modules=Block), "hsdp": FSDP(modules=Block, replicate=2),
            "tp": ModelParallel(tensor=2, parallelize=plan, modules=Block)}[name]


def batch(args):
    return torch.randn(args.batch, args.seq, args.width), torch.randn(args.batch, 1)


def rank_run(args) -> None:
    """One rank of the measured run (started by train(distributed=True) re-running this script)."""
    from torchstage import Callback, SupervisedRunner
    with open("/proc/self/clear_refs", "w") as f:  # the peak resident size starts over (Linux)
        f.write("5")
    base = _status("VmRSS")
    torch.manual_seed(0)
    if args.strategy == "ddp":
        model = Net(args.width, args.blocks)
    else:
        with torch.device("meta"):
            model = Net(args.width, args.blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dp_size = 2 if args.strategy == "tp" else 4
    g = torch.Generator().manual_seed(1)
    n = args.steps * args.batch * dp_size
    x, y = torch.randn(n, args.seq, args.width, generator=g), torch.randn(n, 1, generator=g)

    class Peak(Callback):
        order = 10_001

        def on_experiment_end(self, runner):
            peaks = runner.engine.all_gather_object(_status("VmHWM") - base)
            if runner.engine.is_main:
                with open(args.out, "w") as f:
                    json.dump(peaks, f)

    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=optimizer,
                             loaders={"train": DataLoader(TensorDataset(x, y), batch_size=args.batch)},
                             valid_loader="train", callbacks=[Peak()], num_epochs=1, distributed=True, nprocs=4,
                             strategy=strategy_of(args.strategy), verbose=False)


def planned(args, name: str):
    from torchstage.strategies.memory_plan import plan_memory
    with torch.device("meta"):
        model = Net(args.width, args.blocks)
    x, y = batch(args)
    started = time.perf_counter()
    result = plan_memory(model if name != "ddp" else Net(args.width, args.blocks), strategy_of(name), 4,
                         optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), inputs=x, criterion=nn.MSELoss(),
                         targets=y, device="cpu")
    return result, time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)  # a rank of a measured run
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.strategy:
        return rank_run(args)
    rows = []
    for name in args.strategies:
        plan_result, seconds = planned(args, name)
        print(plan_result, flush=True)
        default = measure(args, name, {})
        fixed = measure(args, name, {"MALLOC_MMAP_THRESHOLD_": "65536"})
        floor = measure(args, name, {"MALLOC_MMAP_THRESHOLD_": "65536"}, width=64, blocks=1)
        rows.append((name, plan_result.ranks[0], default, fixed, floor, seconds))
    mib = 2 ** 20
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, torch {torch.__version__}, 4 gloo processes\n")
    print("| strategy | params | grads | optimizer | activations | buffers | planned peak | measured: default malloc "
          "| fixed mmap threshold | runtime | planned / (fixed - runtime) | plan time |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r, default, fixed, floor, seconds in rows:
        print(f"| {LABELS[name]} | {r.params / mib:.1f} | {r.grads / mib:.1f} | {r.optimizer / mib:.1f} | "
              f"{r.activations / mib:.1f} | {r.buffers / mib:.1f} | {r.peak / mib:.0f} MiB | {default / mib:.0f} MiB | "
              f"{fixed / mib:.0f} MiB | {floor / mib:.0f} MiB | {r.peak / (fixed - floor):.2f} | {seconds:.1f} s |")


def measure(args, name: str, env: dict, **sizes) -> int:
    """The largest peak a rank of a world of 4 fresh processes added (bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peaks.json")
        options = {k: sizes.get(k, getattr(args, k)) for k in ("width", "blocks", "seq", "batch", "steps")}
        command = [sys.executable, os.path.abspath(__file__), "--strategy", name, "--out", out,
                   *[f"--{k}={v}" for k, v in options.items()]]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
        with open(out) as f:
            return max(json.load(f))


if __name__ == "__main__":
    main()
