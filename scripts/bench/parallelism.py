"""Memory per rank and step time of DDP, FSDP, HSDP 2x2 and tensor parallel 2 x FSDP 2, each against the loop a user
would write by hand with torch's own ``DistributedDataParallel`` / ``fully_shard`` / ``parallelize_module``.

    python scripts/bench/parallelism.py [--rounds 5] [--steps 8] [--strategies ddp fsdp hsdp tp]

For each strategy one world of 4 processes is started with ``torchrun --standalone``; in it, each round trains a
fresh copy of a ~50M-parameter transformer (4 blocks of width 1024: attention and a 4x MLP) once through
``SupervisedRunner().train(strategy=...)`` and once through the hand-written loop, in alternating order, on the same
data (batch 2 x 8 tokens per data-parallel rank, AdamW). A round's figure is the mean time of a step after the first
two (data loading, forward, backward, optimizer step, every callback of the default chain); the report gives the
medians over rounds and their ratio. Memory, from the first round: bytes rank 0 holds in parameters and gradients
when the optimizer first steps and in optimizer state after training (exact, machine-independent), and the peak
resident memory the run added to the process (``VmHWM`` reset before the run; on a GPU, torch's peak allocation),
each contender's from a world of fresh processes of its own (memory another run freed and the allocator kept
would otherwise hide part of the peak of the run after it).
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
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_memory import local_bytes  # noqa: E402 (the bytes a rank holds of DTensors and tensors)

STRATEGIES = ("ddp", "fsdp", "hsdp", "tp")
LABELS = {"ddp": "DDP", "fsdp": "FSDP", "hsdp": "HSDP 2x2", "tp": "TP 2 x FSDP 2"}


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.head_dim = width // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    def __init__(self, width, heads=16):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Net(nn.Module):
    def __init__(self, width, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean(1)


def plan(model, tensor_mesh):
    """Megatron's layout: q, k, v and the MLP's first layer by columns, their outputs by rows."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    layout = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
              "attention.wo": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, tensor_mesh, layout)
    return model


# ---- measuring -------------------------------------------------------------------------------------------
class Probe:
    """Step times and memory of one run: call :meth:`start`, :meth:`step` after each step, :meth:`first_step` from
    the optimizer's pre-step hook, :meth:`finish` with the optimizer at the end."""

    def __init__(self, device, warmup=2):
        self.device, self.warmup, self.steps, self.sizes, self.t0 = device, warmup, 0, None, None
        self.mark = None

    def start(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            with open("/proc/self/clear_refs", "w") as f:  # the peak resident size starts over (Linux)
                f.write("5")
            self.base = _status("VmRSS")

    def step(self):
        self.steps += 1
        if self.steps == self.warmup:
            self.mark = self._now()

    def first_step(self, optimizer, *_):
        if self.sizes is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            self.sizes = {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params
                                                                               if p.grad is not None)}

    def finish(self, optimizer) -> dict:
        end = self._now()
        peak = (torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else _status("VmHWM"))
        state = local_bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
        return {**self.sizes, "optimizer": state, "peak": peak - self.base,
                "step_s": (end - self.mark) / (self.steps - self.warmup)}

    def _now(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def _status(field: str) -> int:
    """A size from /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


# ---- the two contenders ----------------------------------------------------------------------------------
def data(args, dp_size: int):
    g = torch.Generator().manual_seed(1)
    n = args.steps * args.batch * dp_size
    return torch.randn(n, args.seq, args.width, generator=g), torch.randn(n, 1, generator=g)


def torchstage_run(args, device) -> dict:
    """The model trained by ``SupervisedRunner().train(strategy=...)`` in the world already joined."""
    from torchstage import FSDP, Callback, ModelParallel, SupervisedRunner
    strategy = {"ddp": "ddp", "fsdp": FSDP(modules=Block), "hsdp": FSDP(modules=Block, replicate=2),
                "tp": ModelParallel(tensor=2, parallelize=plan, modules=Block)}[args.strategy]
    probe = Probe(device)

    class Measure(Callback):
        order = 10_001  # after every callback of the chain

        def on_experiment_start(self, runner):
            runner.optimizer.register_step_pre_hook(probe.first_step)

        def on_batch_end(self, runner):
            probe.step()

    torch.manual_seed(0)
    model = Net(args.width, args.blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dp_size = 2 if args.strategy == "tp" else 4
    x, y = data(args, dp_size)
    probe.start()
    runner = SupervisedRunner()
    runner.train(model=model, criterion=nn.MSELoss(), optimizer=optimizer,
                 loaders={"train": DataLoader(TensorDataset(x, y), batch_size=args.batch)}, callbacks=[Measure()],
                 num_epochs=1, strategy=strategy, valid_loader="train")
    return probe.finish(optimizer)


def hand_run(args, device) -> dict:
    """The same training written by hand with torch's own wrappers, as their tutorials do."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel
    probe = Probe(device)
    torch.manual_seed(0)
    model = Net(args.width, args.blocks).to(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    dp_rank, dp_size = rank, world
    if args.strategy == "ddp":
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    elif args.strategy in ("fsdp", "hsdp"):
        mesh = (init_device_mesh(device.type, (2, 2), mesh_dim_names=("replicate", "shard"))
                if args.strategy == "hsdp" else None)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
        plan(model, mesh["tp"])
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        dp_rank, dp_size = rank // 2, 2
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    optimizer.register_step_pre_hook(probe.first_step)
    x, y = data(args, dp_size)
    shard = slice(dp_rank * args.steps * args.batch, (dp_rank + 1) * args.steps * args.batch)
    loader = DataLoader(TensorDataset(x[shard], y[shard]), batch_size=args.batch)
    criterion = nn.MSELoss()
    probe.start()
    model.train()
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probe.step()
    return probe.finish(optimizer)


def worker(args) -> None:
    """Inside each process of the world: alternate the contenders for ``args.rounds`` rounds; rank 0 writes them."""
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    results = {"torchstage": [], "hand-written": []}
    for round_ in range(args.rounds):
        order = (("torchstage", torchstage_run), ("hand-written", hand_run))
        for name, run in order if round_ % 2 == 0 else reversed(order):
            if args.only and name != args.only:
                continue
            dist.barrier()
            results[name].append(run(args, device))
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"results": results, "params": sum(p.numel() for p in Net(args.width, args.blocks).parameters()),
                       "device": str(device)}, f)
    dist.barrier()
    dist.destroy_process_group()


