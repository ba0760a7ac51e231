"""Step time and memory per rank of a pipeline 2 x data 2 (``ModelParallel(pipeline=2, schedule="1F1B")``) against
the loop a user would write by hand with torch's own ``PipelineStage``, ``Schedule1F1B`` and ``fully_shard``.

    python scripts/bench/pipeline.py [--rounds 5] [--steps 8] [--width 512] [--blocks 8] [--control]

One world of 4 processes is started with ``torchrun --standalone``; in it, each round trains a fresh copy of a
transformer (``--blocks`` blocks of width ``--width`` and a head; stage 1 the first blocks, stage 2 the rest and the
head, each block an FSDP unit over the 2 data-parallel ranks of its stage) once through
``SupervisedRunner().train(strategy=...)`` and once through the hand-written loop, in alternating order, on the same
data (batch 4 x 8 tokens per data-parallel rank, 2 microbatches, AdamW). A round's figure is the mean time of a step
after the first two; the report gives the medians over rounds and their ratio. Memory, from the first round, on the
first rank of each stage: bytes held in parameters and gradients when the optimizer first steps and in optimizer
state after training (exact), and the peak resident memory the run added to the process (``VmHWM``), each
contender's from a world of fresh processes of its own. ``--control`` also runs the hand-written loop a second time
each round (an A/A pair, which should give 1.000): how far it lands from 1 is the noise of the figure.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallelism import Block, Probe  # noqa: E402 (the block and the measuring of scripts/bench/parallelism.py)


class Head(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, x):
        return self.proj(x).mean(1)


class Net(nn.Module):
    """Blocks then a head: the forward is its pieces in order, as a pipeline splits it."""

    def __init__(self, width, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = Head(width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def data(args, dp_rank):
    g = torch.Generator().manual_seed(1)
    n = args.steps * args.batch * 2
    x, y = torch.randn(n, args.seq, args.width, generator=g), torch.randn(n, 1, generator=g)
    part = slice(dp_rank * args.steps * args.batch, (dp_rank + 1) * args.steps * args.batch)
    return x[part], y[part]


def torchstage_run(args, device) -> dict:
    """The model trained by ``SupervisedRunner().train(strategy=ModelParallel(pipeline=2, ...))``."""
    from torchstage import Callback, ModelParallel, SupervisedRunner
    probe = Probe(device)

    class Measure(Callback):
        order = 10_001

        def on_experiment_start(self, runner):
            runner.optimizer.register_step_pre_hook(probe.first_step)

        def on_batch_end(self, runner):
            probe.step()

    torch.manual_seed(0)
    model = Net(args.width, args.blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    n = args.steps * args.batch * 2
    x, y = torch.randn(n, args.seq, args.width, generator=g), torch.randn(n, 1, generator=g)
    strategy = ModelParallel(pipeline=2, schedule="1F1B", n_microbatches=2, modules=Block)
    probe.start()
    runner = SupervisedRunner()  # the sampler deals without shuffling: the same samples per rank as the hand loop's
    runner.train(model=model, criterion=nn.MSELoss(), optimizer=optimizer, callbacks=[Measure()], num_epochs=1,
                 loaders={"train": DataLoader(TensorDataset(x, y), batch_size=args.batch)}, strategy=strategy,
                 valid_loader="train")
    return probe.finish(optimizer)


def hand_run(args, device) -> dict:
    """The same pipeline written by hand: the stage's modules, fully_shard, PipelineStage and Schedule1F1B."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    probe = Probe(device)
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("pipeline", "data"))
    pp_rank, dp_rank = mesh["pipeline"].get_local_rank(), mesh["data"].get_local_rank()
    torch.manual_seed(0)
    model = Net(args.width, args.blocks)
    pieces = list(model.blocks) + [model.head]
    cut = (len(pieces) + 1) // 2
    stage = nn.Sequential(*(pieces[:cut] if pp_rank == 0 else pieces[cut:])).to(device)
    for module in stage:
        if isinstance(module, Block):
            fully_shard(module, mesh=mesh["data"])
    fully_shard(stage, mesh=mesh["data"])
    optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-4)
    optimizer.register_step_pre_hook(probe.first_step)
    criterion = nn.MSELoss()
    schedule = Schedule1F1B(PipelineStage(stage, pp_rank, 2, device, group=mesh["pipeline"].get_group()),
                            n_microbatches=2, loss_fn=lambda out, target: criterion(out, target) / 2,
                            scale_grads=False)
    x, y = data(args, dp_rank)
    probe.start()
    stage.train()
    for inputs, targets in DataLoader(TensorDataset(x, y), batch_size=args.batch):
        if pp_rank == 0:
            schedule.step(inputs.to(device))
        else:
            schedule.step(target=targets.to(device), losses=[])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probe.step()
    return probe.finish(optimizer)


