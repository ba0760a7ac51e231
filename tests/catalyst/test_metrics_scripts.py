"""Catalyst 22-style metric scripts (scripts/catalyst22/metrics_*.py) run with only their imports changed and end
with Catalyst 22.04's numbers: bitwise the same final weights, the same metric values.

The reference values were recorded on 2026-11-26 by running the same scripts with their original imports on
catalyst 22.4 (accelerate 0.19.0, torch 2.13.0+cpu, Python 3.11.7) through scripts/catalyst22/metrics_reference.py:
    python scripts/catalyst22/metrics_reference.py scripts/catalyst22/metrics_<name>.py /tmp/logdir
Metric values agree to rounding: Catalyst keeps loader means as running float64 means (and aggregates loader
losses in float32), torchstage as float64 sums divided once.
"""
import json
import os

import pytest

from tests import helpers

CATALYST_22_04 = {
    "classification": {
        "metrics": {"accuracy01": 0.7575, "accuracy03": 0.9474999999999999, "eval_accuracy01": 0.7575,
                    "eval_accuracy03": 0.9474999999999999, "f1/_macro": 0.7572838132557401,
                    "f1/_micro": 0.7574950000330031, "f1/_weighted": 0.7573461393848281, "loss": 0.9994334039688112,
                    "meter_mean": 0.7575, "meter_std": 0.08269095414220637, "precision/_macro": 0.7598799966124661,
                    "precision/_micro": 0.7575000000000001, "recall/_macro": 0.756624909563085},
        "weights_sha256": "30e0e544a4d4e65448e106bda853ed51ddb364cf46a368998ec52fea47884c98"},
    "multilabel": {
        "metrics": {"accuracy": 0.756125, "f1/_macro": 0.7590936921183551, "f1/_micro": 0.7590415617961809,
                    "f1/_weighted": 0.7590774337179086, "loss": 0.5732953090667725,
                    "precision/_macro": 0.7474159782996352, "precision/_micro": 0.7469615945551775,
                    "recall/_micro": 0.7715289982425307},
        "weights_sha256": "143d49d47bce6501ce23191747bcb8255be0b794162ddc2c8288599af7d96f37"},
    "functional": {
        "metrics": {"loss": 0.9329450130462646, "loss_ce": 0.37015744090080255, "loss_smooth": 1.1255750465393064,
                    "p_true": 0.7301988708972931, "top1": 0.8756250000000001},
        "weights_sha256": "5d50f80e3a04b4405d8b666e0b0203817cfd3bf682c0d6397caf2ef6cdd2126c"},
    "optuna": {
        "metrics": {"best_value": 0.9750000000000001, "trial0": 0.9500000000000001, "trial1": 0.9625,
                    "trial2": 0.6499999999999999, "trial3": 0.9750000000000001},
        "pruned": [2], "steps": {"0": [1, 2, 3], "1": [1, 2, 3], "2": [1], "3": [1, 2, 3]}},
}


def run_script(script: str, logdir) -> tuple:
    """(the RESULT line's dict, the whole output) of scripts/catalyst22/<script> run by torchstage."""
    result = helpers.run_script(os.path.join("catalyst22", script), logdir)
    output = result.stdout + result.stderr
    line = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), output


def assert_catalyst_numbers(name: str, result: dict) -> None:
    reference = CATALYST_22_04[name]
    assert result.pop("weights_sha256", None) == reference.get("weights_sha256")  # bitwise equal final weights
    assert set(result["metrics"]) == set(reference["metrics"])
    for key, value in reference["metrics"].items():
        assert result["metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert {k: v for k, v in result.items() if k != "metrics"} == {k: v for k, v in reference.items()
                                                                    if k not in ("metrics", "weights_sha256")}


def test_readme_classification_with_accuracy_and_precision_recall_f1_support(tmp_path):
    result, output = run_script("metrics_classification.py", tmp_path)
    assert_catalyst_numbers("classification", result)
    assert "valid: accuracy01=" in output and "f1/_macro=" in output  # the console shows Catalyst 22's names
    assert "metrics.AdditiveMetric(compute_on_call=...) (a host-side mean/std meter) is Catalyst 22's spelling" \
        in output


def test_multilabel_reads_activated_scores_without_a_second_sigmoid(tmp_path):
    result, _ = run_script("metrics_multilabel.py", tmp_path)
    assert_catalyst_numbers("multilabel", result)


def test_functional_metrics_batch_transform_and_metric_aggregation(tmp_path):
    result, _ = run_script("metrics_functional.py", tmp_path)
    assert_catalyst_numbers("functional", result)


def test_optuna_pruning_prunes_the_same_trial_and_returns_trial_best_score(tmp_path):
    pytest.importorskip("optuna")
    result, _ = run_script("metrics_optuna.py", tmp_path)
    assert_catalyst_numbers("optuna", result)
