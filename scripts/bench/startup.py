"""Start-up costs: ``import torchstage``, the time from ``python run.py`` to the first optimizer step with N local
ranks (preloaded and fresh starts, beside torchrun and torch.multiprocessing.spawn with a hand-written DDP loop),
a restart's time to training again, and the files a launch opens.

Usage:
  python scripts/bench/startup.py import [--repeats 7]          import torch vs import torch + torchstage (CPU)
  python scripts/bench/startup.py ranks [--sizes 2 4 8 16] [--rounds 3] [--only torchstage]
                                                                time to the first step, interleaved
  python scripts/bench/startup.py restart [--nproc 4] [--rounds 3]        a rank killed: time to training again
  python scripts/bench/startup.py files [--nproc 8]              files opened and looked up (strace -f -c)
The program run is startup_run.py (the tutorial's regression, module-level data, a DataLoader worker per rank).
Every contender runs once per round in an order that rotates between rounds; figures are medians over rounds.
"""
import argparse
import glob
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN = os.path.join(HERE, "startup_run.py")


def env_for(**extra) -> dict:
    """The environment of a timed run: this checkout on the path, no inherited world or thread settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHSTAGE_", "SLURM_", "OMP_"))}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(":"))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def children_cpu() -> float:
    """CPU seconds of every child process this harness waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---- import ---------------------------------------------------------------------------------------------------
def import_figures(repeats: int) -> None:
    """CPU of import torch, and of import torchstage after it, in fresh interpreters, alternating."""
    code = ("import resource, sys, time\nc = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])\n"
            "import torch\nt = c()\n{extra}\nprint(t, c() - t, sum(m.split('.')[0] == 'torchstage' for m in "
            "sys.modules))")
    torch_only, added, counts = [], [], []
    for _ in range(repeats):  # alternate so both see the same machine state
        for extra in ("", "import torchstage"):
            out = subprocess.run([sys.executable, "-c", code.format(extra=extra)], env=env_for(), text=True,
                                 capture_output=True, check=True).stdout.split()
            (torch_only if not extra else added).append(float(out[0] if not extra else out[1]))
            if extra:
                counts.append(int(out[2]))
    times = []
    for _ in range(repeats):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch; import torchstage"],
                             env=env_for(), text=True, capture_output=True, check=True).stderr
        line = next(line for line in err.splitlines() if line.rstrip().endswith("| torchstage"))
        times.append(int(line.split("|")[1]) / 1e6)
    print(f"import torch: median {statistics.median(torch_only):.3f} s CPU")
    print(f"import torchstage after torch: median {statistics.median(added):.3f} s CPU; -X importtime's cumulative "
          f"for torchstage: median {statistics.median(times):.3f} s; torchstage modules loaded: {counts[0]}")


