"""A Catalyst 22-style distributed script: a runner with its own loader hooks, BackwardCallback and a step-only
OptimizerCallback with accumulation, started with Catalyst 22's ``train(ddp=True)``.

Each rank writes report-rank<N>.json with its final weights and what its hooks counted. Usage: catalyst22_ddp.py LOGDIR
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl

logdir = sys.argv[1]


class CustomRunner(dl.Runner):
    def on_loader_start(self, runner):
        super().on_loader_start(runner)
        self.samples = 0

    def handle_batch(self, batch):
        x, y = batch
        self.batch = {"features": x, "targets": y, "logits": self.model(x)}
        self.samples += len(x)

    def on_loader_end(self, runner):
        self.loader_metrics["samples_here"] = float(self.samples)
        super().on_loader_end(runner)


torch.manual_seed(0)
x = torch.randn(256, 6)
y = (x[:, 0] > 0).long()
dataset = TensorDataset(x, y)
loaders = {"train": DataLoader(dataset, batch_size=16), "valid": DataLoader(dataset, batch_size=16)}
model = torch.nn.Linear(6, 2)
initial = model.weight.detach().clone()
runner = CustomRunner()
runner.train(model=model, criterion=torch.nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
             loaders=loaders, num_epochs=2, ddp=True, logdir=logdir, valid_loader="valid", valid_metric="loss",
             minimize_valid_metric=True,
             callbacks=[dl.CriterionCallback(input_key="logits", target_key="targets", metric_key="loss"),
                        dl.BackwardCallback(metric_key="loss"),
                        dl.OptimizerCallback(metric_key="loss", accumulation_steps=2)])
rank = runner.engine.rank
report = {"world": runner.engine.world_size, "weight": runner.model.weight.tolist(),
          "moved": not torch.equal(runner.model.weight.detach(), initial),
          "samples_here": runner.epoch_metrics["valid"]["samples_here"], "batch_steps": runner.loop.run_batch_step}
with open(os.path.join(logdir, f"report-rank{rank}.json"), "w") as f:
    json.dump(report, f)
