"""MLflowLogger into a real SQLite tracking store, read back with mlflow.MlflowClient."""
import json
import os

import pytest
import torch

from tests.callbacks.loggers.test_loggers import read_tensorboard_scalars
from tests.conftest import regression_loaders
from tests.helpers import run
from torchstage import Batch, Callback, MLflowLogger, SupervisedRunner

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "mlflow_run.py")


def client_for(logdir):
    from mlflow import MlflowClient
    return MlflowClient(tracking_uri=f"sqlite:///{os.path.abspath(logdir)}/mlflow.db")


def only_run(client, experiment_name):
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def history(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def epoch_values(logdir, loader, metric="loss"):
    entries = json.load(open(os.path.join(logdir, "checkpoints", "metrics.json")))["history"]
    return [(e["global_epoch"], e["metrics"][loader][metric]) for e in entries]


def test_params_metrics_tags_and_artifacts(tmp_path):
    model = torch.nn.Linear(4, 1)
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.05), loaders=regression_loaders(),
                             num_epochs=3, logdir=str(tmp_path), log_period=Batch(2),
                             callbacks={"mlflow": MLflowLogger(run_name="first", tags={"team": "vision"})})
    client = client_for(tmp_path)
    run_ = only_run(client, "torchstage")
    assert run_.info.run_name == "first" and run_.info.status == "FINISHED"
    params = run_.data.params
    assert params["num_epochs"] == "3" and params["lr"] == "0.05" and params["optimizer"] == "SGD"
    assert params["world_size"] == "1" and params["model"] == "Linear"
    assert run_.data.tags["world_size"] == "1" and run_.data.tags["strategy"] == "ddp"
    assert run_.data.tags["team"] == "vision" and "slurm_job_id" not in run_.data.tags
    for loader in ("train", "valid"):
        assert history(client, run_.info.run_id, f"{loader}/loss") == epoch_values(tmp_path, loader)
    batches = history(client, run_.info.run_id, "train/batch/loss")
    tb = read_tensorboard_scalars(tmp_path / "tensorboard" / "train")["batch/loss"]
    assert [s for s, _ in batches] == [s for s, _ in tb] and len(batches) > 2 and batches[0][0] == 2
    assert [v for _, v in batches] == pytest.approx([v for _, v in tb], rel=1e-6)
    artifacts = {a.path for folder in ("checkpoint", "plot", "logs", "summary")
                 for a in client.list_artifacts(run_.info.run_id, folder)}
    assert {"checkpoint/best.pth", "plot/curves.png", "logs/metrics.json", "logs/train.csv",
            "summary/model_summary.txt"} <= artifacts
    local = client.download_artifacts(run_.info.run_id, "checkpoint/best.pth", str(tmp_path / "down"))
    assert torch.load(local, weights_only=True)["format"] == "torchstage/1"


def test_bad_arguments_raise_naming_them():
    with pytest.raises(ValueError, match=r"log_checkpoint must be 'best', 'last' or None, got 'all'"):
        MLflowLogger(log_checkpoint="all")
    model = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match=r"MLflowLogger needs a logdir .* pass logdir=\.\.\. to train\(\)"):
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders=regression_loaders(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                 callbacks={"mlflow": MLflowLogger()})


@pytest.mark.distributed
def test_two_processes_killed_and_resumed_make_one_run(tmp_path):
    logdir = tmp_path / "run"
    first = run([SCRIPT, logdir], nproc=2, timeout=240, KILL_AT_EPOCH_END=2)
    assert first.returncode != 0, first.stdout + first.stderr
    client = client_for(logdir)
    killed = only_run(client, "scaling")
    assert killed.info.status == "RUNNING"  # SIGKILL: nobody closed it
    assert [s for s, _ in history(client, killed.info.run_id, "valid/loss")] == [1, 2]
    second = run([SCRIPT, logdir, "last"], nproc=2, timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = only_run(client, "scaling")
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    assert resumed.data.tags["world_size"] == "2" and resumed.data.params["world_size"] == "2"
    for loader in ("train", "valid"):
        assert history(client, resumed.info.run_id, f"{loader}/loss") == epoch_values(logdir, loader)
    steps = [s for s, _ in history(client, resumed.info.run_id, "train/batch/loss")]
    assert steps == list(range(2, 4 * 6 + 1, 2))  # 48 samples / (2 ranks x 4) = 6 batches per epoch, each once


class FailAtBatch(Callback):
    order = 500

    def on_batch_end(self, runner):
        if runner.global_batch_step == 2:
            raise RuntimeError("node lost")


def test_a_slurm_job_restarted_before_its_first_checkpoint_continues_its_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    model = torch.nn.Linear(4, 1)
    kwargs = dict(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                  loaders=regression_loaders(), num_epochs=2, logdir=str(tmp_path), requeue=False)
    with pytest.raises(RuntimeError, match="node lost"):
        SupervisedRunner().train(**kwargs, callbacks={"mlflow": MLflowLogger(), "fail": FailAtBatch()})
    client = client_for(tmp_path)
    failed = only_run(client, "torchstage")
    assert failed.info.status == "FAILED" and failed.data.tags["slurm_job_id"] == "4242"
    assert not (tmp_path / "checkpoints" / "last.pth").exists()
    SupervisedRunner().train(**kwargs, resume="last", callbacks={"mlflow": MLflowLogger()})
    finished = only_run(client, "torchstage")
    assert finished.info.run_id == failed.info.run_id and finished.info.status == "FINISHED"
    assert history(client, finished.info.run_id, "valid/loss") == epoch_values(tmp_path, "valid")


def test_a_checkpoint_whose_run_is_not_in_the_store_starts_a_new_run(tmp_path, caplog, monkeypatch):
    import logging
    monkeypatch.chdir(tmp_path)  # a tracking URI of the user's keeps MLflow's default artifact place, ./mlruns
    caplog.set_level(logging.WARNING, logger="torchstage")
    model = torch.nn.Linear(4, 1)
    kwargs = dict(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                  loaders=regression_loaders(), logdir=str(tmp_path))
    SupervisedRunner().train(**kwargs, num_epochs=1, callbacks={"mlflow": MLflowLogger()})
    old = only_run(client_for(tmp_path), "torchstage").info.run_id
    other = f"sqlite:///{tmp_path}/other.db"  # the resumed run logs elsewhere (another server, a copied logdir)
    SupervisedRunner().train(**kwargs, num_epochs=2, resume="last",
                             callbacks={"mlflow": MLflowLogger(tracking_uri=other)})
    from mlflow import MlflowClient
    new = only_run(MlflowClient(tracking_uri=other), "torchstage")
    assert new.info.run_id != old and new.info.status == "FINISHED"
    assert any(f"MLflow run {old} of the checkpoint is not in" in r.getMessage() for r in caplog.records)
