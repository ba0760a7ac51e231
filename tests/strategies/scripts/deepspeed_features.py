"""The tiny resume run on 2 gloo ranks under DeepSpeed, with one set of features: python deepspeed_features.py LOGDIR
CASE. CASE "amp": ZeRO-3, bf16, monitor=True, early stopping, load_best_on_end; "check": ZeRO-2, check=True,
the optimizer built from the DeepSpeed config and offloaded; "nan": ZeRO-2 with a NaN train sample and
checkpoints every 2 batches; "disagree": a config whose gradient_accumulation_steps train() contradicts.
Rank 0 writes LOGDIR/report.json (the epochs started, the optimizer's type, the weights' dtype in the run and
after train(), their number and sum after train())."""
import json
import os
import sys

import torch

from tests.resume_helpers import tiny_train_kwargs
from torchstage import Batch, Callback, DeepSpeed, EarlyStoppingCallback, SupervisedRunner


class Report(Callback):
    order = 500

    def __init__(self, logdir):
        self.logdir, self.epochs = logdir, []

    def on_epoch_start(self, runner):
        self.epochs.append(runner.global_epoch_step)

    def on_experiment_end(self, runner):
        self.optimizer = type(runner.optimizer).__name__
        self.dtype_in_run = str(next(runner.unwrapped_model.parameters()).dtype)


if __name__ == "__main__":
    logdir, case = sys.argv[1], sys.argv[2]
    report = Report(logdir)
    kwargs = tiny_train_kwargs(logdir, num_epochs=4, distributed=True, nprocs=2, callbacks=[report])
    if case == "amp":  # the valid loss stops improving after epoch 2 of 4 with patience 1 at this learning rate
        kwargs.update(strategy=DeepSpeed(stage=3), amp="bf16", monitor=True, load_best_on_end=True,
                      callbacks=[report, EarlyStoppingCallback(patience=1, min_delta=0.05)])
    elif case == "check":
        kwargs.update(strategy=DeepSpeed(stage=2, config={"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}},
                                         offload_optimizer=True), optimizer=None, check=True)
    elif case == "nan":  # one train sample is NaN: its batch's loss too
        kwargs["loaders"]["train"].dataset.tensors[0][13] = float("nan")
        kwargs.update(strategy=DeepSpeed(stage=2), checkpoint_period=Batch(2))
    else:
        kwargs.update(strategy=DeepSpeed(config={"gradient_accumulation_steps": 4}), accumulation_steps=2)
    runner = SupervisedRunner()
    runner.train(**kwargs)
    if int(os.environ.get("RANK", 0)) == 0:
        weights = torch.cat([p.detach().float().flatten() for p in kwargs["model"].parameters()])
        with open(os.path.join(logdir, "report.json"), "w") as f:
            json.dump({"epochs": report.epochs, "optimizer": report.optimizer, "dtype_in_run": report.dtype_in_run,
                       "dtype": str(next(kwargs["model"].parameters()).dtype), "numel": weights.numel(),
                       "weights": weights.sum().item()}, f)
