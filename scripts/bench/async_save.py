"""How long a checkpoint blocks the training thread, for a model of about 300 MB (864 MiB with Adam): sync, async.

``sync`` does the whole save in the training thread, as a loop calling ``torch.save`` would: serialize, write
and fsync ``last.pth`` and ``best.pth``. ``async`` is torchstage's save (``Strategy.save_checkpoint`` with a
``FileWriter``): the training thread copies the state to host memory (the snapshot) and hands it over; the
writer's thread serializes it into the files. Between two saves the training thread works (matrix products)
for ``--gap`` seconds, as epochs do; the async blocked time also counts any wait for the previous save to land
(no two saves overlap), shown apart. Per save: the training thread's blocked seconds; medians over ``--saves``
saves each, alternating. The peak extra host memory of each mode is measured apart, in a fresh process per mode (the
highest resident memory of 3 saves, above what the process held before its first): sync holds the serialized
bytes, async the snapshot, and never two (the next save waits for the previous one to land).
Usage: python scripts/bench/async_save.py [--layers 18] [--saves 7] [--gap 10]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402

import torch  # noqa: E402

from torchstage.files.atomic import write_atomic_copies  # noqa: E402
from torchstage.files.checkpoint_file import serialize  # noqa: E402
from torchstage.files.writer import FileWriter  # noqa: E402
from torchstage.distributed.engine import Engine  # noqa: E402
from torchstage.strategies.single import SingleDevice  # noqa: E402

WIDTH = 2048


def state_of(model, optimizer) -> dict:
    return {"format": "torchstage/1", "models": {"model": model.state_dict()},
            "optimizers": {"optimizer": optimizer.state_dict()}, "loop": {"epoch": 1}}


def save(name: str, state: dict, paths: list, engine, strategy, writer) -> float:
    """One save; returns the seconds of it spent waiting for the previous save to land (async only)."""
    if name == "sync":
        write_atomic_copies(paths, serialize(state))
        return 0.0
    start = time.perf_counter()
    writer.wait_for_room()  # as save_checkpoint does first: timed apart from the snapshot
    waited = time.perf_counter() - start
    strategy.save_checkpoint(state, paths, writer)
    return waited


def peak_extra_memory(name: str, model, optimizer, engine, strategy, writer) -> int:
    """The highest resident memory of 3 back-to-back saves (each waiting for the previous, as the next
    checkpoint of a run does), above what the process held before them, in bytes. The kernel's peak (VmHWM)
    is reset first, so that building the model and Adam's first step do not count."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        paths = [os.path.join(folder, "best.pth"), os.path.join(folder, "last.pth")]
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set size to the current one
        before = status_bytes("VmRSS")
        for _ in range(3):
            save(name, state_of(model, optimizer), paths, engine, strategy, writer)
        writer.close()
    return max(0, status_bytes("VmHWM") - before)


def status_bytes(field: str) -> int:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def work(seconds: float, x, model) -> None:
    """Training-like work in this thread: forward passes until ``seconds`` have passed."""
    end = time.perf_counter() + seconds
    with torch.no_grad():
        while time.perf_counter() < end:
            model(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--saves", type=int, default=7)
    parser.add_argument("--gap", type=float, default=10.0)
    parser.add_argument("--memory", choices=("sync", "async"), help=argparse.SUPPRESS)  # one mode's memory, alone
    args = parser.parse_args()
    workload.quiet(threads=torch.get_num_threads())
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(args.layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(64, WIDTH)
    model(x).sum().backward()
    optimizer.step()  # Adam's moments exist: the state is weights plus two moments
    engine, strategy, writer = Engine(device="cpu"), SingleDevice(), FileWriter()
    strategy.connect(engine)  # as a run does
    if args.memory:
        print(peak_extra_memory(args.memory, model, optimizer, engine, strategy, writer))
        return
    size = sum(t.numel() * t.element_size() for t in [*model.state_dict().values(),
                                                       *(v for s in optimizer.state.values() for v in s.values())])
    blocked, waited = {"sync": [], "async": []}, {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        paths = [os.path.join(folder, "best.pth"), os.path.join(folder, "last.pth")]
        for index in range(2 * args.saves):
            name = ("sync", "async")[index % 2] if (index // 2) % 2 == 0 else ("async", "sync")[index % 2]
            work(args.gap, x, model)  # the previous async save lands meanwhile, as during an epoch
            start = time.perf_counter()
            waited[name].append(save(name, state_of(model, optimizer), paths, engine, strategy, writer))
            blocked[name].append(time.perf_counter() - start)
        writer.close()
    memory = {name: int(subprocess.run([sys.executable, __file__, "--memory", name, "--layers", str(args.layers)],
                                       capture_output=True, text=True, check=True).stdout.split()[-1])
              for name in blocked}
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.layers} x Linear({WIDTH}, {WIDTH}): {params / 1e6:.1f} M parameters ({params * 4 / 2**20:.0f} MiB), "
          f"Adam; state {size / 2**20:.0f} MiB, written as last.pth and best.pth; {args.saves} saves each, "
          f"{args.gap:g} s of work between saves, {torch.get_num_threads()} torch threads")
    sync = statistics.median(blocked["sync"])
    for name in blocked:
        seconds = statistics.median(blocked[name])
        print(f"{name:>6}: training blocked {seconds:7.3f} s a save (median; min {min(blocked[name]):.3f}, max "
              f"{max(blocked[name]):.3f}; waiting for the previous save {statistics.median(waited[name]):.3f}) "
              f"= {seconds / sync:6.1%} of sync; peak extra host memory "
              f"{memory[name] / 2**20:5.0f} MiB ({memory[name] / size:.2f} x the state)")


if __name__ == "__main__":
    main()
