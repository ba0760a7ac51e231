"""scripts/gpu_check.sh on a machine without a CUDA GPU: a clean skip that says why, exit 0, no report."""
import subprocess
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu_check.sh runs for real there")
def test_gpu_check_skips_cleanly_without_cuda(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "report")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "gpu_check: skipped: no CUDA GPU on this machine: torch.cuda.is_available() is False" in proc.stdout
    assert not (tmp_path / "report").exists()
