"""Catalyst 22's SupervisedRunner with ``fp16=True`` on a CPU and ``BatchOverfitCallback(train=3, valid=0.5)``,
and a scheduler: two settings whose results torchstage used to change silently. Moved by changing the import only.

Catalyst 22: ``from catalyst import dl``. On a CPU Catalyst trains ``fp16=True`` in float32, and the overfit
callback repeats each loader's first batches for the loader's whole length; torchstage does both the same way
(tests/catalyst/test_runner_parity.py compares the weights with Catalyst 22.04's).

Run: python scripts/catalyst22/overfit_fp16.py [LOGDIR]
"""
import sys

import torch
from torch import nn

from common import digit_loaders, fingerprint
import torchstage as dl  # was: from catalyst import dl

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-overfit-fp16-22"
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
runner = dl.SupervisedRunner(input_key="features", output_key="logits", target_key="targets", loss_key="loss")
runner.train(
    model=model,
    criterion=nn.CrossEntropyLoss(),
    optimizer=optimizer,
    scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
    loaders=digit_loaders(),
    callbacks=[dl.BatchOverfitCallback(train=3, valid=0.5)],
    num_epochs=3,
    fp16=True,
    logdir=logdir,
    valid_loader="valid",
    valid_metric="loss",
    minimize_valid_metric=True,
    verbose=False,
)
print(f"train_loss={runner.epoch_metrics['train']['loss']:.8f} valid_loss={runner.epoch_metrics['valid']['loss']:.8f} "
      f"lr={optimizer.param_groups[0]['lr']} {fingerprint(model)}")
