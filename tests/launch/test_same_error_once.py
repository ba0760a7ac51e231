"""An error every rank raises identically is printed once by the launcher: the first rank's traceback and the
summary, the other ranks named as having raised the same, never listed again as "consequences"."""
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, script_env

SCRIPT = """
from torchstage import distributed_cmd_run

def fn():
    import torch.distributed as dist
    dist.barrier()  # every rank in the world first: one leaving while another still joins is another error (a reset)
    raise ValueError("the same " + "mistake on every rank: replicate x shard = 6 ranks, but the world has 4 processes")

distributed_cmd_run(fn, distributed=True, nprocs=4)
"""


@pytest.mark.distributed
def test_an_error_every_rank_raises_is_printed_once(tmp_path):
    (tmp_path / "same_error.py").write_text(SCRIPT)  # not on the command line the launcher echoes
    done = script_server.run([sys.executable, str(tmp_path / "same_error.py")], env=script_env(), cwd=ROOT, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert out.count("Traceback (most recent call last):") == 1, out[-3000:]
    assert "consequences" not in out, out[-3000:]
    assert out.count("the same mistake on every rank") == 2, out[-3000:]  # its traceback, the summary
    summary = next(line for line in out.splitlines() if "stopped the other ranks." in line)
    assert "The first error, on rank " in summary and " raised the same error" in summary, summary
