"""scripts/training_features.py, the example of docs/training-features.md, trains and smoke-runs."""
import csv
import importlib.util
import re
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "training_features.py"


def load_script():
    spec = importlib.util.spec_from_file_location("training_features_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and CI machines are small and shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_example_learns_both_outputs(tmp_path, capsys):
    runner = load_script().main(["--logdir", str(tmp_path), "--samples", "4096", "--epochs", "8"])
    printed = capsys.readouterr().out
    accuracy = float(re.search(r"accuracy ([\d.]+)", printed).group(1))
    assert accuracy > 0.85  # 3 linear classes
    with open(tmp_path / "logs" / "valid.csv") as f:
        valid = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in valid] == [2, 4, 6, 8]  # valid_every=2
    assert float(valid[-1]["loss_value"]) < 0.5 * float(valid[0]["loss_value"])
    assert runner.epoch_metrics["train"]["samples_per_s"] > 0  # timeit


def test_example_check_mode_stops_after_two_epochs(capsys):
    runner = load_script().main(["--check", "--epochs", "8"])
    assert runner.epoch == 2 and runner.global_batch_step == 4
    assert "epochs 2" in capsys.readouterr().out
