"""Where a fresh 2-process run's time goes: per phase, the hand-written DDP loop beside ``train(distributed=True)``.

Each run is a fresh ``torchrun --standalone --nproc-per-node=2`` of this script (contenders alternating, as in
``ddp_overhead.py``); each rank stamps its own start (from ``/proc``), torch imported, the parts built, the
first forward, the loop's end and its last ``atexit``, and the launching process stamps the command's end.
Prints the median of each phase on rank 0: what torchrun takes to start a rank, importing torch, everything up
to the first forward (importing torchstage, building the parts, the process group, the DataLoader's first
fork, torchstage's checks, logdir and threads), the loop (up to ``train()`` returning, or the hand-written
loop's group destroyed), and the exit (interpreter teardown and torchrun noticing it).

Usage: python scripts/bench/ddp_phases.py [--repeats 5]
"""
import argparse
import atexit
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PHASES = [("rank started by torchrun", "launched", "start"), ("import torch", "start", "torch"),
          ("up to the first forward", "torch", "first_batch"), ("the loop", "first_batch", "loop_end"),
          ("exit", "loop_end", "done"), ("the whole command", "launched", "done")]


def process_start() -> float:
    """This process's start, in ``time.time()`` seconds (``/proc/self/stat``'s start tick)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def worker(name: str, out: str) -> None:
    """One rank of contender ``name``: train, stamping each phase into ``out.RANK.json`` at exit."""
    stamps = {"start": process_start()}
    import torch
    stamps["torch"] = time.time()
    sys.path.insert(0, HERE)
    import workload

    def first_forward(module, args):
        stamps.setdefault("first_batch", time.time())
        hook.remove()
    atexit.register(lambda: json.dump(stamps, open(f"{out}.{os.environ['RANK']}.json", "w")))
    if name == "hand-written":
        from torch.utils.data import TensorDataset
        hook = torch.nn.modules.module.register_module_forward_pre_hook(first_forward)
        workload.hand_written_ddp(TensorDataset(*workload.make_data()), workload.NUM_EPOCHS, 1, out + ".pth")
        stamps["loop_end"] = time.time()
    else:
        from torchstage import SupervisedRunner
        loaders = workload.benchmark_loaders(1)
        model, criterion, optimizer, scheduler = workload.make_parts()
        hook = torch.nn.modules.module.register_module_forward_pre_hook(first_forward)
        SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                                 loaders=loaders, logdir=out + "_logs", num_epochs=workload.NUM_EPOCHS, verbose=False,
                                 overwrite=True, distributed=True)
        stamps["loop_end"] = time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.out)
    sys.path.insert(0, HERE)
    from ddp_overhead import child_env
    from overhead import round_order
    names, phases = ["hand-written", "torchstage"], {}
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(os.path.join(tmp, "pycache"))
        repeat = 0
        while repeat <= args.repeats:
            for name in round_order(names, repeat):
                out = os.path.join(tmp, f"{name}-{repeat}")
                launched = time.time()
                try:
                    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                                    os.path.abspath(__file__), "--worker", name, "--out", out], env=env, check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
                except subprocess.TimeoutExpired:  # the CPython fork deadlock of ddp_overhead.py: not counted
                    print(f"round {repeat}: {name} hung; left out", flush=True)
                    continue
                stamps = {**json.load(open(f"{out}.0.json")), "launched": launched, "done": time.time()}
                if repeat:  # the first round fills the bytecode cache
                    for label, begin, end in PHASES:
                        phases.setdefault((name, label), []).append(stamps[end] - stamps[begin])
            repeat += 1
    print(f"{'phase (rank 0, medians)':>28} " + " ".join(f"{name:>14}" for name in names) + "    difference")
    for label, _, _ in PHASES:
        values = [statistics.median(phases[(name, label)]) for name in names]
        print(f"{label:>28} " + " ".join(f"{v:>12.3f} s" for v in values) + f"  {values[1] - values[0]:+9.3f} s")


if __name__ == "__main__":
    main()
