"""A small run logging to MLflow in LOGDIR; TORCHSTAGE_NPROC processes; it can SIGKILL itself after an epoch.

Usage: python mlflow_run.py LOGDIR [resume]     env: KILL_AT_EPOCH_END=n (after epoch n's checkpoints)
"""
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchstage import Batch, Callback, MLflowLogger, SupervisedRunner


class KillAtEpochEnd(Callback):
    order = 500  # after checkpoints and loggers

    def on_epoch_end(self, runner):
        if runner.global_epoch_step == int(os.environ.get("KILL_AT_EPOCH_END", 0)):
            runner.file_writer.wait()  # the checkpoints handed over have landed: a kill between writes
            os.kill(os.getpid(), signal.SIGKILL)


def main(logdir, resume=None):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    datasets = {"batch_size": 4, "train": TensorDataset(x[:48], y[:48]), "valid": TensorDataset(x[48:], y[48:])}
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                             datasets=datasets, num_epochs=4, logdir=logdir, resume=resume, log_period=Batch(2), distributed=True,
                             callbacks={"mlflow": MLflowLogger(experiment_name="scaling", run_name="tiny"),
                                        "kill": KillAtEpochEnd()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
