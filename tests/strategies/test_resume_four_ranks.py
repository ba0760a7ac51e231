"""Resume with 4 DDP ranks is bitwise with strategy=DDP(find_unused_parameters=True) (see docs/checkpoints.md)."""
from pathlib import Path
import pytest
import torch

from tests.helpers import run

pytestmark = pytest.mark.distributed

SCRIPTS = Path(__file__).resolve().parent / "scripts"

SCRIPT = SCRIPTS / "resume4.py"


def final_tensors(logdir):
    state = torch.load(logdir / "final.pt", weights_only=True)
    return [*state["model"].values(), *(v for s in state["optimizer"]["state"].values() for v in s.values())]


@pytest.mark.timeout(900)
def test_four_ranks_resume_bitwise_when_ddp_keeps_its_bucket_layout(tmp_path):
    # DDP rebuilds its gradient buckets once, after its first step; find_unused_parameters=True keeps the first
    # layout, so the resumed run sums every gradient element of its 4 ranks in the same order as the reference
    for args in (["ref", 2], ["cut", 1], ["cut", 2, "resume"]):
        result = run([SCRIPT, tmp_path / args[0], *args[1:], "find-unused"], nproc=4, timeout=400)
        assert result.returncode == 0, result.stdout + result.stderr
    reference, resumed = final_tensors(tmp_path / "ref"), final_tensors(tmp_path / "cut")
    assert len(reference) == 4 + 4 * 3  # weights, biases; Adam's step, exp_avg, exp_avg_sq of each
    assert all(torch.equal(a, b) for a, b in zip(reference, resumed))
