"""Two-process run profiling global train batches 1-3 on every rank. Usage: python profiled_run.py LOGDIR"""
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchstage import ProfilerCallback, SupervisedRunner

if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g)
    model = nn.Linear(6, 1)
    SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             datasets={"batch_size": 4, "train": TensorDataset(x, y), "valid": TensorDataset(x, y)},
                             num_epochs=1, logdir=sys.argv[1], distributed=True,
                             callbacks=[ProfilerCallback(begin_on_batch=1, end_after_batch=4)])