# ---- time to the first step -------------------------------------------------------------------------------------
def contenders(sizes):
    """(label, size, command, extra environment) of every run of a round."""
    rows = [("torchstage, 1 process", 1, [sys.executable, RUN, "torchstage"], {}),
            ("hand-written, 1 process", 1, [sys.executable, RUN, "hand"], {})]
    for size in sizes:
        rows += [("torchstage preloaded", size, [sys.executable, RUN, "torchstage"],
                  {"TORCHSTAGE_NPROC": size, "TORCHSTAGE_START": "preloaded"}),
                 ("torchstage fresh", size, [sys.executable, RUN, "torchstage"],
                  {"TORCHSTAGE_NPROC": size, "TORCHSTAGE_START": "fresh"}),
                 ("hand-written, torchrun", size, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                   f"--nproc-per-node={size}", RUN, "hand"],
                  {"OMP_NUM_THREADS": max(1, (os.cpu_count() or 1) // size)}),
                 ("hand-written, mp.spawn", size, [sys.executable, RUN, "spawn", str(size)],
                  {"OMP_NUM_THREADS": max(1, (os.cpu_count() or 1) // size)})]
    return rows


def timed(command, extra: dict, kind: str = "first", timeout: float = 900) -> dict:
    """One fresh run: seconds to rank 0's first step (``kind``), the launch's CPU seconds, the ranks' CPU."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        before = children_cpu()
        start = time.time()
        proc = subprocess.run(command, env=env_for(BENCH_OUT=out, BENCH_T0=repr(start), **extra), cwd=tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        cpu = children_cpu() - before
        if not os.path.exists(f"{out}.{kind}"):
            raise RuntimeError(f"{' '.join(command)} (exit {proc.returncode}) wrote no {kind} time:\n"
                               f"{proc.stdout[-3000:]}")
        ranks = [tuple(map(float, open(path).read().split())) for path in glob.glob(f"{out}.cpu.*")]
        return {"seconds": float(open(f"{out}.{kind}").read()), "cpu": cpu,
                "rank_first_line_cpu": statistics.median(r[0] for r in ranks),
                "rank_cpu": statistics.median(r[1] for r in ranks)}


def rounds_of(rows, rounds: int, kind: str = "first", runs: dict = None) -> dict:
    """Every row once a round, the order rotating (and reversed every other round); medians per row."""
    results = {i: [] for i in range(len(rows))}
    for round_ in range(rounds):
        order = list(range(len(rows)))
        shift = round_ * max(1, len(order) // max(1, rounds))
        order = order[shift % len(order):] + order[:shift % len(order)]
        if round_ % 2:
            order.reverse()
        for i in order:
            results[i].append(timed(rows[i][2], rows[i][3], kind))
        print(f"round {round_ + 1} of {rounds} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    if runs is not None:
        runs.update(results)
    return {i: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for i, runs in results.items()}


def rank_figures(sizes, rounds: int, as_json: bool, only: str = None) -> None:
    """The table of times to the first step, against one torchstage process (its median, and the median of each
    round's ratio: robust to load that drifts between rounds)."""
    rows = [row for row in contenders(sizes) if only is None or only in row[0] or row[1] == 1]
    load, runs = os.getloadavg()[0], {}
    medians = rounds_of(rows, rounds, runs=runs)
    base = next(i for i, row in enumerate(rows) if row[0] == "torchstage, 1 process")
    one = medians[base]["seconds"]
    print(f"load average at the start {load:.1f}, at the end {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores; "
          f"medians of {rounds} rounds")
    print(f"{'contender':26} {'ranks':>5} {'first step (s)':>14} {'x 1 process':>11} {'paired':>6} "
          f"{'launch CPU (s)':>14} {'rank CPU at 1st line':>20} {'rank CPU at 1st step':>20}")
    for i, (label, size, _, _) in enumerate(rows):
        m = medians[i]
        paired = statistics.median(a["seconds"] / b["seconds"] for a, b in zip(runs[i], runs[base]))
        print(f"{label:26} {size:5d} {m['seconds']:14.2f} {m['seconds'] / one:11.2f} {paired:6.2f} {m['cpu']:14.2f} "
              f"{m['rank_first_line_cpu']:20.2f} {m['rank_cpu']:20.2f}")
    if as_json:
        print(json.dumps([{**{"contender": row[0], "ranks": row[1]}, **medians[i]} for i, row in enumerate(rows)]))


def restart_figures(nproc: int, rounds: int) -> None:
    """Seconds from a rank's death to the restarted world's first step, preloaded and fresh."""
    rows = [(f"torchstage {start}", nproc, [sys.executable, RUN, "torchstage"],
             {"TORCHSTAGE_NPROC": nproc, "TORCHSTAGE_START": start, "BENCH_KILL": 1})
            for start in ("preloaded", "fresh")]
    medians = rounds_of(rows, rounds, kind="again")
    print(f"rank 1 of {nproc} killed at its first step; seconds from the kill to rank 0's first step of the restarted "
          f"world (medians of {rounds}, load {os.getloadavg()[0]:.1f})")
    for i, row in enumerate(rows):
        print(f"{row[0]:22} {medians[i]['seconds']:6.2f} s")


# ---- files --------------------------------------------------------------------------------------------------------
def file_figures(nproc: int) -> None:
    """Files opened, looked up and listed by every process of a launch (strace -f -c)."""
    if shutil.which("strace") is None:
        raise SystemExit("strace is not installed")
    calls = ("openat", "open", "stat", "newfstatat", "statx", "lstat", "readlink", "getdents64")
    print(f"{nproc} ranks, the run ended after its first step; system calls of every process of the launch "
          f"(strace -f -c)")
    for label, command, extra in (
            ("torchstage preloaded", [sys.executable, RUN, "torchstage"],
             {"TORCHSTAGE_NPROC": nproc, "TORCHSTAGE_START": "preloaded"}),
            ("torchstage fresh", [sys.executable, RUN, "torchstage"],
             {"TORCHSTAGE_NPROC": nproc, "TORCHSTAGE_START": "fresh"}),
            ("torchstage, 1 process", [sys.executable, RUN, "torchstage"], {})):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "strace.txt")
            subprocess.run(["strace", "-f", "-c", "-o", report, "-e", f"trace={','.join(calls)}", *command],
                           env=env_for(BENCH_OUT=os.path.join(tmp, "run"), BENCH_T0=repr(time.time()), **extra),
                           cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
            counts = {}
            for line in open(report):
                fields = line.split()
                if fields and fields[-1] in calls and re.match(r"^[\d.]+$", fields[0]):
                    counts[fields[-1]] = int(fields[3])
        opens = counts.get("openat", 0) + counts.get("open", 0)
        lookups = sum(counts.get(name, 0) for name in ("stat", "newfstatat", "statx", "lstat", "readlink"))
        print(f"{label:22} opens {opens:7d}  stat-like lookups {lookups:7d}  directory reads "
              f"{counts.get('getdents64', 0):6d}")


def main() -> None:
    """Parse the command line and print the figures asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("import", "ranks", "restart", "files"), nargs="?", default="import")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", type=int, nargs="*", default=[2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="also print the medians as one JSON line")
    parser.add_argument("--only", help="ranks: only the contenders whose name holds this text (and the 1-process ones)")
    args = parser.parse_args()
    if args.what == "import":
        import_figures(args.repeats)
    elif args.what == "ranks":
        rank_figures(args.sizes, args.rounds, args.json, args.only)
    elif args.what == "restart":
        restart_figures(args.nproc or 4, args.rounds)
    else:
        file_figures(args.nproc or 8)


if __name__ == "__main__":
    main()
