"""Time to first batch: from ``train()`` called to the first batch's forward, beside a hand-written loop's.

Three ways to run, each a fresh interpreter per measurement, the contenders alternating:
- ``1 process``: the clock starts at ``train()`` (torchstage) or at the loop's first line (hand-written);
- ``torchrun``: 2 processes under ``torchrun --standalone``; the clock starts on rank 0 at ``train()``, or
  before the hand-written loop's ``init_process_group``; the world's forming is inside the measure;
- ``distributed=True``: 2 processes started from a plain ``python`` run; the clock starts at ``train()``
  (which starts the workers) or before the hand-written ``torch.multiprocessing.spawn``.
The stop is the first forward on rank 0 (a forward pre-hook). Both contenders build the model, optimizer and
data before the clock starts; everything from there (process start, the world, checks, the logdir, threads,
the DataLoader's first worker) is inside. The tutorial workload, 1 epoch, one DataLoader worker.
Usage: python scripts/bench/first_batch.py [--repeats 5] [--modes "1 process" torchrun distributed=True]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODES = ("1 process", "torchrun", "distributed=True")
CONTENDERS = ("hand-written", "torchstage")


class FirstForward:
    """A forward pre-hook that writes the wall-clock time of the first forward on rank 0 to ``path``."""

    def __init__(self, path: str):
        self.path, self.done = path, False

    def __call__(self, module, inputs):
        if not self.done and os.environ.get("RANK", "0") == "0":
            stamp(self.path)
        self.done = True


def stamp(path: str) -> None:
    with open(path, "w") as f:
        f.write(repr(time.time()))


def hand_written(out: str, num_workers: int, distributed: bool) -> None:
    """The loop's setup and one epoch: the process group, DDP and a DistributedSampler when ``distributed``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    import workload

    workload.quiet()
    data = TensorDataset(*workload.make_data())
    model, criterion, optimizer, _ = workload.make_parts()
    model.register_forward_pre_hook(FirstForward(out + ".first"))
    if os.environ.get("RANK", "0") == "0" and not os.path.exists(out + ".start"):
        stamp(out + ".start")
    sampler = None
    if distributed:
        dist.init_process_group("gloo")
        model, sampler = DistributedDataParallel(model), DistributedSampler(data, shuffle=False)
    for x, y in DataLoader(data, batch_size=workload.BATCH_SIZE, sampler=sampler, num_workers=num_workers):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if distributed:
        dist.destroy_process_group()


def spawned_rank(local_rank: int, out: str, num_workers: int, port: int) -> None:
    """One rank of the hand-written ``torch.multiprocessing.spawn`` run."""
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    hand_written(out, num_workers, distributed=True)


def torchstage_run(out: str, num_workers: int, distributed: bool) -> None:
    import workload
    from torchstage import SupervisedRunner

    loaders = workload.benchmark_loaders(num_workers)
    model, criterion, optimizer, _ = workload.make_parts()
    model.register_forward_pre_hook(FirstForward(out + ".first"))
    if "TORCHSTAGE_LAUNCHED" not in os.environ and os.environ.get("RANK", "0") == "0":
        stamp(out + ".start")  # not again in the workers that distributed=True starts (they run this script)
    SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, loaders=loaders,
                             logdir=os.path.dirname(out), num_epochs=1, overwrite=True, distributed=distributed)


def worker(contender: str, mode: str, out: str, num_workers: int) -> None:
    if contender == "torchstage":
        return torchstage_run(out, num_workers, distributed=mode != "1 process")
    if mode == "distributed=True":
        import torch.multiprocessing as mp
        from torchstage.launch.local_launcher import free_port
        stamp(out + ".start")
        return mp.spawn(spawned_rank, args=(out, num_workers, free_port()), nprocs=2)
    return hand_written(out, num_workers, distributed=mode == "torchrun")


def measure(contender: str, mode: str, num_workers: int) -> float:
    """Seconds from the clock's start to the first forward of one fresh run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "stamp")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
        env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([ROOT, HERE]))
        script = [os.path.abspath(__file__), "--worker", contender, "--mode", mode, "--out", out,
                  "--num-workers", str(num_workers)]
        if mode == "torchrun":
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *script]
        else:
            command = [sys.executable, *script]
            if mode == "distributed=True":
                env["TORCHSTAGE_NPROC"] = "2"
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out + ".start") as start, open(out + ".first") as first:
            return float(first.read()) - float(start.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.mode, args.out, args.num_workers)
    for mode in args.modes:
        seconds = {name: [] for name in CONTENDERS}
        for repeat in range(args.repeats + 1):
            for name in (CONTENDERS if repeat % 2 else CONTENDERS[::-1]):
                value = measure(name, mode, args.num_workers)
                if repeat:  # the first round warms the page cache
                    seconds[name].append(value)
        hand, ours = (statistics.median(seconds[name]) for name in CONTENDERS)
        print(f"{mode:>17}: hand-written {hand:.3f} s | torchstage {ours:.3f} s | torchstage adds {ours - hand:+.3f} s "
              f"(medians of {args.repeats}; torchstage runs: {' '.join(f'{v:.3f}' for v in seconds['torchstage'])})")


if __name__ == "__main__":
    main()
