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
- ``helper process``: the same writes (checkpoint copies, ``metrics.json``, log rows) sent in order through a
  pipe to a helper process (``file_helper.py``, started once), which runs them with torchstage's writers; the
  helper's CPU time is counted with the run's. A measurement, not a design (it patches the writers' call
  sites): it shows what the writer thread's GIL hand-overs cost the training thread;
- ``jobs dropped``: the chain's file jobs made (checkpoints captured and serialized, rows formatted) and
  handed over, then dropped unrun: what the chain costs the training thread besides the files themselves;
- ``no logdir``: no files at all.

Prints medians of the paired per-round ratios (wall and process CPU) with 95 % intervals, and the
training thread's voluntary context switches per run (each a wait, mostly for the GIL).
Usage: python scripts/bench/overhead_writer.py [--repeats 31] [--only chain topk=1 ...]
"""
import argparse
import contextlib
import os
import pickle
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402
from overhead import cpu_seconds, median_interval, round_order, run_hand_written, run_torchstage  # noqa: E402

from torchstage.files import log_files  # noqa: E402
from torchstage.files import writer as file_writer  # noqa: E402
from torchstage.callbacks.checkpoints import checkpoint_saver  # noqa: E402
from torchstage.strategies import single  # noqa: E402
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


class _Dropped(file_writer.FileWriter):
    """Takes every job and runs none."""

    def submit(self, job, large=True):
        pass


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


class _HelperProcess:
    """``file_helper.py`` running in a process of its own, fed through its stdin; started at first use."""

    def __init__(self):
        self._process = None

    def send(self, *op) -> None:
        data = pickle.dumps(op, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(struct.pack("<I", len(data)) + data)
        while view:
            view = view[os.write(self._process.stdin.fileno(), view):]

    def wait(self) -> None:
        """Block until the helper has run every operation sent before."""
        self.send("ping")
        self._process.stdout.readline()

    def close(self) -> None:
        """End the helper once it has run everything sent (it stops at the end of its input)."""
        if self._process is not None:
            self._process.stdin.close()
            self._process.wait()
            self._process = None

    def cpu_seconds(self) -> float:
        """The helper's CPU time so far (Linux's ``schedstat``, nanoseconds), 0 before it started."""
        if self._process is None:
            return 0.0
        with open(f"/proc/{self._process.pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    def _write_atomic(self, path, data, durable=True) -> None:
        """``checkpoint.write_atomic`` in the helper: a durable file as a checkpoint copy, else as a log rewrite."""
        if durable:
            self.send("copies", [path], data)
        else:
            self.send("replace", path, data)

    def _write_stream(self, paths, dump, before_last=None) -> None:
        """``atomic.write_atomic_stream`` in the helper: ``before_last`` (``metrics.json``, sent too) first."""
        if before_last is not None:
            before_last()
        self.send("stream", paths, dump)

    @contextlib.contextmanager
    def installed(self):
        """The checkpoint, ``metrics.json`` and log writes of a run sent to the helper instead of the writer
        thread (the jobs that make them run where they are handed over; with ``topk=0`` none deletes a file)."""
        if self._process is None:
            helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_helper.py")
            self._process = subprocess.Popen([sys.executable, helper], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        patches = [(single, "write_atomic_stream", self._write_stream),
                   (single, "hand_over", _run_here), (checkpoint_saver, "hand_over", _run_here),
                   (checkpoint_saver, "write_atomic", self._write_atomic),
                   (log_files.LogFiles, "append", lambda files, runner, path, data: self.send("append", path, data)),
                   (log_files.LogFiles, "replace", lambda files, runner, path, data: self.send("replace", path, data)),
                   (log_files.LogFiles, "close", lambda files, runner: self.send("close")),
                   (file_writer.FileWriter, "wait", lambda writer: self.wait())]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        for owner, name, value in patches:
            setattr(owner, name, value)
        try:
            yield
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)


def _run_here(writer, job, large=True):
    job()


HELPER = _HelperProcess()


def run_with_helper_process(loaders, logdir):
    with HELPER.installed():
        run_chain(loaders, logdir)


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
    "helper process": run_with_helper_process,
    "jobs dropped": lambda loaders, logdir: run_chain(loaders, logdir, _Dropped),
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
    if not os.path.exists("/proc/thread-self/stat"):  # not Linux (no affinity by CPU, no schedstat)
        contenders.pop("one CPU", None)
        contenders.pop("helper process", None)
    wall, cpu, waits = ({name: [] for name in contenders} for _ in range(3))
    with tempfile.TemporaryDirectory() as logdir:
        for repeat in range(args.repeats + 1):
            for name, fn in round_order(list(contenders.items()), repeat):
                switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
                start, start_cpu = time.perf_counter(), cpu_seconds() + HELPER.cpu_seconds()
                fn(loaders, logdir)
                if repeat:  # the first round warms up
                    wall[name].append(time.perf_counter() - start)
                    cpu[name].append(cpu_seconds() + HELPER.cpu_seconds() - start_cpu)
                    waits[name].append(resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - switches)
        HELPER.close()
    for name in contenders:
        line = f"{name:>14}:"
        for label, measured in (("wall", wall), ("cpu", cpu)):
            ratios = [t / h for t, h in zip(measured[name], measured["hand-written"])]
            low, high = median_interval(ratios)
            line += f"  {label} {statistics.median(ratios):.3f} ({low:.3f} to {high:.3f})"
        print(f"{line}  training thread waits {statistics.median(waits[name]):.0f} per run")


if __name__ == "__main__":
    main()
