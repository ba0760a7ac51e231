"""A short run with ``train(preflight=True)`` on the processes a launcher started (``distributed=True``: torchstage's
own with TORCHSTAGE_NPROC, or torchrun), each slowed first as the environment asks (see slow_down.py); writes
``LOGDIR/trained-rank<r>`` when training ends.

Usage: python preflight_train.py LOGDIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from slow_down import restored, slow_down_this_process  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from torchstage import SupervisedRunner  # noqa: E402

if __name__ == "__main__":
    if os.environ.get("RANK"):  # a worker (the launching process only starts them)
        slow_down_this_process()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 8, generator=g), torch.randn(128, 1, generator=g)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=16), "valid": DataLoader(TensorDataset(x, y))}
    model = nn.Linear(8, 1)
    runner = SupervisedRunner()
    with restored():  # the check (and the short training after it) slowed; the exit not
        runner.train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     loaders=loaders, num_epochs=1, logdir=sys.argv[1], distributed=True, preflight=True)
    open(os.path.join(sys.argv[1], f"trained-rank{runner.engine.rank}"), "w").close()
