"""Training with DeepSpeed ZeRO: the usual Catalyst-style script, with a DeepSpeed config dict as itwinai users have it.

    python scripts/deepspeed_example.py [LOGDIR] [STAGE]     # one process per GPU; on CPU: TORCHSTAGE_NPROC=2
    torchrun --nproc-per-node=2 scripts/deepspeed_example.py [LOGDIR] [STAGE]

Needs ``pip install torchstage[deepspeed]``. The optimizer and scheduler are built before training, as always:
DeepSpeed steps that optimizer (its "client optimizer"), so the scheduler keeps working. torchstage fills in
the micro batch size, accumulation steps, clipping and precision from ``train()``; the config keeps the rest.
"""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import DeepSpeed, SupervisedRunner

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/deepspeed_example"
stage = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ds_config = {  # an itwinai-style DeepSpeed config: what train() owns (batch size, clipping...) is left out
    "zero_optimization": {"stage": stage, "overlap_comm": False, "contiguous_gradients": True},
    "wall_clock_breakdown": False,
}

torch.manual_seed(0)  # every process builds the same data and the same initial model
features = torch.randn(512, 32)
targets = features[:, :4].argmax(dim=1)
loaders = {"train": DataLoader(TensorDataset(features[:448], targets[:448]), batch_size=32, shuffle=True),
           "valid": DataLoader(TensorDataset(features[448:], targets[448:]), batch_size=32)}
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
optimizer = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": 0.1},
                               {"params": [p for p in model.parameters() if p.dim() == 1], "weight_decay": 0.0}],
                              lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

runner = SupervisedRunner()
runner.train(model=model, criterion=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=scheduler,
             loaders=loaders, logdir=logdir, num_epochs=2, distributed=True, strategy=DeepSpeed(config=ds_config),
             grad_clip_norm=1.0, accumulation_steps=2)
# In every worker, after train(): the model holds its whole trained fp32 weights again (also under ZeRO-3).
print(f"rank {runner.engine.rank}/{runner.engine.world_size}: {sum(p.numel() for p in model.parameters()):,} "
      f"parameters, valid loss {runner.epoch_metrics['valid']['loss']:.4f}, lr {optimizer.param_groups[0]['lr']}")
