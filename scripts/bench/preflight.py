"""How long ``torchstage preflight`` takes: fresh runs at several numbers of processes on this host (torchstage's own
launcher, ``--nprocs``), timed from the command's start to its end (Python and torch starting in every process, the
process group forming, the probes, the exit), with their exit codes.

Usage: python scripts/bench/preflight.py [--nprocs 4 16] [--repeats 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def once(nprocs: int) -> tuple:
    """(wall seconds, exit code) of one ``torchstage preflight --nprocs N`` started afresh."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
           "CUDA_VISIBLE_DEVICES": ""}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "torchstage", "preflight", "--nprocs", str(nprocs)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return time.perf_counter() - start, result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for nprocs in args.nprocs:
        runs = [once(nprocs) for _ in range(args.repeats)]
        walls = [wall for wall, _ in runs]
        print(f"{nprocs:>3} processes: wall {' '.join(f'{w:.1f}' for w in walls)} s (median "
              f"{statistics.median(walls):.1f}, max {max(walls):.1f}); exit codes {[code for _, code in runs]}",
              flush=True)


if __name__ == "__main__":
    main()
