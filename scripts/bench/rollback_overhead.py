"""The price of mode="rollback" when nothing goes wrong: snapshots of the run at each clean check, on the tutorial
workload, against the default chain (mode="stop") and the hand-written loop, in the same process.

Contenders run in turns (each in each position of a round equally often, after a warm-up round, see
``overhead.round_order``): the hand-written loop, torchstage with the default ``NonFiniteLossCallback()``
(``mode="stop"``), with ``mode="rollback"`` and with ``mode="rollback"`` plus ``spike=LossSpike()``, all with
``check_every`` 100. Prints each one's median wall and CPU time and ratio to the hand-written loop, and the
paired per-round ratio of each rollback contender to ``mode="stop"`` with a 95 % bootstrap interval: the price
of the snapshots themselves; and the snapshots' own CPU time (``Runner.take_snapshot``, timed in the training
thread): how many a run takes, each one's cost, and their share of the rollback runs' CPU time, a figure that
the load of a shared host moves little; the same for what ``mode="rollback"`` keeps of every train batch besides
its loss (the norms of the weights and held gradients, ``NonFiniteLossCallback._keep_state``), where it has it. ``--hidden N`` trains a two-layer MLP of width N instead of the tutorial's linear
model (N=1024: 12 k parameters; 8192: 98 k), so that the copies weigh more; ``--control`` adds the hand-written
loop again (A/A), whose ratio is the noise of the figures.
Usage: python scripts/bench/rollback_overhead.py [--repeats 21] [--hidden 0] [--num-workers 0] [--control]
"""
import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402
from overhead import cpu_seconds, median_interval, round_order  # noqa: E402

from torchstage import LossSpike, NonFiniteLossCallback, SupervisedRunner  # noqa: E402
from torchstage.runner.runner import Runner  # noqa: E402

CHECK_EVERY = 100
#: The snapshots' count and thread CPU seconds, summed over the rollback runs (see :func:`timed`).
SNAPSHOTS = {"count": 0, "cpu": 0.0}
#: The same for what a rollback run keeps of each train batch's state (none where the version has no such step).
STATES = {"count": 0, "cpu": 0.0}


def timed(owner, name: str, sums: dict) -> None:
    """Count the calls of ``owner.name`` and sum the training thread's CPU time in them (if ``owner`` has it)."""
    method = getattr(owner, name, None)
    if method is None:
        return

    def counted(*args, **kwargs):
        start = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            sums["cpu"] += time.thread_time() - start
            sums["count"] += 1
    setattr(owner, name, counted)


def make_parts(hidden: int):
    """The tutorial's parts, with a two-layer MLP of width ``hidden`` for the model when ``hidden`` > 0."""
    model, criterion, optimizer, scheduler = workload.make_parts()
    if hidden:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(workload.NUM_FEATURES, hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(hidden, 1))
        optimizer = torch.optim.Adam(model.parameters())
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 6])
    return model, criterion, optimizer, scheduler


def contenders(hidden: int) -> dict:
    def torchstage_run(callback):
        def run(loaders, logdir):
            model, criterion, optimizer, scheduler = make_parts(hidden)
            SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                                     loaders=loaders, logdir=logdir, num_epochs=workload.NUM_EPOCHS, overwrite=True,
                                     callbacks={"nonfinite": callback()})
        return run

    def hand_written(loaders, logdir):
        model, criterion, optimizer, scheduler = make_parts(hidden)
        workload.hand_written(loaders, workload.NUM_EPOCHS, model, criterion, optimizer, scheduler,
                              checkpoint_path=os.path.join(logdir, "hand.pth"))

    return {"hand-written": hand_written,
            "stop": torchstage_run(lambda: NonFiniteLossCallback(check_every=CHECK_EVERY)),
            "rollback": torchstage_run(lambda: NonFiniteLossCallback(mode="rollback", check_every=CHECK_EVERY)),
            "rollback+spike": torchstage_run(lambda: NonFiniteLossCallback(mode="rollback", check_every=CHECK_EVERY,
                                                                           spike=LossSpike()))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--hidden", type=int, default=0, help="width of a two-layer MLP (0: the tutorial's Linear)")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--control", action="store_true", help="the hand-written loop twice a round (A/A)")
    args = parser.parse_args()
    loaders = workload.benchmark_loaders(args.num_workers)
    logging.getLogger("torchstage").setLevel(logging.ERROR)  # the tutorial's broadcast warning, once a run
    runs = contenders(args.hidden)
    if args.control:
        runs["hand-written again"] = runs["hand-written"]
    params = sum(p.numel() for p in make_parts(args.hidden)[0].parameters())
    print(f"model: {params} parameters; {workload.NUM_EPOCHS} epochs of {len(loaders['train'])} train batches; "
          f"check_every={CHECK_EVERY}")
    timed(Runner, "take_snapshot", SNAPSHOTS)
    timed(NonFiniteLossCallback, "_keep_state", STATES)
    wall, cpu = {name: [] for name in runs}, {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as logdir:
        for repeat in range(args.repeats + 1):
            for name, fn in round_order(list(runs.items()), repeat):
                start, start_cpu = time.perf_counter(), cpu_seconds()
                fn(loaders, logdir)
                if repeat:  # the first round warms up imports and allocators
                    wall[name].append(time.perf_counter() - start)
                    cpu[name].append(cpu_seconds() - start_cpu)
    base, base_cpu = statistics.median(wall["hand-written"]), statistics.median(cpu["hand-written"])
    for name in runs:
        med, med_cpu = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:>18}: wall median {med:.3f} s (ratio {med / base:.3f})   cpu median {med_cpu:.3f} s (ratio "
              f"{med_cpu / base_cpu:.3f})   over {len(wall[name])} runs")
    rollback_runs = 2 * (args.repeats + 1)  # the two rollback contenders, warm-up round included
    per_run, each = SNAPSHOTS["count"] / rollback_runs, SNAPSHOTS["cpu"] / max(1, SNAPSHOTS["count"])
    print(f"snapshots: {per_run:.0f} a run, {1e3 * each:.3f} ms of CPU each, {100 * per_run * each / base_cpu:.2f} % "
          f"of the hand-written loop's CPU time")
    if STATES["count"]:
        per_run, each = STATES["count"] / rollback_runs, STATES["cpu"] / STATES["count"]
        print(f"states kept: {per_run:.0f} a run, {1e6 * each:.1f} us of CPU each, "
              f"{100 * per_run * each / base_cpu:.2f} % of the hand-written loop's CPU time")
    for name in ("rollback", "rollback+spike"):
        for label, measured in (("wall", wall), ("cpu", cpu)):
            per_round = [a / b for a, b in zip(measured[name], measured["stop"])]
            low, high = median_interval(per_round)
            print(f"{name} / stop per round ({label}): median {statistics.median(per_round):.3f} (95 % interval "
                  f"{low:.3f} to {high:.3f})")


if __name__ == "__main__":
    main()