def worker(args) -> None:
    """Inside each process: alternate the contenders for ``args.rounds`` rounds; rank 0 writes every rank's."""
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    results = {"torchstage": [], "hand-written": [], "hand-written again": []}
    for round_ in range(args.rounds):
        order = (("torchstage", torchstage_run), ("hand-written", hand_run)) + \
            ((("hand-written again", hand_run),) if args.control else ())
        for name, run in order if round_ % 2 == 0 else reversed(order):
            if args.only and name != args.only:
                continue
            dist.barrier()
            results[name].append(run(args, device))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, results)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": every, "device": str(device),
                       "params": sum(p.numel() for p in Net(args.width, args.blocks).parameters())}, f)
    dist.barrier()
    dist.destroy_process_group()


def world(args, rounds: int, only: str = None) -> dict:
    """Run :func:`worker` in a fresh world of 4 processes under ``torchrun``; every rank's results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                   os.path.abspath(__file__), "--worker", "--out", out, "--rounds", str(rounds), "--steps",
                   str(args.steps), "--width", str(args.width), "--blocks", str(args.blocks), "--seq", str(args.seq),
                   "--batch", str(args.batch), *(["--only", only] if only else []),
                   *(["--control"] if args.control and not only else [])]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first two are not timed)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4, help="samples per data-parallel rank and step")
    parser.add_argument("--control", action="store_true", help="an A/A pair of the hand-written loop each round")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    timed = world(args, args.rounds)
    peaks = {name: world(args, 1, only=name)["ranks"] for name in ("torchstage", "hand-written")}
    ours, hand = timed["ranks"][0]["torchstage"], timed["ranks"][0]["hand-written"]
    a, b = statistics.median(r["step_s"] for r in ours), statistics.median(r["step_s"] for r in hand)
    ratios = sorted(o["step_s"] / h["step_s"] for o, h in zip(ours, hand))
    if args.control:
        again = timed["ranks"][0]["hand-written again"]
        control = sorted(c["step_s"] / h["step_s"] for c, h in zip(again, hand))
        print(f"control (hand-written again / hand-written): median {statistics.median(control):.3f}, rounds "
              f"{control[0]:.3f} to {control[-1]:.3f}")
    mib = 2 ** 20
    print(f"model: {timed['params'] / 1e6:.1f}M parameters, pipeline 2 x data 2 (1F1B, 2 microbatches), AdamW, 4 "
          f"processes on {timed['device']}, {args.rounds} rounds of {args.steps} steps")
    print(f"| step, torchstage | step, hand-written | ratio (medians) | paired (median of the rounds' ratios) | per "
          f"round |\n| --- | --- | --- | --- | --- |\n| {a:.3f} s | {b:.3f} s | **{a / b:.3f}** | "
          f"{statistics.median(ratios):.3f} | {ratios[0]:.3f} to {ratios[-1]:.3f} |")
    print("| rank (stage) | params | grads | optimizer state | peak added, torchstage | peak added, hand-written |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for rank, stage in ((0, 1), (2, 2)):
        first = timed["ranks"][rank]["torchstage"][0]
        print(f"| {rank} ({stage}) | {first['params'] / mib:.1f} MiB | {first['grads'] / mib:.1f} MiB | "
              f"{first['optimizer'] / mib:.1f} MiB | {peaks['torchstage'][rank]['torchstage'][0]['peak'] / mib:.0f} "
              f"MiB | {peaks['hand-written'][rank]['hand-written'][0]['peak'] / mib:.0f} MiB |")


if __name__ == "__main__":
    main()
