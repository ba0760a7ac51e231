"""See a run: MLflow tracking, the throughput/memory monitor, the profiler and the model summary.

Run:  python scripts/observability.py LOGDIR [--nproc N] [--epochs E]
Then: mlflow ui --backend-store-uri sqlite:///LOGDIR/mlflow.db     (runs, params, curves, artifacts)
      tensorboard --logdir LOGDIR                                  (scalars, hparams, profiler traces)
      torchstage report LOGDIR-1 LOGDIR-2 -o scaling               (runs at several world sizes)
"""
import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchstage import Batch, MLflowLogger, ProfilerCallback, SupervisedRunner


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--nproc", type=int, default=1, help="processes (CPU: gloo; GPUs: one per device)")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per process, so world sizes compare fairly on a CPU
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    y = (x[:, :8].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    SupervisedRunner().train(
        model=model, criterion=nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        datasets={"batch_size": 64, "train": TensorDataset(x[:3584], y[:3584]),
                  "valid": TensorDataset(x[3584:], y[3584:])},
        num_epochs=args.epochs, logdir=args.logdir, overwrite=True,
        distributed=args.nproc > 1, nprocs=args.nproc if args.nproc > 1 else None,
        monitor=True,                 # samples/s, data wait, peak memory, FLOPs (and MFU on known GPUs)
        log_period=Batch(10),         # train batch scalars every 10 batches, to every logger
        callbacks={"mlflow": MLflowLogger(experiment_name="observability", run_name=f"ws{args.nproc}"),
                   "profiler": ProfilerCallback(begin_on_batch=5, end_after_batch=10)})


if __name__ == "__main__":
    main()
