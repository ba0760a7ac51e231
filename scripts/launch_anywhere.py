"""The tutorial regression with ``distributed=None``: the same script under every launcher.

    python scripts/launch_anywhere.py LOGDIR                         # one process
    mpirun -np 4 python scripts/launch_anywhere.py LOGDIR            # Open MPI (mpiexec: MPICH, PALS)
    srun -N 2 --ntasks-per-node=2 python scripts/launch_anywhere.py LOGDIR
    srun -N 2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint FIRST_NODE:PORT scripts/launch_anywhere.py LOGDIR

Each rank writes LOGDIR/report-rank<R>.json: its rank and world size as torch.distributed saw them, the
launcher that decided (``resolve_world().source``) and the last epoch's metrics. The batch per process is
32 / world size, unshuffled, so every world size trains the model one process trains.
"""
import json
import os
import sys

import torch
from torch.utils.data import TensorDataset

from torchstage import Callback, CallbackOrder, SupervisedRunner
from torchstage.launch.resolve import resolve_world


class SeenWorld(Callback):
    """Records the rank and world size of the process group this rank trains in."""

    order = CallbackOrder.External
    seen = None

    def on_experiment_start(self, runner):
        import torch.distributed as dist
        self.seen = ((dist.get_rank(), dist.get_world_size()) if dist.is_initialized()
                     else (runner.engine.rank, runner.engine.world_size))


def main(logdir):
    world = resolve_world()
    torch.manual_seed(0)
    X = torch.rand(1000, 10)
    y = X @ torch.linspace(-1, 1, 10) + 0.1 * torch.rand(1000)
    dataset = TensorDataset(X, y.view(-1, 1))
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    seen = SeenWorld()
    runner = SupervisedRunner()
    runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer, callbacks=[seen],
                 datasets={"batch_size": 32 // world.world_size, "shuffle": False, "train": dataset,
                           "valid": dataset}, logdir=logdir, num_epochs=2, seed=0, distributed=None)
    report = {"rank": seen.seen[0], "world_size": seen.seen[1], "source": world.source, "pid": os.getpid(),
              "node_rank": world.node_rank, "master": f"{world.master_addr}:{world.master_port}",
              "metrics": runner.epoch_metrics}
    with open(os.path.join(logdir, f"report-rank{seen.seen[0]}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
