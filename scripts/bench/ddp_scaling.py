"""DDP scaling: training samples/s of one process vs two (gloo on CPU; NCCL too when 2+ GPUs are visible).

Each measurement is a real ``train(distributed=True)`` run of this script in child processes; the first
epoch is a warm-up, the others are timed on the train loader only (rank 0 reports the global rate).
Usage: python scripts/bench/ddp_scaling.py [--epochs 3]   (about 40 s on a 2-core CPU)
Batch size is per process, so two processes take twice the samples per step. CPU runs use one
OpenMP thread per process, so the ratio shows process scaling (ideal: 2 with 2+ free cores).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES, FEATURES, HIDDEN, BATCH_SIZE = 16_384, 64, 256, 64


def train_and_report(epochs: int, report: str) -> None:
    """The measured run (inside each worker): an MLP on random regression data."""
    from torchstage import Callback, SupervisedRunner

    class Throughput(Callback):
        def on_loader_start(self, runner):
            self.start = time.perf_counter()

        def on_loader_end(self, runner):
            if runner.is_train_loader and runner.epoch > 1:  # epoch 1 warms up
                self.seconds = getattr(self, "seconds", 0.0) + time.perf_counter() - self.start
                self.samples = getattr(self, "samples", 0) + runner.loader_sample_step * runner.engine.world_size

        def on_experiment_end(self, runner):
            if runner.engine.is_main:
                with open(report, "w") as f:
                    json.dump({"samples_per_s": self.samples / self.seconds, "world_size": runner.engine.world_size,
                               "device": str(runner.engine.device)}, f)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g), torch.randn(SAMPLES, 1, generator=g))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                             loaders={"train": DataLoader(data, batch_size=BATCH_SIZE, shuffle=True)},
                             valid_loader="train", num_epochs=epochs, callbacks=[Throughput()], distributed=True)


def measure(nprocs: int, epochs: int, gpu: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(TORCHSTAGE_NPROC=str(nprocs), PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]))
        if not gpu:  # one thread per process: the ratio shows process scaling, not OpenMP threading
            env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", report, "--epochs", str(epochs)],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        with open(report) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run, the first one a warm-up")
    parser.add_argument("--worker", metavar="REPORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return train_and_report(args.epochs, args.worker)
    kinds = [("cpu", False)] + ([("gpu", True)] if torch.cuda.device_count() >= 2 else [])
    print(f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-1, {SAMPLES} samples, batch {BATCH_SIZE} per process, "
          f"{args.epochs - 1} timed epoch(s); CPU cores: {os.cpu_count()}")
    for kind, gpu in kinds:
        one, two = measure(1, args.epochs, gpu), measure(2, args.epochs, gpu)
        print(f"{kind}: 1 process {one['samples_per_s']:,.0f} samples/s | 2 processes "
              f"{two['samples_per_s']:,.0f} samples/s | ratio {two['samples_per_s'] / one['samples_per_s']:.2f}")


if __name__ == "__main__":
    main()
