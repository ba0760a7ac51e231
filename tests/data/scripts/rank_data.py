"""The Catalyst tutorial's way of building data: at module level, with no seed (``SEEDED=1``: after a fixed seed),
before ``import torchstage`` (``AFTER_IMPORT=1``: after it, as the refusal's advice says).

Usage: python rank_data.py LOGDIR (TORCHSTAGE_NPROC=2: torchstage starts the ranks), or under torchrun. Each rank
prints ``checksum <rank> <sum of X>`` and, after training, ``valid <rank> <the run's valid loss> <the final model's
MSE on this rank's X, y>`` (9 significant digits: the two sum in different orders, so they agree to float32's
rounding, not bit for bit).
"""
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("AFTER_IMPORT"):
    import torchstage  # noqa: F401 (under a launcher, importing torchstage seeds every rank alike)
if os.environ.get("SEEDED"):
    torch.manual_seed(0)
X, y = torch.rand(64, 4), torch.rand(64, 1)

from torchstage import SupervisedRunner  # noqa: E402 (the data is made first, as the tutorial's users may)

rank = int(os.environ.get("RANK", 0))


def say(line):
    """One write per line: under torchrun the ranks share stdout, and print's separate newline may interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


say(f"checksum {rank} {X.sum().item():.6f}")
loader = DataLoader(TensorDataset(X, y), batch_size=8)
model = torch.nn.Linear(4, 1)
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
             loaders={"train": loader, "valid": loader}, logdir=sys.argv[1], num_epochs=2,
             distributed=True if os.environ.get("TORCHSTAGE_NPROC") else None, overwrite=True)
with torch.no_grad():
    mse = torch.nn.functional.mse_loss(model(X), y).item()
say(f"valid {rank} {runner.epoch_metrics['valid']['loss']:.9g} {mse:.9g}")
