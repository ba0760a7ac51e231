"""A Catalyst 20.12-style distributed script: custom _handle_batch runner started by utils.distributed_cmd_run.

Each rank writes report-rank<N>.json with its final weights and epoch metrics. Usage: catalyst20_ddp.py LOGDIR
"""
import json
import os
import sys

import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import torchstage as dl
import torchstage as utils

logdir = sys.argv[1]


class CustomRunner(dl.Runner):
    def _handle_batch(self, batch):
        x, y = batch
        logits = self.model(x.to(self.device))
        self.input, self.output = {"features": x, "targets": y}, {"logits": logits}
        loss = F.cross_entropy(logits, y)
        self.batch_metrics.update({"loss": loss})
        if self.is_train_loader:
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()


def train():
    utils.set_global_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(6, 2)
    runner = CustomRunner()
    runner.train(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), num_epochs=2,
                 datasets={"batch_size": 16, "train": TensorDataset(x, y), "valid": TensorDataset(x, y)},
                 callbacks=[dl.AccuracyCallback(input_key="targets", output_key="logits", accuracy_args=[1])],
                 fp16=True, main_metric="accuracy01", minimize_metric=False, logdir=logdir)
    rank = runner.distributed_rank
    report = {"rank": rank, "world": runner.engine.world_size, "valid": runner.valid_metrics,
              "weight": runner.unwrapped_model.weight.tolist()}
    with open(os.path.join(logdir, f"report-rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    utils.distributed_cmd_run(train)
