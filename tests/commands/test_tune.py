"""torchstage tune: 6-trial studies on the regression example into SQLite (one trial pruned), on 1 and 2 processes
per trial, an interrupted study resumed, config errors named before any trial."""
import json
import sqlite3
import sys
from concurrent.futures import ThreadPoolExecutor

import optuna
import pytest

from tests import script_server
from tests.helpers import ROOT, script_env

CONFIGS = ["scripts/configs/regression.yml", "tests/commands/configs/tune_grid.yml"]
LRS = [1e-5, 0.01, 0.02, 0.05, 0.1, 0.2]
States = optuna.trial.TrialState


def tune(logdir, *extra, configs=CONFIGS, **env):
    args = [sys.executable, "-m", "torchstage", "tune", "-C", *configs, "--set", f"logdir={logdir}", *extra]
    return script_server.run(args, env=script_env(**env), cwd=ROOT, timeout=300)


def load(logdir, name="grid"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{logdir}/study.db")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tune")
    with ThreadPoolExecutor(3) as pool:
        single = pool.submit(tune, base / "single")
        double = pool.submit(tune, base / "double", "--set", "distributed=true", "--set", "nprocs=2")
        killed = pool.submit(tune, base / "resumed", KILL_IN_TRIAL=2)
        single, double, killed = single.result(), double.result(), killed.result()
    interrupted = [(t.number, t.state) for t in load(base / "resumed").trials]
    resumed = tune(base / "resumed")
    return {"base": base, "single": single, "double": double, "killed": killed, "resumed": resumed,
            "interrupted": interrupted}


def _check_study(logdir):
    study = load(logdir)
    states = [t.state for t in study.trials]
    assert states.count(States.COMPLETE) == 5 and states.count(States.PRUNED) == 1
    pruned = next(t for t in study.trials if t.state == States.PRUNED)
    assert pruned.params == {"optimizer.lr": 1e-5} and list(pruned.intermediate_values) == [1]
    assert sorted(t.params["optimizer.lr"] for t in study.trials if t.state != States.FAIL) == LRS
    complete = [t for t in study.trials if t.state == States.COMPLETE]
    for trial in complete:  # the objective is the best validation loss of the trial's epochs
        summary = json.loads((logdir / f"trial-{trial.number:04d}" / "checkpoints" / "metrics.json").read_text())
        assert trial.value == min(e["metrics"]["valid"]["loss"] for e in summary["history"])
        assert sorted(trial.intermediate_values) == [1, 2, 3]
    assert study.best_value == min(t.value for t in complete)
    with sqlite3.connect(logdir / "study.db") as db:  # a real database, readable without optuna
        assert db.execute("select count(*) from trials").fetchone()[0] == len(study.trials)
    return study


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_six_trials_into_sqlite_with_the_bad_one_pruned(runs):
    assert runs["single"].returncode == 0, runs["single"].stderr[-3000:]
    study = _check_study(runs["base"] / "single")
    assert "optuna: best trial" in runs["single"].stdout
    params = json.loads((runs["base"] / "single" / "trial-0000" / "params-rank0.json").read_text())
    assert params["lr"] == study.trials[0].params["optimizer.lr"] and params["world_size"] == 1


@pytest.mark.distributed
def test_two_processes_per_trial_train_the_same_parameters(runs):
    assert runs["double"].returncode == 0, runs["double"].stderr[-3000:]
    logdir = runs["base"] / "double"
    study = _check_study(logdir)
    for trial in study.trials:
        ranks = [json.loads((logdir / f"trial-{trial.number:04d}" / f"params-rank{r}.json").read_text())
                 for r in range(2)]
        assert ranks[0] == ranks[1] and ranks[0]["world_size"] == 2
        assert ranks[0]["lr"] == trial.params["optimizer.lr"]
    assert "[rank0]: optuna: trial 0" in runs["double"].stdout
    assert "[rank1]: optuna: trial" not in runs["double"].stdout  # only the main rank talks to the study


@pytest.mark.distributed
def test_an_interrupted_study_resumes(runs):
    assert runs["killed"].returncode != 0
    assert runs["interrupted"] == [(0, States.COMPLETE), (1, States.COMPLETE), (2, States.RUNNING)]
    assert runs["resumed"].returncode == 0, runs["resumed"].stderr[-3000:]
    study = load(runs["base"] / "resumed")
    assert study.trials[2].state == States.FAIL
    retry = next(t for t in study.trials if t.user_attrs.get("retry_of") == 2)
    assert retry.params == study.trials[2].params and retry.state in (States.COMPLETE, States.PRUNED)
    assert sum(t.state in (States.COMPLETE, States.PRUNED) for t in study.trials) == 6
    assert "trial 2 was interrupted" in runs["resumed"].stdout
    again = tune(runs["base"] / "resumed")  # a finished study runs no more trials
    assert again.returncode == 0 and len(load(runs["base"] / "resumed").trials) == len(study.trials)


