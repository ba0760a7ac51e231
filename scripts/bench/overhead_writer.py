"""Where the default chain's file work runs, and what that costs: the same files written from different places.

Same workload and alternation as ``overhead.py`` (``num_workers=0``); contenders, each paired with the
hand-written loop in every round:

- ``chain``: the default chain as shipped (file jobs on the run's writer thread);
- ``topk=1``: the chain keeping the best epoch's ``epoch-NNNN.pth`` too, the default before 2026-11-25 (a
  third durable copy of every improving epoch's checkpoint, byte for byte ``best.pth``);
- ``inline``: every file job run in the training thread when it is handed over (no writer thread);
- ``light inline``: the light jobs (log rows and events, ``metrics.json``) run in the training thread when
  handed over, the checkpoints on the writer thread (the logs' place before 2026-11-25). A measurement,
  not a design: a light job may then run before the checkpoint handed over ahead of it;
- ``after the run``: every job held and run in the training thread after the last epoch. Not a valid
  design (a crash would lose every checkpoint): it shows what the same work costs when nothing else runs;
- ``one CPU``: the training thread (hence the writer it starts) held on the CPU it started on. A library
  may not pin its user's thread: it shows what the two threads cost each other when they share two CPUs;
- ``no logdir``: no files at all.

Prints medians of the paired per-round ratios (wall and process CPU) with 95 % intervals, and the
training thread's voluntary context switches per run (each a wait, mostly for the GIL).
Usage: python scripts/bench/overhead_writer.py [--repeats 31] [--only chain topk=1 ...]
"""
import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402
from overhead import cpu_seconds, median_interval, round_order, run_hand_written, run_torchstage  # noqa: E402

from torchstage import file_writer  # noqa: E402
from torchstage.runner import runner as runner_module  # noqa: E402


class _Inline(file_writer.FileWriter):
    """Runs each job at once, in the thread that hands it over."""

    def submit(self, job, large=True):
        job()


class _LightInline(file_writer.FileWriter):
    """Runs light jobs at once in the thread that hands them over; large ones go to the writer thread."""

    def submit(self, job, large=True):
        if large:
            super().submit(job, large)
        else:
            job()


class _AfterTheRun(file_writer.FileWriter):
    """Holds every job until the run waits for its files (after the last epoch), then runs them there."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._held = []

    def submit(self, job, large=True):
        self._held.append(job)

    def wait(self):
        held, self._held = self._held, []
        for job in held:
            job()

    def close(self):
        self.wait()


def run_chain(loaders, logdir, writer=file_writer.FileWriter, **overrides):
    """``overhead.py``'s torchstage run, its file jobs run by ``writer``; ``overrides``: ``train()`` arguments."""
    runner_module.FileWriter = writer
    try:
        run_torchstage(loaders, logdir, **overrides)
    finally:
        runner_module.FileWriter = file_writer.FileWriter


def current_cpu() -> int:
    """The CPU this thread is running on (field 39 of Linux's ``/proc/thread-self/stat``)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def run_on_one_cpu(loaders, logdir):
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {current_cpu()})
    try:
        run_chain(loaders, logdir)
    finally:
        os.sched_setaffinity(0, allowed)


CONTENDERS = {
    "hand-written": run_hand_written,
    "chain": run_chain,
    "topk=1": lambda loaders, logdir: run_chain(loaders, logdir, topk=1),
    "inline": lambda loaders, logdir: run_chain(loaders, logdir, _Inline),
    "light inline": lambda loaders, logdir: run_chain(loaders, logdir, _LightInline),
    "after the run": lambda loaders, logdir: run_chain(loaders, logdir, _AfterTheRun),
    "one CPU": run_on_one_cpu,
    "no logdir": lambda loaders, logdir: run_chain(loaders, None),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--only", nargs="+", choices=[name for name in CONTENDERS if name != "hand-written"],
                        help="run these contenders only (with the hand-written loop)")
    args = parser.parse_args()
    loaders = workload.benchmark_loaders(0)
    contenders = {name: fn for name, fn in CONTENDERS.items()
                  if args.only is None or name == "hand-written" or name in args.only}
    if not os.path.exists("/proc/thread-self/stat"):  # not Linux
        contenders.pop("one CPU", None)
    wall, cpu, waits = ({name: [] for name in contenders} for _ in range(3))
    with tempfile.TemporaryDirectory() as logdir:
        for repeat in range(args.repeats + 1):
            for name, fn in round_order(list(contenders.items()), repeat):
                switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
                start, start_cpu = time.perf_counter(), cpu_seconds()
                fn(loaders, logdir)
                if repeat:  # the first round warms up
                    wall[name].append(time.perf_counter() - start)
                    cpu[name].append(cpu_seconds() - start_cpu)
                    waits[name].append(resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - switches)
    for name in contenders:
        line = f"{name:>14}:"
        for label, measured in (("wall", wall), ("cpu", cpu)):
            ratios = [t / h for t, h in zip(measured[name], measured["hand-written"])]
            low, high = median_interval(ratios)
            line += f"  {label} {statistics.median(ratios):.3f} ({low:.3f} to {high:.3f})"
        print(f"{line}  training thread waits {statistics.median(waits[name]):.0f} per run")


if __name__ == "__main__":
    main()
