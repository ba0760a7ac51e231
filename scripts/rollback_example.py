"""A run that rolls back past bad batches: one sample has NaN features, another is 10^4 times too large.

Usage: python scripts/rollback_example.py [LOGDIR]   (about 10 s on a CPU)
Every few batches the losses are read (no host sync per batch); at a NaN loss or a loss spike every rank goes
back to its last clean check and on without the bad batch, logging which loss, which batch, which samples and
back to which step. The weights end finite and the run exits 0.
"""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import LossSpike, NonFiniteLossCallback, SupervisedRunner

torch.manual_seed(0)
x = torch.randn(256, 8)
y = x @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
x[17] = float("nan")  # a corrupt record
x[200] *= 1e4  # a record in the wrong units
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
runner = SupervisedRunner()
runner.train(
    model=model, criterion=nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
    loaders={"train": DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
             "valid": DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16)},
    num_epochs=3, logdir=sys.argv[1] if len(sys.argv) > 1 else "logs/rollback_example",
    callbacks={"nonfinite": NonFiniteLossCallback(mode="rollback", check_every=4,
                                                  spike=LossSpike(factor=10, window=20, warmup=4))},
)
skipped = runner.callbacks["rollback"].skipped
print(f"rolled back {len(skipped)} times; left out:",
      "; ".join(f"epoch {e['epoch']} batch {e['ordinal']} (samples {e['samples'][0].tolist()})" for e in skipped))