def world(args, strategy: str, rounds: int, only: str = None) -> dict:
    """Run :func:`worker` in a fresh world of 4 processes under ``torchrun``; rank 0's results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                   os.path.abspath(__file__), "--strategy", strategy, "--out", out, "--rounds", str(rounds),
                   "--steps", str(args.steps), "--width", str(args.width), "--blocks", str(args.blocks),
                   "--seq", str(args.seq), "--batch", str(args.batch), *(["--only", only] if only else [])]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first two are not timed)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2, help="samples per data-parallel rank and step")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.strategy:
        return worker(args)
    rows = []
    for strategy in args.strategies:
        row = {"strategy": strategy, **world(args, strategy, args.rounds)}  # the step times, alternating
        for name in ("torchstage", "hand-written"):  # the peaks, each in processes of its own (a fresh allocator)
            row[f"peak {name}"] = world(args, strategy, 1, only=name)["results"][name][0]["peak"]
        rows.append(row)
    mib = 2 ** 20
    print(f"model: {rows[0]['params'] / 1e6:.1f}M parameters, AdamW, 4 processes on {rows[0]['device']}, "
          f"{args.rounds} rounds of {args.steps} steps (medians of the rounds' mean step after the first 2)")
    print("| strategy | params | grads | optimizer state | peak added | step (torchstage) | step (hand-written) | "
          "ratio | ratio range |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ours, hand = row["results"]["torchstage"], row["results"]["hand-written"]
        first = ours[0]
        a, b = statistics.median(r["step_s"] for r in ours), statistics.median(r["step_s"] for r in hand)
        ratios = sorted(o["step_s"] / h["step_s"] for o, h in zip(ours, hand))
        print(f"| {LABELS[row['strategy']]} | {first['params'] / mib:.1f} MiB | {first['grads'] / mib:.1f} MiB | "
              f"{first['optimizer'] / mib:.1f} MiB | {row['peak torchstage'] / mib:.0f} MiB "
              f"(hand: {row['peak hand-written'] / mib:.0f}) | {a:.3f} s | {b:.3f} s | **{a / b:.3f}** | "
              f"{ratios[0]:.3f} to {ratios[-1]:.3f} |")


if __name__ == "__main__":
    main()
