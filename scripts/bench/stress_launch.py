"""Many short 2-process runs under torchrun, until the time is up or one hangs: runs, hangs, the slowest run.

Each run trains the tutorial model for ``--epochs`` short epochs on 640 samples with one DataLoader worker
(a fork per loader pass), either through ``train(distributed=True)`` or as a hand-written DDP loop
(``--hand-written``), with ``--parallel`` runs at a time. A run still going after ``--hung-after`` seconds
is a hang: the stack of each of its processes is printed (``py-spy dump``, and gdb's native one for the
DataLoader workers, when installed), then the processes are killed. This is how CPython gh-112275 was
found behind a rare hang (docs/distributed.md, "A hang that is Python's").
Usage: python scripts/bench/stress_launch.py [--minutes 10] [--parallel 1] [--hand-written] [--epochs 40]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SAMPLES = 640


def run_torchstage(logdir: str, epochs: int) -> None:
    import workload
    from torch.utils.data import DataLoader, TensorDataset
    from torchstage import SupervisedRunner

    workload.quiet()
    x, y = workload.make_data()
    loader = DataLoader(TensorDataset(x[:SAMPLES], y[:SAMPLES]), batch_size=workload.BATCH_SIZE, num_workers=1)
    model, criterion, optimizer, scheduler = workload.make_parts()
    SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                             loaders={"train": loader, "valid": loader}, logdir=logdir, num_epochs=epochs,
                             overwrite=True, distributed=True, hang_timeout=None)  # the harness watches


def run_hand_written(logdir: str, epochs: int) -> None:
    from torch.utils.data import TensorDataset
    import workload
    x, y = workload.make_data()
    workload.hand_written_ddp(TensorDataset(x[:SAMPLES], y[:SAMPLES]), epochs, 1, os.path.join(logdir, "hand.pth"))


def process_tree(pid: int) -> list:
    table = [line.split() for line in subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True,
                                                      text=True).stdout.splitlines()]
    found, frontier = [], [str(pid)]
    while frontier:
        found += frontier
        frontier = [child for child, parent in table if parent in frontier]
    return [int(p) for p in found]


def report_stacks(pids: list) -> None:
    """Each process's Python stack (py-spy), and the native one of those py-spy cannot read or that are
    DataLoader workers (gdb): a worker stuck in ``os.fork()`` shows only there."""
    for pid in pids:
        print(f"=== process {pid}: {open(f'/proc/{pid}/cmdline').read().replace(chr(0), ' ')[:200]}")
        if shutil.which("py-spy"):
            out = subprocess.run(["py-spy", "dump", "-p", str(pid)], capture_output=True, text=True)
            print(out.stdout or out.stderr[:300])
        if shutil.which("gdb") and pid != pids[0]:
            out = subprocess.run(["gdb", "-batch", "-ex", "bt 16", "-p", str(pid)], capture_output=True, text=True,
                                 timeout=120)
            print("\n".join(line for line in out.stdout.splitlines() if line.startswith("#")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (2: each beside another's load)")
    parser.add_argument("--hand-written", action="store_true", help="the hand-written DDP loop instead")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--hung-after", type=float, default=90)
    parser.add_argument("--worker", metavar="LOGDIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return (run_hand_written if args.hand_written else run_torchstage)(args.worker, args.epochs)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
               "--epochs", str(args.epochs)] + (["--hand-written"] if args.hand_written else [])
    deadline, runs, slowest, running = time.time() + 60 * args.minutes, 0, 0.0, []
    with tempfile.TemporaryDirectory() as tmp:
        while running or time.time() < deadline:
            while time.time() < deadline and len(running) < args.parallel:
                logdir = tempfile.mkdtemp(dir=tmp)
                proc = subprocess.Popen(command + ["--worker", logdir], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                running.append((proc, time.time()))
            time.sleep(0.2)
            for proc, started in list(running):
                if proc.poll() is not None:
                    running.remove((proc, started))
                    runs, slowest = runs + 1, max(slowest, time.time() - started)
                    if proc.returncode:
                        print(f"run {runs} failed with exit code {proc.returncode}")
                elif time.time() - started > args.hung_after:
                    print(f"HANG after {runs} finished run(s): no end after {args.hung_after:.0f} s")
                    pids = process_tree(proc.pid)
                    report_stacks(pids)
                    for pid in pids:
                        os.kill(pid, 9)
                    print(f"runs {runs}, hangs 1, slowest finished run {slowest:.1f} s")
                    return
    print(f"runs {runs}, hangs 0, slowest run {slowest:.1f} s")


if __name__ == "__main__":
    main()
