"""Catalyst 20.12-style scripts (scripts/catalyst20/) run with only their imports changed, and learn."""
import os
import re

import pytest

from tests.helpers import run_script


def numbers(text: str) -> dict:
    """``name=value`` pairs of the script's last output line (its result)."""
    return {k: float(v) for k, v in re.findall(r"(\w+)=(-?\d+(?:\.\d+)?)", text.strip().splitlines()[-1])}


def test_custom_runner_with_handle_batch_learns_predicts_and_traces(tmp_path):
    result = run_script(os.path.join("catalyst20", "custom_runner.py"), str(tmp_path))
    assert numbers(result.stdout)["accuracy01"] > 0.9
    assert (tmp_path / "checkpoints" / "best.pth").exists()


def test_classification_with_catalyst_callback_arguments_and_fp16(tmp_path):
    result = run_script(os.path.join("catalyst20", "classification.py"), str(tmp_path))
    values = numbers(result.stdout)
    assert values["accuracy01"] > 0.9 and values["accuracy05"] >= values["accuracy03"] >= values["accuracy01"]
    assert "this run on cpu trains in full precision (float32), as Catalyst did" in result.stdout
    assert "valid: accuracy01=" in result.stdout  # the console shows 20.12's metric names


def test_multilabel_check_run_and_batch_overfit(tmp_path):
    result = run_script(os.path.join("catalyst20", "multilabel.py"), str(tmp_path))
    values = numbers(result.stdout)
    assert values["multilabel_accuracy"] > 0.9
    # overfit: BatchOverfitCallback(train=1) repeats the first batch for the loader's 63 steps, 3 epochs, as
    # Catalyst 20.12 (and 22) did (the last number printed)
    assert values["batches"] == pytest.approx(3 * 63)
    assert "check batches=6" in result.stdout  # 3 train batches x 2 epochs


def test_gan_with_two_optimizer_callbacks_moves_the_generator_to_the_data(tmp_path):
    result = run_script(os.path.join("catalyst20", "gan.py"), str(tmp_path))
    mean = [float(v) for v in re.search(r"generated mean=\[([^\]]+)\]", result.stdout).group(1).split(",")]
    assert abs(mean[0] - 2.0) < 0.5 and abs(mean[1] + 1.0) < 0.5
