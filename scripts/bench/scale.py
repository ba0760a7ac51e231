"""Time to form the world and to reach the first batch at 1, 2, 4, ... 32 local gloo processes: torchstage's
``distributed=True`` beside a hand-written ``torch.multiprocessing.spawn`` + DDP, alternating, fresh processes.

Three stamps per run: the clock starts in the launching process before ``train()`` (or ``mp.spawn``); "world" is
when the last rank has its process group (torchstage: ``on_experiment_start``, after its checks and the model's
wrapping; hand-written: after ``init_process_group`` and DDP's wrapping); "first batch" is when the last rank
starts its first forward. The tutorial workload, data loaders without worker processes (32 ranks on 2 cores).
Usage: python scripts/bench/scale.py [--sizes 1 2 4 8 16 32] [--repeats 2]
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONTENDERS = ("hand-written", "torchstage")


def stamp(path: str) -> None:
    with open(f"{path}.{os.getpid()}", "w") as f:
        f.write(repr(time.time()))


class FirstForward:
    """A forward pre-hook stamping this rank's first forward."""

    def __init__(self, out: str):
        self.out, self.done = out, False

    def __call__(self, module, inputs):
        if not self.done:
            stamp(self.out + ".first")
        self.done = True


def hand_written_rank(rank: int, size: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    import workload

    workload.quiet()
    data = TensorDataset(*workload.make_data())
    model, criterion, optimizer, _ = workload.make_parts()
    model.register_forward_pre_hook(FirstForward(out))
    sampler = None
    if size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
        model, sampler = DistributedDataParallel(model), DistributedSampler(data, shuffle=False)
    stamp(out + ".world")
    for x, y in DataLoader(data, batch_size=workload.BATCH_SIZE, sampler=sampler):
        criterion(model(x).squeeze(1), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if size > 1:
        # DDP's reducer holds the group: freed after the group is destroyed, gloo's threads are joined while this
        # thread holds the GIL that one of them waits for (a hang at exit, seen with 4 ranks)
        del model
        dist.destroy_process_group()


def torchstage_run(size: int, out: str) -> None:
    import workload
    from torchstage import Callback, SupervisedRunner

    class World(Callback):
        def on_experiment_start(self, runner):
            stamp(out + ".world")

    loaders = workload.benchmark_loaders(0)
    model, criterion, optimizer, _ = workload.make_parts()
    model.register_forward_pre_hook(FirstForward(out))
    if "TORCHSTAGE_LAUNCHED" not in os.environ:
        stamp(out + ".start")
    SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, loaders={"train": loaders["train"]}, valid_loader="train",
                             logdir=os.path.dirname(out), num_epochs=1, overwrite=True, distributed=size > 1,
                             callbacks={"world": World()}, hang_timeout=600)


def worker(contender: str, size: int, out: str) -> None:
    if contender == "torchstage":
        return torchstage_run(size, out)
    import torch.multiprocessing as mp
    from torchstage.launch.local_launcher import free_port
    stamp(out + ".start")
    if size == 1:
        return hand_written_rank(0, 1, 0, out)
    mp.spawn(hand_written_rank, args=(size, free_port(), out), nprocs=size)


def measure(contender: str, size: int) -> tuple:
    """(seconds to the world, seconds to the first batch) of one fresh run: the last rank's stamps."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "stamp")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
        env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([ROOT, HERE]),
                   TORCHSTAGE_NPROC=str(size))
        subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", contender, "--size", str(size),
                        "--out", out], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=600)

        def last(kind):
            stamps = [float(open(path).read()) for path in glob.glob(f"{out}.{kind}.*")]
            assert len(stamps) == (1 if kind == "start" else size), (kind, len(stamps))
            return max(stamps)
        start = last("start")
        return last("world") - start, last("first") - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.size, args.out)
    print(f"{'processes':>9}  {'contender':12}  {'world (s)':>9}  {'first batch (s)':>15}")
    for size in args.sizes:
        times = {name: [] for name in CONTENDERS}
        for repeat in range(args.repeats):
            for name in (CONTENDERS if repeat % 2 else CONTENDERS[::-1]):
                times[name].append(measure(name, size))
        for name in CONTENDERS:
            world = statistics.median(t[0] for t in times[name])
            first = statistics.median(t[1] for t in times[name])
            print(f"{size:9d}  {name:12}  {world:9.2f}  {first:15.2f}", flush=True)


if __name__ == "__main__":
    main()
