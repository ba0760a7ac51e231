"""The cost of torch's Flight Recorder (on by default: ``TORCH_FR_BUFFER_SIZE`` 2000) per collective, which the
diagnosis of a failed run reads: the same 2-process gloo runs with the recorder on (torch's default) and off
(``TORCH_FR_BUFFER_SIZE=0``), alternating, each a fresh ``torchrun`` of ``--nproc`` gloo processes (2; 1 measures
the recording alone, without the scheduling noise of two processes sharing cores).

Each run times ``--calls`` all-reduces of 4 floats (the size of torchstage's own agreements), then ``--steps``
DDP steps of a small MLP (the tutorial's scale: one bucket all-reduce per step). Prints the median per call and
per step of each setting and their ratio.
Usage: python scripts/bench/flight_recorder.py [--nproc 2] [--rounds 7] [--calls 2000] [--steps 300]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = {"recorder on (torch's default)": None, "recorder off": "0"}


def worker(calls: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    tensor = torch.ones(4)
    for _ in range(200):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(tensor)
    per_call = (time.perf_counter() - start) / calls
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.rand(32, 10), torch.rand(32, 1)
    for index in range(50 + steps):
        if index == 50:
            dist.barrier()
            start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    per_step = (time.perf_counter() - start) / steps
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"call": per_call, "step": per_step}, f)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.calls, args.steps, args.worker)
    times = {name: {"call": [], "step": []} for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, size in (SETTINGS.items() if round_ % 2 == 0 else reversed(SETTINGS.items())):
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
                env.pop("TORCH_FR_BUFFER_SIZE", None)
                if size is not None:
                    env["TORCH_FR_BUFFER_SIZE"] = size
                out = os.path.join(tmp, "result.json")
                subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
                                os.path.abspath(__file__), "--worker", out, "--calls", str(args.calls),
                                "--steps", str(args.steps)], env=env, check=True, capture_output=True, timeout=600)
                with open(out) as f:
                    result = json.load(f)
                for key in ("call", "step"):
                    times[name][key].append(result[key])
    medians = {name: {key: statistics.median(values) for key, values in t.items()} for name, t in times.items()}
    on, off = medians["recorder on (torch's default)"], medians["recorder off"]
    for name, m in medians.items():
        print(f"{name:32s} all_reduce(4 floats) {m['call'] * 1e6:8.1f} us   DDP step {m['step'] * 1e6:8.1f} us")
    print(f"on/off ratio: per call {on['call'] / off['call']:.3f}, per step {on['step'] / off['step']:.3f} "
          f"(+{(on['call'] - off['call']) * 1e6:.1f} us per call; medians of {args.rounds} alternating runs of "
          f"{args.nproc} process(es))")


if __name__ == "__main__":
    main()
