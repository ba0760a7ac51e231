"""Where the overhead is: training-thread CPU inside the batch loops and outside them, torchstage vs the loop.

Same workload and alternation as ``overhead.py``; per run it reads ``time.thread_time()`` of the training
thread around each loader's batch loop (for torchstage: from the last ``on_loader_start`` handler to the
first ``on_loader_end`` one, so the loader events count as outside) and the process CPU, whose excess over
the training thread is the checkpoint writer thread. A third contender, torchstage without a logdir (no
checkpoints, CSV or TensorBoard files), separates the chain's dispatch from its files. Prints medians and
paired per-round differences to the hand-written loop.
Usage: python scripts/bench/overhead_split.py [--repeats 21] [--num-workers 0]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402
from overhead import median_interval, round_order  # noqa: E402

from torchstage import SupervisedRunner  # noqa: E402
from torchstage.callbacks.base import Callback  # noqa: E402

#: Seconds of training-thread CPU spent inside batch loops in the current run.
_inside = [0.0]


class _LoopStart(Callback):
    """Last at every event: its on_loader_start marks the start of the batch loop."""

    order = 10**6

    def on_loader_start(self, runner):
        self.started = time.thread_time()


class _LoopEnd(Callback):
    """First at every event: its on_loader_end marks the end of the batch loop."""

    order = -1

    def __init__(self, start: _LoopStart):
        self.start = start

    def on_loader_end(self, runner):
        _inside[0] += time.thread_time() - self.start.started


def run_torchstage(loaders, logdir):
    model, criterion, optimizer, scheduler = workload.make_parts()
    start = _LoopStart()
    SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                             loaders=loaders, logdir=logdir, num_epochs=workload.NUM_EPOCHS, verbose=False,
                             overwrite=True, callbacks={"split_start": start, "split_end": _LoopEnd(start)})


def run_torchstage_without_logdir(loaders, logdir):
    run_torchstage(loaders, None)


def run_hand_written(loaders, logdir):
    model, criterion, optimizer, scheduler = workload.make_parts()
    workload.hand_written(loaders, workload.NUM_EPOCHS, model, criterion, optimizer, scheduler,
                          checkpoint_path=os.path.join(logdir, "hand.pth"), inside=_inside)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()
    loaders = workload.benchmark_loaders(args.num_workers)
    contenders = {"hand-written": run_hand_written, "torchstage": run_torchstage,
                  "no logdir": run_torchstage_without_logdir}
    runs = {name: [] for name in contenders}  # (thread total, inside loops, outside loops, other threads)
    with tempfile.TemporaryDirectory() as logdir:
        for repeat in range(args.repeats + 1):
            for name, fn in round_order(list(contenders.items()), repeat):
                _inside[0] = 0.0
                thread, process = time.thread_time(), time.process_time()
                fn(loaders, logdir)
                thread, process = time.thread_time() - thread, time.process_time() - process
                if repeat:  # the first round warms up
                    runs[name].append((thread, _inside[0], thread - _inside[0], process - thread))
    labels = ("training thread", "inside batch loops", "outside batch loops", "other threads")
    for i, label in enumerate(labels):
        hand = [r[i] for r in runs["hand-written"]]
        print(f"{label:>20}: hand-written {statistics.median(hand) * 1e3:8.1f} ms")
        for name in list(contenders)[1:]:
            mine = [r[i] for r in runs[name]]
            diff = [(t - h) * 1e3 for t, h in zip(mine, hand)]
            low, high = median_interval(diff)
            print(f"{name:>33} {statistics.median(mine) * 1e3:8.1f} ms   paired difference "
                  f"{statistics.median(diff):+7.1f} ms (95 % interval {low:+.1f} to {high:+.1f})   over {len(diff)} rounds")

if __name__ == "__main__":
    main()