def test_the_documented_tune_config_runs(tmp_path):
    ran = tune(tmp_path, "--set", "tune.n_trials=2", "--set", "num_epochs=2", "--set", "datasets.num_workers=0",
               "--set", "datasets.train.num_samples=500", "--set", "scheduler=null",
               configs=["scripts/configs/regression.yml", "scripts/configs/tune.yml"])
    assert ran.returncode == 0, ran.stderr[-3000:]
    study = load(tmp_path, "regression")
    assert [t.state for t in study.trials] == [States.COMPLETE] * 2
    assert set(study.trials[0].params) == {"optimizer.lr", "datasets.batch_size"}


@pytest.mark.parametrize("extra,message", [
    ("tune: null", "tune: expected a mapping with n_trials and params"),
    ("tune: {n_trials: 0}", "tune.n_trials: expected an integer >= 1, got 0"),
    ("tune: {params: {optimizer.lr: {type: normal}}}", "tune.params.optimizer.lr: expected {type: float|int|categorical"),
    ("tune: {params: {optimizer.lr: {choices: [1]}}}",
     "tune.params.optimizer.lr.choices: not an argument of a float space"),
    ("tune: {params: {optimizer.eps: {type: int, low: 1}}}", "tune.params.optimizer.eps: a int space needs high"),
])
def test_config_errors_name_the_key_before_any_trial(tmp_path, extra, message):
    (tmp_path / "bad.yml").write_text(extra)
    ran = tune(tmp_path, configs=[*CONFIGS, tmp_path / "bad.yml"])
    assert ran.returncode == 2 and message in ran.stderr, ran.stderr[-2000:]
    assert not (tmp_path / "study.db").exists()


def test_a_module_beside_the_config_is_imported_as_torchstage_run_imports_it(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "mynet.py").write_text("import torch\n\nclass SmallNet(torch.nn.Linear):\n    pass\n")
    (tmp_path / "proj" / "model.yml").write_text("model: {_target_: mynet.SmallNet, in_features: 10, "
                                                 "out_features: 1}\n")
    ran = tune(tmp_path / "logs", "--set", "tune.n_trials=1", "--set", "num_epochs=1",
               configs=[*CONFIGS, str(tmp_path / "proj" / "model.yml")])
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert [t.state for t in load(tmp_path / "logs").trials] == [States.COMPLETE]


def test_a_target_that_cannot_be_imported_fails_before_the_study_records_a_trial(tmp_path):
    (tmp_path / "bad.yml").write_text("model: {_target_: torch.nn.Linar, in_features: 10, out_features: 1}\n")
    ran = tune(tmp_path, configs=[*CONFIGS, tmp_path / "bad.yml"])
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert "model._target_: cannot import 'torch.nn.Linar'" in ran.stderr and "Traceback" not in ran.stderr
    assert not (tmp_path / "study.db").exists()


def test_tune_takes_allow_targets_and_refuses_a_gadget_before_any_trial(tmp_path):
    marker = tmp_path / "code-ran"
    (tmp_path / "bad.yml").write_text(f"criterion: {{_target_: torchstage.launch.restarts.supervise, command: "
                                      f"[touch, {marker}], world: null, max_restarts: 0}}\n")
    allow = ["--allow-targets", "torch,torchstage,optuna,tests"]
    ran = tune(tmp_path, *allow, configs=[*CONFIGS, tmp_path / "bad.yml"])
    assert ran.returncode == 2 and "criterion._target_: 'torchstage.launch.restarts.supervise' is refused under " \
                                   "--allow-targets" in ran.stderr, ran.stderr[-2000:]
    assert not marker.exists() and not (tmp_path / "study.db").exists()
    outside = tune(tmp_path, "--allow-targets", "torch,torchstage,optuna,"  # the probe callback lives in tests.
                   "torchstage.data.synthetic.synthetic_regression")  # a function: listed by its full name
    assert outside.returncode == 2 and "'tests.commands.tune_probe.ParamsProbe' is not under the allowed" \
                                       in outside.stderr, outside.stderr[-2000:]
