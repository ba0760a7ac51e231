"""Every runnable example under scripts/ runs to completion and leaves what it promises."""
import csv
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(name, *args, timeout=300, env=None):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args], capture_output=True,
                            text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_tutorial_trains_and_writes_logs_and_checkpoints(tmp_path):
    result = run_script("tutorial.py", str(tmp_path))
    assert "[main] epoch 8/8" in result.stdout
    rows = list(csv.DictReader(open(tmp_path / "logs" / "valid.csv")))
    assert len(rows) == 8 and float(rows[-1]["loss"]) < float(rows[0]["loss"])
    checkpoint = torch.load(tmp_path / "checkpoints" / "best.pth", weights_only=True)
    assert set(checkpoint["models"]["model"]) == {"weight", "bias"}
