"""Catalyst 22's low-level API: a ``dl.IRunner`` that gives its engine, loggers, loaders, model, criterion,
optimizer, scheduler and callbacks through ``get_*`` methods, with ``CheckpointCallback(logdir, loader_key,
metric_key, minimize, topk)``; started with ``runner.run()``. Moved by changing the import only.

Catalyst 22: ``from catalyst import dl``. Linear regression on fixed data, unshuffled, so the run is the same
computation on Catalyst 22.04 and on torchstage (tests/catalyst/test_runner_parity.py compares them). The
checkpoint folder's files are named differently (see docs/migrating-from-catalyst.md).

Run: python scripts/catalyst22/irunner_checkpoint.py [LOGDIR]
"""
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from common import fingerprint
import torchstage as dl  # was: from catalyst import dl

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-irunner-22"


class CustomRunner(dl.IRunner):
    def __init__(self, logdir):
        super().__init__()
        self._logdir = logdir

    def get_engine(self):
        return dl.CPUEngine()

    def get_loggers(self):
        return {"csv": dl.CSVLogger(logdir=self._logdir)}

    @property
    def num_epochs(self):
        return 4

    def get_loaders(self):
        generator = torch.Generator().manual_seed(0)
        features = torch.rand(320, 10, generator=generator)
        targets = features @ torch.linspace(-1, 1, 10) + 0.1 * torch.randn(320, generator=generator)
        return {
            "train": DataLoader(TensorDataset(features[:256], targets[:256, None]), batch_size=32),
            "valid": DataLoader(TensorDataset(features[256:], targets[256:, None]), batch_size=32),
        }

    def get_model(self):
        return torch.nn.Linear(10, 1)

    def get_criterion(self):
        return torch.nn.MSELoss()

    def get_optimizer(self, model):
        return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)

    def get_scheduler(self, optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    def get_callbacks(self):
        return {
            "criterion": dl.CriterionCallback(input_key="logits", target_key="targets", metric_key="loss"),
            "backward": dl.BackwardCallback(metric_key="loss"),
            "optimizer": dl.OptimizerCallback(metric_key="loss"),
            "scheduler": dl.SchedulerCallback(),
            "checkpoint": dl.CheckpointCallback(
                os.path.join(self._logdir, "checkpoints"),
                loader_key="valid", metric_key="loss", minimize=True, topk=2,
            ),
        }

    def handle_batch(self, batch):
        features, targets = batch
        self.batch = {"features": features, "targets": targets, "logits": self.model(features)}


runner = CustomRunner(logdir)
runner.run()
print(f"valid_loss={runner.epoch_metrics['valid']['loss']:.12f} lr={runner.optimizer.param_groups[0]['lr']} "
      f"{fingerprint(runner.model)}")
print("checkpoints=" + ",".join(sorted(os.listdir(os.path.join(logdir, "checkpoints")))))
