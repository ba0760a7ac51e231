"""Configuration errors that need no world are refused in the launching process, before any rank starts: a mesh that
does not divide the world torchstage is about to start, a misspelt strategy name (with the closest one)."""
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, script_env

SCRIPT = """
import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchstage import HSDP, SupervisedRunner
strategy = HSDP(replicate=3, shard=2) if sys.argv[1] == "mesh" else sys.argv[1]
data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
model = nn.Linear(4, 1)
SupervisedRunner().train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         loaders={"train": DataLoader(data, batch_size=4), "valid": DataLoader(data, batch_size=4)},
                         distributed=True, strategy=strategy)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy, message", [
    ("mesh", "strategy=HSDP(replicate=3, shard=2): replicate x shard = 3 x 2 = 6 ranks, but the world has 4 "
             "processes; the product must equal the world size"),
    ("fdsp", "strategy must be 'ddp', 'fsdp', 'hsdp' or 'deepspeed', got 'fdsp'; did you mean 'fsdp'?"),
])
def test_refused_in_the_launching_process_before_any_rank_starts(tmp_path, strategy, message):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    result = script_server.run([sys.executable, str(script), strategy], env=script_env(4), cwd=ROOT, timeout=100)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and message in output, output[-3000:]
    assert "starting 4 processes" not in output and "[rank" not in output  # no worker was started
    assert output.count(message) == 1
