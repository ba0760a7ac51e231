"""Sharding a model with FSDP2: the usual Catalyst-style script, with ``strategy="fsdp"``.

    python scripts/fsdp_example.py [LOGDIR]     # one process per GPU; on CPU: TORCHSTAGE_NPROC=2
    torchrun --nproc-per-node=2 scripts/fsdp_example.py [LOGDIR]

The optimizer and scheduler are built before training, as always: torchstage rebinds them to the
sharded parameters. Each ``Block`` is its own FSDP unit (``FSDP(modules=Block)``); the default policy
(``strategy="fsdp"``) would take every child holding at least 100,000 parameters.
"""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import FSDP, SupervisedRunner


class Block(nn.Module):
    """A residual MLP block: about 1M parameters at width 512."""

    def __init__(self, width: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, inputs=32, width=512, depth=4, classes=4):
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/fsdp_example"
torch.manual_seed(0)  # every process builds the same data and the same initial model
features = torch.randn(512, 32)
targets = (features[:, :4].argmax(dim=1))
loaders = {"train": DataLoader(TensorDataset(features[:448], targets[:448]), batch_size=32, shuffle=True),
           "valid": DataLoader(TensorDataset(features[448:], targets[448:]), batch_size=32)}
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2)

runner = SupervisedRunner()
runner.train(model=model, criterion=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=scheduler,
             loaders=loaders, logdir=logdir, num_epochs=2, distributed=True, strategy=FSDP(modules=Block),
             grad_clip_norm=1.0)
# In every worker: the parameters stay sharded (DTensors); each rank holds its part of them.
local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in runner.model.parameters())
total = sum(p.numel() for p in runner.model.parameters())
print(f"rank {runner.engine.rank}/{runner.engine.world_size} holds {local:,} of {total:,} parameters; "
      f"valid loss {runner.epoch_metrics['valid']['loss']:.4f}")
