"""The tutorial's regression, ready for SLURM: the same script runs alone, under srun and under sbatch.

    python scripts/slurm_train.py LOGDIR --check                         # smoke run: a few batches, 2 epochs
    python scripts/slurm_train.py LOGDIR                                 # one process
    TORCHSTAGE_NPROC=2 python scripts/slurm_train.py LOGDIR              # two local processes (CPU)
    srun -N 2 python scripts/slurm_train.py LOGDIR                       # a launcher per node: a process per GPU
                                                                         # (CPU: TORCHSTAGE_NPROC per node)
    srun -N 2 --ntasks-per-node=2 python scripts/slurm_train.py LOGDIR   # one task per process

Inside an sbatch job it also survives preemption: on SIGUSR1/SIGTERM it writes ``last.pth``, requeues
the job, and the requeued job resumes from there (``train(requeue=None)``, the default).
The batch per process is 32 / world size and the data is not shuffled, so every world size steps on
the same 32 samples at a time and trains the same model as one process would.
"""
import sys

import torch
from torch.utils.data import TensorDataset

from torchstage import SupervisedRunner
from torchstage.launch.resolve import resolve_world


def main(logdir, callbacks=(), num_epochs=3, check=False):
    torch.manual_seed(0)
    X = torch.rand(1000, 10)
    y = X @ torch.linspace(-1, 1, 10) + 0.1 * torch.rand(1000)
    dataset = TensorDataset(X, y.view(-1, 1))
    world_size = resolve_world().world_size  # processes this run will have
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = SupervisedRunner()
    runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
                 datasets={"batch_size": 32 // world_size, "shuffle": False, "train": dataset, "valid": dataset},
                 callbacks=list(callbacks), logdir=logdir, num_epochs=num_epochs, seed=0, check=check,
                 distributed=True)  # join srun/torchrun's world, or start TORCHSTAGE_NPROC/one-per-GPU processes
    return runner


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--check"]
    main(args[0] if args else "./logs/slurm_train", check="--check" in sys.argv[1:])
