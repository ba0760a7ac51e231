"""``torchstage preflight``: before a long job, are all the ranks alike? Matmul, host memory and links per rank,
compared across the world, with the slow ones named (and, under SLURM, the ``--exclude`` to leave their nodes out)."""
import argparse
import json
import sys
from dataclasses import asdict
from datetime import timedelta

from torchstage.arguments import ArgumentError
from torchstage.launch.enter import run_in_world
from torchstage.launch.failures import record_outcome
from torchstage.launch.node_load import NodeLoad
from torchstage.launch.preflight.check import REPEATS, SECONDS, THRESHOLD, run_preflight
from torchstage.launch.preflight.verdict import found_text, host_loads

EPILOG = """\
examples:
  srun -N 2 --ntasks-per-node=4 torchstage preflight
  srun -N 2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
       --rdzv-endpoint node1:29500 -m torchstage preflight
  torchrun --nproc-per-node=8 -m torchstage preflight
  mpirun -np 8 torchstage preflight
  torchstage preflight --nprocs 4           # 4 processes on this host

Every rank runs a matmul probe and a host-memory copy probe (each repeated, all ranks together; the median
counts), the world runs an all-reduce, and ranks exchange data pairwise (between nodes when there are several).
Rank 0 prints one table per node. A rank at least --threshold below the median of the other ranks in a measure
is an outlier; under SLURM the --exclude=<nodes> to resubmit without their nodes is printed. On GPUs the matmul
runs on the rank's GPU and the collectives on NCCL.

exit status: 0 all ranks agree; 1 an outlier was found; 2 the check could not run."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "preflight", help="before a long job: compare every rank's matmul, memory and link speed, name slow nodes",
        description="Run short probes on every rank of the world this process belongs to (srun, srun + torchrun,\n"
                    "torchrun, mpirun, or --nprocs on this host) and name the ranks and nodes that are slower\n"
                    "than the others.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, help="start this many processes on this host (no launcher needed)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD,
                        help=f"an outlier is this share below the others' median (default {THRESHOLD})")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"times each probe runs on every rank; the median counts (default {REPEATS})")
    parser.add_argument("--seconds", type=float, default=SECONDS,
                        help=f"seconds of each matmul and memory probe (default {SECONDS})")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a collective may wait for a peer before the check gives up (default 120)")
    parser.add_argument("--json", action="store_true", help="print the figures and the verdict as one JSON object")
    parser.add_argument("--start", choices=("preloaded", "fresh"), default=None,
                        help="with --nprocs: fork the processes from one that imported torch once (preloaded, the "
                             "default; or $TORCHSTAGE_START) or start each in a fresh interpreter")
    parser.set_defaults(func=preflight_command)


def preflight_command(args) -> int:
    if not 0 < args.threshold < 1:
        raise ArgumentError("--threshold", f"must be a share between 0 and 1, got {args.threshold!r}")
    if args.repeats < 1:
        raise ArgumentError("--repeats", f"must be at least 1, got {args.repeats!r}")
    if not args.seconds > 0 or not args.timeout > 0:
        raise ArgumentError("--seconds" if not args.seconds > 0 else "--timeout",
                            f"must be a number of seconds > 0, got {args.seconds if not args.seconds > 0 else args.timeout!r}")
    try:
        return run_in_world(lambda world: _check(world, args), True if args.nprocs else None, args.nprocs,
                            timeout=timedelta(seconds=args.timeout), start=args.start)
    except (RuntimeError, OSError) as exc:  # the world could not form (a peer missing, a port taken...)
        sys.stderr.write(f"torchstage preflight: error: cannot run the check: {' '.join(str(exc).split())}\n")
        return 2


def _check(world, args) -> int:
    try:
        result = run_preflight(world, args.repeats, args.seconds, args.threshold)
    except Exception as exc:  # a probe or a collective failed: a peer gone, a device error
        sys.stderr.write(f"torchstage preflight: error on rank {world.rank}: cannot run the check: "
                         f"{type(exc).__name__}: {' '.join(str(exc).split())}\n")
        return 2
    if world.rank == 0:
        if args.json:
            sys.stdout.write(json.dumps({"ranks": [{**asdict(r), "link": r.link} for r in result.ranks],
                                         "outliers": [asdict(o) for o in result.outliers],
                                         "confidence": {host: _confidence(load) for host, load in
                                                        host_loads(result.ranks).items()},
                                         "all_reduce_gbps": result.all_reduce, "exclude": result.exclude,
                                         "exit_code": result.exit_code}) + "\n")
        else:
            sys.stdout.write(result.text + "\n")
        sys.stdout.flush()
    if result.outliers:  # for a launcher of torchstage's (--nprocs): an outcome, not a failure to restart
        record_outcome(world.rank, f"torchstage preflight: the check found {found_text(result.outliers)}")
    return result.exit_code


def _confidence(load: NodeLoad) -> dict:
    """A host's load during the check and the confidence it gives, for --json."""
    return {"confidence": "high" if load.doubt() is None else "low", "why": load.doubt(), "cpus": load.cpus,
            "busy_cores": round(load.busy, 3), "job_cores": round(load.own, 3), "steal": round(load.steal, 4)}
