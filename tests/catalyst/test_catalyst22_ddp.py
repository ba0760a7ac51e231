"""A Catalyst 22-style script (own loader hooks, BackwardCallback + step-only OptimizerCallback, ddp=True), 2 ranks."""
from pathlib import Path
import json

import pytest

from tests.helpers import run

pytestmark = pytest.mark.distributed

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.mark.timeout(200)
def test_catalyst22_runner_hooks_and_backward_callback_on_two_gloo_ranks(tmp_path):
    result = run([SCRIPTS / "catalyst22_ddp.py", tmp_path], nproc=2, timeout=170)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report-rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in reports] == [2, 2]
    assert reports[0]["weight"] == reports[1]["weight"] and reports[0]["moved"]  # gradients all-reduced each backward
    # each rank's own hook counted its half of the valid loader; 2 epochs x (8 train + 8 valid) batches per rank
    assert [r["samples_here"] for r in reports] == [128.0, 128.0]
    assert [r["batch_steps"] for r in reports] == [32, 32]
    output = result.stdout + result.stderr
    note = "train(ddp=...) is Catalyst 22's spelling; torchstage's is train(distributed=...)"
    assert note in output and f"[rank1]: note: {note}" not in output  # the launcher's and rank 0's, not rank 1's
