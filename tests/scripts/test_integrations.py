"""scripts/integrations.py, the example of docs/integrations.md, learns and logs its torchmetrics values."""
import csv
import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "integrations.py"


def load_script():
    spec = importlib.util.spec_from_file_location("integrations_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_example_learns_and_logs_torchmetrics(tmp_path):
    runner = load_script().main([str(tmp_path), "--epochs", "4"])
    valid = runner.epoch_metrics["valid"]
    assert valid["f1"] > 0.6 and valid["accuracy"] > 0.7
    rows = list(csv.DictReader(open(tmp_path / "logs" / "valid.csv")))
    assert len(rows) == 4 and "f1" in rows[0] and "accuracy" in rows[0]
    best = torch.load(tmp_path / "checkpoints" / "best.pth", weights_only=True)
    assert best["callbacks"]["ema"]["num_averaged"] > 0
    assert set(runner.callbacks["metrics"].produces) == {"f1", "accuracy"}
