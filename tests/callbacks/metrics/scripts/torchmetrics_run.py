"""torchmetrics and built-in metrics side by side on 1001 samples; writes what each rank computed.

Usage: python torchmetrics_run.py LOGDIR [resume]; env TORCHSTAGE_NPROC=n runs n gloo processes.
The valid loader runs first, so epoch 1 validates the initial model (the same on any number of processes).
KILL_AT_VALID_BATCH=n: SIGKILL after the n-th valid batch of epoch 2 (mid-validation);
KILL_AT_TRAIN_BATCH=n: SIGKILL after global train batch n (checkpoints every 5 train batches).
Each rank writes LOGDIR/report-rank<R>.json with the epoch metrics of every epoch.
"""
import json
import os
import signal
import sys

import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from torchstage import (AccuracyCallback, AUCCallback, Batch, Callback, Epoch, PrecisionRecallF1Callback,
                        SupervisedRunner, TorchMetricsCallback)

CLASSES = 3


class Probs(Callback):
    """``batch["probs"]``: softmax of the logits (torchmetrics' AUROC applies it to logits itself)."""

    order = 19

    def on_batch_end(self, runner):
        runner.batch["probs"] = runner.batch["logits"].detach().softmax(1)


class Report(Callback):
    order = 500

    def __init__(self, logdir):
        self.logdir, self.history = logdir, []
        self.kill_valid = int(os.environ.get("KILL_AT_VALID_BATCH", 0))
        self.kill_train = int(os.environ.get("KILL_AT_TRAIN_BATCH", 0))

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.kill_train or (
                self.kill_valid and runner.loader_key == "valid" and runner.epoch == 2
                and runner.batch_step == self.kill_valid):
            runner.file_writer.wait()  # the checkpoints handed over have landed: a kill between writes
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, runner):
        self.history.append({k: dict(v) for k, v in runner.epoch_metrics.items()})

    def on_experiment_end(self, runner):
        with open(os.path.join(self.logdir, f"report-rank{runner.engine.rank}.json"), "w") as f:
            json.dump({"history": self.history, "world_size": runner.engine.world_size}, f)


def main(logdir, resume=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1001, 8, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(1001, generator=g) > 0).long() + (x[:, 1] > 0.7).long()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, CLASSES)
    collection = torchmetrics.MetricCollection({
        "tm_accuracy": torchmetrics.classification.MulticlassAccuracy(CLASSES, average="micro"),
        "tm_f1": torchmetrics.classification.MulticlassF1Score(CLASSES, average="macro")})
    # probabilities: torchmetrics applies softmax per batch only when a value is outside [0, 1], which a
    # one-sample last batch of logits may not have
    auroc = torchmetrics.classification.MulticlassAUROC(CLASSES, average="macro", thresholds=None)
    runner = SupervisedRunner()
    runner.train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                 loaders={"valid": DataLoader(TensorDataset(x, y), batch_size=50),  # first: epoch 1 sees the
                          "train": DataLoader(TensorDataset(x[:700], y[:700]), batch_size=32, shuffle=True)},
                 callbacks={"tm": TorchMetricsCallback(collection), "probs": Probs(),
                            "tm_auroc": TorchMetricsCallback(auroc, name="tm_auroc", input_key="probs"),
                            "tm_train": TorchMetricsCallback(
                                torchmetrics.classification.MulticlassAccuracy(CLASSES, average="micro"),
                                name="tm_train_accuracy", loaders="train"),
                            "accuracy": AccuracyCallback(), "auc": AUCCallback(input_key="probs"),
                            "f1": PrecisionRecallF1Callback(num_classes=CLASSES, average="macro"),
                            "report": Report(logdir)},
                 num_epochs=3, logdir=logdir, resume=resume, valid_metric="tm_f1", minimize_valid_metric=False,
                 checkpoint_period=(Batch(5), Epoch(1)), seed=1, distributed=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
