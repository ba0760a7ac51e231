"""The straggler detector at work: false alarms over runs with no slow rank, and the time to name a slow rank and to
say it recovered, over fresh 4-process runs of ``straggler_run.py`` (the default detector, run one after the other).

- ``--calm N``: N runs of ``--epochs`` epochs with no slow rank; a run with any straggler line is a false alarm;
- ``--slow M``: M runs with rank 2 slow in compute, and M with rank 1 slow in data, from epoch 3 to 5 of 14 (a
  15 ms sleep per train batch): whether the right rank and part were named and nobody else, the seconds from its
  first slow batch to the line naming it, and from its first epoch back at speed to the line saying so.

``--cost`` measures instead what the detector adds to each step: in one world of 2 processes (its own torchrun), a
small DDP model's train steps alternate in blocks with and without the detector's per-step work (its batch
events and the hooks that time the backward's wait); rank 0's thread CPU time per step, median over
blocks.

Usage: python scripts/bench/stragglers.py [--calm 10] [--slow 3] [--epochs 5] [--nprocs 4]
       python scripts/bench/stragglers.py --cost [--blocks 40] [--steps 1000]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN = os.path.join(HERE, "straggler_run.py")


def run(logdir: str, *options) -> str:
    """One fresh run of the workload (this checkout first on the path); its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
           "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, RUN, logdir, *map(str, options)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=600)
    if result.returncode:
        raise RuntimeError(f"straggler_run.py {' '.join(map(str, options))} failed:\n{result.stdout[-3000:]}")
    return result.stdout


def lines(output: str) -> list:
    return [line for line in (re.sub(r"^\[rank\d+\]: ", "", x) for x in output.splitlines())
            if line.startswith("straggler")]


def slow_run(logdir: str, part: str, rank: int, nprocs: int) -> dict:
    output = run(logdir, "--slow", part, "--rank", rank, "--from-epoch", 3, "--to-epoch", 5, "--epochs", 14,
                 "--samples", 8192, "--nprocs", nprocs)
    path = os.path.join(logdir, "logs", "stragglers.jsonl")
    events = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    start, end = (float(open(os.path.join(logdir, name)).read()) for name in ("slow-start.txt", "slow-end.txt"))
    named = [e for e in events if e["kind"] == "slow"]
    right = [e for e in named if (e["rank"], e["part"]) == (rank, part)]
    recovered = [e for e in events if e["kind"] == "recovered" and (e["rank"], e["part"]) == (rank, part)]
    return {"named": bool(right), "others": len(named) - len(right),
            "to_name": right[0]["time"] - start if right else None,
            "to_recover": recovered[0]["time"] - end if recovered else None, "lines": lines(output)}


def cost_worker(blocks: int, steps: int) -> None:
    """One rank of ``--cost``: blocks of DDP steps with the detector's clock and hooks, and without, alternating."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torchstage.callbacks.monitoring.step_clock import BackwardWait, StepClock
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 10), torch.randn(32, 1)
    per_step = {True: [], False: []}
    for block in range(blocks + 2):
        timed = block % 2 == 0
        wait = BackwardWait([model]) if timed else None
        clock = StepClock(wait) if timed else None
        dist.barrier()
        start = time.thread_time()
        for _ in range(steps):
            if clock:
                clock.batch_start()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if clock:
                clock.batch_end()
        if block >= 2:  # the first two warm up
            per_step[timed].append((time.thread_time() - start) / steps * 1e6)
        if wait is not None:
            wait.remove()
    if dist.get_rank() == 0:
        for name, pick in (("median", statistics.median), ("mean", statistics.mean)):
            with_, without = pick(per_step[True]), pick(per_step[False])
            print(f"rank 0 thread CPU per step ({name} of {blocks // 2} blocks of {steps} steps each): {with_:.1f} us "
                  f"with the detector's clock and hooks, {without:.1f} us without ({with_ - without:+.1f} us, "
                  f"{with_ / without - 1:+.1%})")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost", action="store_true", help="the detector's cost per step instead")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calm", type=int, default=10, help="runs with no slow rank")
    parser.add_argument("--slow", type=int, default=3, help="runs with a slow rank, per part")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of a run with no slow rank")
    parser.add_argument("--nprocs", type=int, default=4)
    args = parser.parse_args()
    if args.worker:
        return cost_worker(args.blocks, args.steps)
    if args.cost:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        raise SystemExit(subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                          "--nproc-per-node=2", os.path.abspath(__file__), "--worker", "--blocks",
                                          str(args.blocks), "--steps", str(args.steps)], env=env))
    with tempfile.TemporaryDirectory() as tmp:
        alarms, started = [], time.time()
        for index in range(args.calm):
            found = lines(run(os.path.join(tmp, f"calm{index}"), "--epochs", args.epochs, "--samples", 8192,
                              "--nprocs", args.nprocs))
            alarms.append(found)
            print(f"calm run {index + 1}/{args.calm}: {len(found)} straggler line(s)" +
                  "".join(f"\n  {line}" for line in found), flush=True)
        slow = {}
        for part, rank in (("compute", 2), ("data", 1)):
            slow[part] = []
            for index in range(args.slow):
                found = slow_run(os.path.join(tmp, f"{part}{index}"), part, rank, args.nprocs)
                slow[part].append(found)
                doubted = any("confidence low" in line for line in found["lines"])
                print(f"{part} run {index + 1}/{args.slow}: named {found['named']}, others named {found['others']}, "
                      f"to name {found['to_name']}, to recover {found['to_recover']}, said 'confidence low' "
                      f"{doubted}", flush=True)
    doubted = sum(1 for a in alarms if a and all("confidence low" in line for line in a if "recovered" not in line))
    print(f"\n{sum(1 for a in alarms if a)} false alarm(s) in {len(alarms)} runs of {args.epochs} epochs with no slow "
          f"rank ({args.nprocs} processes; {time.time() - started:.0f} s in all); {doubted} of them said "
          f"'confidence low' (the host shared with other work)")
    for part, found in slow.items():
        named = [f["to_name"] for f in found if f["to_name"] is not None]
        back = [f["to_recover"] for f in found if f["to_recover"] is not None]
        print(f"{part}: named {sum(f['named'] for f in found)}/{len(found)}, other ranks named "
              f"{sum(f['others'] for f in found)}; seconds to name: "
              f"{' '.join(f'{t:.1f}' for t in named)} (median {statistics.median(named) if named else float('nan'):.1f}"
              f", max {max(named) if named else float('nan'):.1f}); recovery said after "
              f"{' '.join(f'{t:.1f}' for t in back)} s ({len(back)}/{len(found)})")


if __name__ == "__main__":
    main()
