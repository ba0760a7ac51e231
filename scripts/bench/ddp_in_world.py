"""The 2-process loop without process start and exit: a hand-written DDP loop and ``train(distributed=True)``
alternating inside one ``torchrun`` world (the process group made once, as a user's own script may).

Fresh runs (``ddp_overhead.py``) mix the loop with interpreter start, imports and exit, which vary by tenths
of a second here; in one world the rounds differ only in the loop, so its parts resolve. Each contender runs
the tutorial workload (8 epochs, one DataLoader worker per rank) once a round, in turns (``round_order``),
after a warm-up round; rank 0 prints medians and paired per-round ratios to the hand-written loop, by wall
time and by the CPU time of rank 0 and its loader workers. ``--split`` adds contenders without one part each
(as in ``ddp_overhead.py``) and one with the stop agreement after every batch (``check_every=1``).

Usage: python scripts/bench/ddp_in_world.py [--repeats 5] [--split] [--only NAME ...]   (starts its own torchrun of 2
processes)
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


def split_contenders() -> dict:
    """name -> ``train()`` overrides of ``--split``."""
    from ddp_overhead import SPLIT
    from torchstage import StopCallback
    return {**SPLIT, "stop agreement every batch": {"callbacks": {"stop": StopCallback(check_every=1)}}}


def worker(repeats: int, split: bool, logdir: str, only=None) -> None:
    """One rank: join the world, run every contender once a round, report on rank 0."""
    import torch.distributed as dist
    from torch.utils.data import TensorDataset
    import workload
    from ddp_overhead import torchstage_run
    from overhead import cpu_seconds, median_interval, round_order

    dist.init_process_group("gloo")
    workload.quiet()
    parts = {name: part for name, part in (split_contenders() if split else {}).items() if not only or name in only}
    contenders = {"hand-written": None, "torchstage": {}, **parts}
    names, rank = list(contenders), dist.get_rank()
    wall, cpu = {name: [] for name in names}, {name: [] for name in names}
    for repeat in range(repeats + 1):
        for name in round_order(names, repeat):
            folder = os.path.join(logdir, name.replace(" ", "_"))
            os.makedirs(folder, exist_ok=True)
            dist.barrier()
            start, start_cpu = time.perf_counter(), cpu_seconds()
            if contenders[name] is None:
                workload.hand_written_ddp_in_group(TensorDataset(*workload.make_data()), workload.NUM_EPOCHS, 1,
                                                   os.path.join(folder, "hand.pth"))
            else:
                torchstage_run(folder, 1, contenders[name])
            dist.barrier()
            if repeat:  # the first round warms caches and lazy imports
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(cpu_seconds() - start_cpu)
    if rank == 0:
        base, base_cpu = statistics.median(wall["hand-written"]), statistics.median(cpu["hand-written"])
        for name in names:
            paired = [t / h for t, h in zip(wall[name], wall["hand-written"])]
            paired_cpu = [t / h for t, h in zip(cpu[name], cpu["hand-written"])]
            low, high = median_interval(paired)
            print(f"{name:>28}: wall median {statistics.median(wall[name]):.3f} s "
                  f"(ratio {statistics.median(wall[name]) / base:.3f}, paired {statistics.median(paired):.3f}, "
                  f"95 % {low:.3f}-{high:.3f})   cpu median {statistics.median(cpu[name]):.3f} s "
                  f"(ratio {statistics.median(cpu[name]) / base_cpu:.3f}, paired {statistics.median(paired_cpu):.3f})",
                  flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--split", action="store_true", help="add contenders without one part each")
    parser.add_argument("--only", nargs="*", default=None, help="of the --split contenders, only these")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--logdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.repeats, args.split, args.logdir, args.only)
    import tempfile
    from ddp_overhead import child_env
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(os.path.join(tmp, "pycache"))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   os.path.abspath(__file__), "--worker", "--repeats", str(args.repeats), "--logdir", tmp]
        if args.split:
            command.append("--split")
        if args.only:
            command += ["--only", *args.only]
        raise SystemExit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()
