"""Train a small classifier with distributed=True; each rank writes what it saw to rank-N.json in the cwd."""
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, SupervisedRunner


class Report(Callback):
    def on_experiment_end(self, runner):
        engine = runner.engine
        info = {"rank": engine.rank, "world_size": engine.world_size, "local_rank": engine.local_rank,
                "device": str(engine.device), "backend": dist.get_backend() if dist.is_initialized() else None,
                "valid_loss": runner.epoch_metrics["valid"]["loss"]}
        with open(f"rank-{engine.rank}.json", "w") as f:
            json.dump(info, f)


def main(logdir):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, 32, generator=g), torch.randint(0, 10, (1000,), generator=g)
    data = TensorDataset(x, y)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    SupervisedRunner().train(
        model=model, criterion=nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loaders={"train": DataLoader(data, batch_size=50, shuffle=True, pin_memory=True),
                 "valid": DataLoader(data, batch_size=50, pin_memory=True)},
        logdir=logdir, num_epochs=2, callbacks=[Report()], distributed=True)


if __name__ == "__main__":
    main(sys.argv[1])
