"""Pure per-step framework cost: pre-collated batches in a list (no DataLoader), tiny model, no logdir.

This isolates what the runner adds per batch (events, callbacks, metric accumulation) from data
loading; prints microseconds per step for a hand-written loop and for torchstage, and the ratio.
Times are CPU time of this process with one torch thread, so other load on the machine hardly
moves them (``--wall`` for wall-clock time).
Usage: python scripts/bench/step_overhead.py [--batches 2000] [--repeats 5]
"""
import argparse
import logging
import statistics
import time

import torch

from torchstage import SupervisedRunner


def make(seed=0, device="cpu"):
    torch.manual_seed(seed)
    model = torch.nn.Linear(10, 1).to(device)
    return model, torch.nn.MSELoss(), torch.optim.Adam(model.parameters())


def hand_written(batches):
    device = batches[0][0].device
    model, criterion, optimizer = make(device=device)
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    model.train()
    for x, y in batches:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total += loss.detach() * len(x)
        count += len(x)
    return float(total / count)


def torchstage_run(batches, **kwargs):
    model, criterion, optimizer = make(device=batches[0][0].device)
    runner = SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer,
                                      loaders={"train": batches}, valid_loader="train", num_epochs=1, **kwargs)
    return runner.epoch_metrics["train"]["loss"]


def torchstage_monitor(batches):
    """The default chain with ``monitor=True`` (throughput, data wait, memory, FLOPs of the first batch)."""
    return torchstage_run(batches, monitor=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of process CPU time")
    args = parser.parse_args()
    logging.getLogger("torchstage").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    clock = time.perf_counter if args.wall else time.process_time
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(32, 10, generator=g), torch.rand(32, 1, generator=g)) for _ in range(args.batches)]
    contenders = {"hand-written": hand_written, "torchstage": torchstage_run, "+monitor": torchstage_monitor}
    times = {name: [] for name in contenders}
    for repeat in range(args.repeats + 1):
        for name, fn in contenders.items():
            start = clock()
            fn(batches)
            if repeat:
                times[name].append(clock() - start)
    base = statistics.median(times["hand-written"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:>14}: {1e6 * med / args.batches:7.1f} us/step  ratio {med / base:.3f}")
    print(f"torchstage adds {1e6 * (statistics.median(times['torchstage']) - base) / args.batches:.1f} us/step")
    monitor = statistics.median(times["+monitor"]) - statistics.median(times["torchstage"])
    print(f"monitor=True adds {1e6 * monitor / args.batches:.1f} us/step")


if __name__ == "__main__":
    main()
