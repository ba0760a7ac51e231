"""A 4-rank Adam run for the bitwise-resume test: LOGDIR EPOCHS [resume] [find-unused]; rank 0 saves final.pt."""
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import DDP, SupervisedRunner

logdir, epochs, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(512, 10, generator=generator), torch.randint(0, 3, (512,), generator=generator))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
runner = SupervisedRunner().train(
    model=model, criterion=torch.nn.CrossEntropyLoss(), optimizer=optimizer, num_epochs=epochs,
    loaders={"train": DataLoader(data, batch_size=16, shuffle=True), "valid": DataLoader(data, batch_size=64)},
    logdir=logdir, resume="last" if "resume" in flags else None, distributed=True,
    strategy=DDP(find_unused_parameters=True) if "find-unused" in flags else "ddp")
if runner.engine.rank == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(logdir, "final.pt"))
