"""``strategy="hsdp"`` on one process says that HSDP is dropped and why; its advice (start several processes) followed,
the run shards and says nothing of the kind."""
import logging
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests import script_server
from tests.resume_helpers import ROOT, child_env
from torchstage import SupervisedRunner

SCRIPT = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
from torchstage import SupervisedRunner
x, y = torch.randn(16, 4), torch.randn(16, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=4)
model = torch.nn.Linear(4, 1)
SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         loaders={"train": loader, "valid": loader}, strategy="hsdp", distributed=True, nprocs=2)
"""
SAID = "strategy='hsdp' on one process: HSDP is dropped"


def test_hsdp_on_one_process_says_it_is_dropped_and_why(caplog):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = torch.nn.Linear(4, 1)
    caplog.set_level(logging.WARNING, logger="torchstage")
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders={"train": loader, "valid": loader},
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1), strategy="hsdp")
    assert caplog.text.count(SAID) == 1, caplog.text
    assert ("HSDP shards the model within each node and replicates it across nodes, and one process has no other "
            "rank to shard or replicate with: this run trains as on a single device") in caplog.text
    assert "start several processes (train(..., distributed=True, nprocs=N), torchrun or srun)" in caplog.text


@pytest.mark.distributed
def test_following_the_advice_shards_and_says_nothing_of_it():
    done = script_server.run([sys.executable, "-c", SCRIPT], env=child_env(), cwd=ROOT, timeout=300, merge=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert SAID not in done.stdout and "epoch 1/1" in done.stdout
