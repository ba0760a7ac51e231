"""GPU figures against a hand-written loop in the same process: ResNet throughput (bf16, channels_last),
per-step overhead, time to first batch and peak GPU memory. Prints a Markdown report.

Alternating runs after a warm-up round, medians over repeats. Needs a CUDA GPU.
Usage: python scripts/bench/gpu.py [--repeats 5] [--batches 50] [--batch-size 256] [--out report.md]
"""
import argparse
import logging
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet  # noqa: E402
import step_overhead  # noqa: E402

from torchstage import Callback, SupervisedRunner  # noqa: E402


def hand_written_with_item(args, loader):
    """The loop most users write: the hand-written loop plus ``loss.item()`` every step for logging."""
    resnet.hand_written(args, loader, log_item=True)


def alternate(contenders: dict, repeats: int, *args) -> dict:
    times = {name: [] for name in contenders}
    for repeat in range(repeats + 1):
        for name, fn in contenders.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn(*args)
            torch.cuda.synchronize()
            if repeat:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def throughput(args) -> list:
    n = args.batch_size * args.batches
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=args.batch_size, pin_memory=True, num_workers=2, persistent_workers=True)
    rn = SimpleNamespace(device="cuda", amp="bf16", channels_last=True, width=args.width)
    med = alternate({"hand-written": resnet.hand_written, "hand-written + loss.item() per step": hand_written_with_item,
                     "torchstage": resnet.with_torchstage}, args.repeats, rn, loader)
    base = med["hand-written"]
    rows = [f"| {name} | {n / t:,.0f} samples/s | {base / t:.3f} |" for name, t in med.items()]
    return ["### ResNet (width %d), bf16 autocast, channels_last, batch %d, %d batches" % (
        args.width, args.batch_size, args.batches), "", "| contender | throughput | ratio to hand-written |",
        "| --- | --- | --- |", *rows, ""]


def step_cost(args) -> list:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(32, 10, generator=g).cuda(), torch.rand(32, 1, generator=g).cuda())
               for _ in range(args.steps)]
    med = alternate({"hand-written": step_overhead.hand_written, "torchstage": step_overhead.torchstage_run},
                    args.repeats, batches)
    per = {name: 1e6 * t / args.steps for name, t in med.items()}
    return ["### Per-step cost on the GPU (Linear(10, 1), batches already on the device, %d steps)" % args.steps, "",
            "| hand-written | torchstage | torchstage adds |", "| --- | --- | --- |",
            f"| {per['hand-written']:.1f} us/step | {per['torchstage']:.1f} us/step | "
            f"{per['torchstage'] - per['hand-written']:.1f} us/step |", ""]


class FirstBatch(Callback):
    def __init__(self):
        self.end = None

    def on_batch_end(self, runner):
        if self.end is None:
            torch.cuda.synchronize()
            self.end = time.perf_counter()


def first_batch_and_memory(args) -> list:
    rn = SimpleNamespace(device="cuda", amp="bf16", channels_last=True, width=args.width)
    n = args.batch_size * 10
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=args.batch_size, pin_memory=True)
    firsts, peaks = [], {}
    for _ in range(args.repeats):
        model, criterion, optimizer = resnet.make(rn)
        probe = FirstBatch()
        torch.cuda.synchronize()
        start = time.perf_counter()
        SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, loaders={"train": loader},
                                 valid_loader="train", num_epochs=1, amp="bf16", channels_last=True,
                                 callbacks=[probe])
        firsts.append(probe.end - start)
    for name, fn in (("hand-written", resnet.hand_written), ("torchstage", resnet.with_torchstage)):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        fn(rn, loader)
        peaks[name] = torch.cuda.max_memory_allocated() / 2**20
    return ["### Start-up and memory (the same ResNet, bf16, channels_last)", "",
            "| train() call to first batch end | peak GPU memory, hand-written | peak GPU memory, torchstage |",
            "| --- | --- | --- |",
            f"| {1e3 * statistics.median(firsts):.1f} ms | {peaks['hand-written']:.1f} MiB | "
            f"{peaks['torchstage']:.1f} MiB |", ""]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("scripts/bench/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    logging.getLogger("torchstage").setLevel(logging.WARNING)
    torch.backends.cudnn.benchmark = True
    failed = False
    lines = [f"## GPU benchmarks: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d')}", ""]
    for part in (throughput, step_cost, first_batch_and_memory):  # each part printed as it ends
        try:
            lines += part(args)
        except Exception as error:  # noqa: BLE001 - the report keeps the parts that ran, and says which failed
            lines += [f"### {part.__name__} failed: {type(error).__name__}: {error}", ""]
            failed = True
        print("\n".join(lines), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
