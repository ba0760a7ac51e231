"""Catalyst 22-style metric scripts (scripts/catalyst22/metrics_*.py) run with only their imports changed and end
with Catalyst 22.04's numbers: bitwise the same final weights, the same metric values.

Each script runs twice in the test, on real Catalyst 22.04 (tests/catalyst/catalyst_reference.py puts its original
imports back) and on torchstage, on the same machine with the same environment; the Catalyst runs start in the
background, once per module, and overlap torchstage's. (Until 2026-11-26 the Catalyst numbers were recorded once on
another CPU, whose weights' sha256 no machine with other kernels, e.g. AVX-512, reproduces.)
Metric values agree to rounding: Catalyst keeps loader means as running float64 means (and aggregates loader
losses in float32), torchstage as float64 sums divided once.
"""
import json

import pytest

from .catalyst_reference import Catalyst2204, script_command, script_env

from tests import script_server


@pytest.fixture(scope="module")
def catalyst_22_04(tmp_path_factory):
    """``catalyst_22_04(script)``: the script's run on Catalyst 22.04, started once for the module."""
    runs = Catalyst2204(tmp_path_factory.mktemp("catalyst_22_04"))
    yield runs
    runs.close()


def result_of(stdout: str) -> dict:
    """The dict of the script's last ``RESULT {json}`` line (scripts/catalyst22/metrics_report.py)."""
    line = [line for line in stdout.splitlines() if line.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def run_script(script: str, logdir) -> tuple:
    """(the RESULT line's dict, the whole output) of scripts/catalyst22/<script> run by torchstage."""
    result = script_server.run(script_command(script, logdir), env=script_env(), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return result_of(result.stdout), output


def assert_catalyst_numbers(reference: dict, result: dict) -> None:
    """``result`` (torchstage's) against ``reference`` (Catalyst 22.04's, same machine): bitwise equal weights, metric
    values equal to rounding, every other value (pruned trials, reported steps) equal."""
    reference, result = dict(reference), dict(result)
    assert result.pop("weights_sha256", None) == reference.pop("weights_sha256", None)  # bitwise equal weights
    assert set(result["metrics"]) == set(reference["metrics"])
    for key, value in reference["metrics"].items():
        assert result["metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert {k: v for k, v in result.items() if k != "metrics"} == {k: v for k, v in reference.items()
                                                                    if k != "metrics"}


def test_readme_classification_with_accuracy_and_precision_recall_f1_support(tmp_path, catalyst_22_04):
    catalyst = catalyst_22_04("metrics_classification.py")
    result, output = run_script("metrics_classification.py", tmp_path)
    assert_catalyst_numbers(result_of(catalyst.stdout()), result)
    assert "valid: accuracy01=" in output and "f1/_macro=" in output  # the console shows Catalyst 22's names
    assert "metrics.AdditiveMetric(compute_on_call=...) (a host-side mean/std meter) is Catalyst 22's spelling" \
        in output


def test_multilabel_reads_activated_scores_without_a_second_sigmoid(tmp_path, catalyst_22_04):
    catalyst = catalyst_22_04("metrics_multilabel.py")
    result, _ = run_script("metrics_multilabel.py", tmp_path)
    assert_catalyst_numbers(result_of(catalyst.stdout()), result)


def test_functional_metrics_batch_transform_and_metric_aggregation(tmp_path, catalyst_22_04):
    catalyst = catalyst_22_04("metrics_functional.py")
    result, _ = run_script("metrics_functional.py", tmp_path)
    assert_catalyst_numbers(result_of(catalyst.stdout()), result)


def test_optuna_pruning_prunes_the_same_trial_and_returns_trial_best_score(tmp_path, catalyst_22_04):
    pytest.importorskip("optuna")
    catalyst = catalyst_22_04("metrics_optuna.py")
    result, _ = run_script("metrics_optuna.py", tmp_path)
    assert_catalyst_numbers(result_of(catalyst.stdout()), result)
    assert result["pruned"] and len(result["steps"]) == 4  # a trial was pruned, 4 trials reported (as Catalyst's)
