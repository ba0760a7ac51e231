"""Compute-bound throughput: a small ResNet on synthetic 32x32 images, torchstage vs the best hand-written loop.

Both sides use the same settings (device, AMP dtype, channels_last, batch size) and run alternately;
medians over repeats. On a GPU pass e.g. ``--amp bf16 --channels-last``.
Usage: python scripts/bench/resnet.py [--device cpu|cuda] [--amp none|bf16|fp16] [--channels-last]
"""
import argparse
import logging
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import SupervisedRunner


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))


class Residual(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = block(cin, cout, stride)
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def small_resnet(width=32, num_classes=10):
    return nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                         Residual(width, width, 1), Residual(width, 2 * width, 2), Residual(2 * width, 4 * width, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, num_classes))


def make(args, seed=0):
    torch.manual_seed(seed)
    model = small_resnet(args.width).to(args.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def hand_written(args, loader, log_item: bool = False):
    """The best hand-written loop; ``log_item`` adds the ``loss.item()`` per step most users write for logging."""
    model, criterion, optimizer = make(args)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler(args.device, enabled=args.amp == "fp16")
    model.train()
    for x, y in loader:
        x, y = x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if log_item:
            loss.item()
    if args.device == "cuda":
        torch.cuda.synchronize()


def with_torchstage(args, loader):
    model, criterion, optimizer = make(args)
    extra = {}
    if args.amp != "none":
        extra["amp"] = args.amp
    if args.channels_last:
        extra["channels_last"] = True
    runner = SupervisedRunner()
    runner.train(model=model, criterion=criterion, optimizer=optimizer, loaders={"train": loader},
                 valid_loader="train", num_epochs=1, **extra)
    if args.device == "cuda":
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("torchstage").setLevel(logging.WARNING)
    n = args.batch_size * args.batches
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=args.batch_size, pin_memory=args.device == "cuda")
    contenders = {"hand-written": hand_written, "torchstage": with_torchstage}
    times = {name: [] for name in contenders}
    for repeat in range(args.repeats + 1):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn(args, loader)
            if repeat:
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["hand-written"])
    print(f"device={args.device} amp={args.amp} channels_last={args.channels_last} batch={args.batch_size} "
          f"batches={args.batches}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:>14}: {n / med:9.1f} samples/s (median of {len(values)})  throughput ratio {base / med:.3f}")


if __name__ == "__main__":
    main()
