"""TorchMetricsCallback: torchmetrics values equal the built-in metrics and scikit-learn, are exact across 1 and 3
processes, and a run killed mid-validation or mid-training resumes to the uninterrupted values. torchmetrics and
scikit-learn are imported in the tests that use them, not when pytest collects this file (2 s of CPU in every test
process, most of which never runs these tests)."""
import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import ROOT, run, script_env
from torchstage import Batch, Callback, CancelRun, SupervisedRunner, TorchMetricsCallback

SCRIPT = ROOT / "tests" / "callbacks" / "metrics" / "scripts" / "torchmetrics_run.py"
TM_KEYS = ("tm_accuracy", "tm_f1", "tm_auroc")


def _report(logdir, rank=0):
    return json.loads((logdir / f"report-rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The script on 1 process, on 3, and killed (mid-validation, mid-training) then resumed, on 1."""
    paths = {name: tmp_path_factory.mktemp(name) for name in ("single", "triple", "kill_valid", "kill_train")}
    procs = {"single": subprocess.Popen([sys.executable, str(SCRIPT), str(paths["single"])], cwd=ROOT,
                                        env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
             "kill_valid": subprocess.Popen([sys.executable, str(SCRIPT), str(paths["kill_valid"])], cwd=ROOT,
                                            env=script_env(KILL_AT_VALID_BATCH=3), stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)}
    triple = run([SCRIPT, paths["triple"]], nproc=3, timeout=240)
    assert triple.returncode == 0, triple.stdout[-3000:] + triple.stderr[-3000:]
    killed = run([SCRIPT, paths["kill_train"]], timeout=120, KILL_AT_TRAIN_BATCH=28)
    outs = {name: proc.communicate(timeout=120)[0] for name, proc in procs.items()}
    assert procs["single"].returncode == 0, outs["single"][-3000:]
    codes = {"kill_valid": procs["kill_valid"].returncode, "kill_train": killed.returncode}
    for name in ("kill_valid", "kill_train"):
        resumed = run([SCRIPT, paths[name], "last"], timeout=120)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    return {"paths": paths, "codes": codes}


@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_torchmetrics_equal_builtin_metrics_in_every_epoch_and_loader(runs):
    for name in ("single", "triple"):
        for epoch in _report(runs["paths"][name])["history"]:
            for loader, m in epoch.items():
                assert m["tm_accuracy"] == pytest.approx(m["accuracy"], abs=1e-6), (name, loader)
                assert m["tm_f1"] == pytest.approx(m["f1"], abs=1e-6), (name, loader)
                assert m["tm_auroc"] == pytest.approx(m["auc"], abs=1e-6), (name, loader)
            assert epoch["train"]["tm_train_accuracy"] == pytest.approx(epoch["train"]["accuracy"], abs=1e-6)
            assert "tm_train_accuracy" not in epoch["valid"]  # loaders="train"


def test_initial_model_values_equal_scikit_learn():
    """The same data and initial model as the script, computed directly: epoch 1 validates this model."""
    import torchmetrics
    from sklearn.metrics import accuracy_score, f1_score, roc_auc_score
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1001, 8, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(1001, generator=g) > 0).long() + (x[:, 1] > 0.7).long()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    collection = torchmetrics.MetricCollection({
        "tm_accuracy": torchmetrics.classification.MulticlassAccuracy(3, average="micro"),
        "tm_f1": torchmetrics.classification.MulticlassF1Score(3, average="macro")})
    auroc = torchmetrics.classification.MulticlassAUROC(3, average="macro", thresholds=None)
    loader = DataLoader(TensorDataset(x, y), batch_size=50)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                      loaders={"valid": loader},
                                      callbacks=[TorchMetricsCallback(collection), _Probs(),
                                                 TorchMetricsCallback(auroc, name="tm_auroc", input_key="probs")],
                                      valid_metric="tm_f1", minimize_valid_metric=False)
    with torch.no_grad():
        logits = model(x)
    probs, pred = logits.softmax(1).numpy(), logits.argmax(1).numpy()
    got = runner.epoch_metrics["valid"]
    assert got["tm_accuracy"] == pytest.approx(accuracy_score(y, pred), abs=1e-6)
    assert got["tm_f1"] == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-6)
    assert got["tm_auroc"] == pytest.approx(roc_auc_score(y, probs, multi_class="ovr", average="macro"), abs=1e-6)


@pytest.mark.distributed
def test_one_and_three_processes_give_the_same_values_on_1001_samples(runs):
    expected = _report(runs["paths"]["single"])["history"][0]["valid"]  # epoch 1 validates the initial model
    for rank in range(3):
        report = _report(runs["paths"]["triple"], rank)
        assert report["world_size"] == 3
        got = report["history"][0]["valid"]
        for key in TM_KEYS:
            assert got[key] == pytest.approx(expected[key], abs=1e-6), (rank, key)
        assert report["history"] == _report(runs["paths"]["triple"])["history"]  # ranks agree on every value


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["kill_valid", "kill_train"])
def test_killed_runs_resume_to_the_uninterrupted_values(runs, name):
    assert runs["codes"][name] == -signal.SIGKILL
    reference = _report(runs["paths"]["single"])["history"][-1]
    resumed = _report(runs["paths"][name])["history"][-1]  # the resumed process's last epoch
    for loader in ("train", "valid"):
        for key in (*TM_KEYS, "accuracy", "loss"):
            assert resumed[loader][key] == pytest.approx(reference[loader][key], abs=1e-12), (loader, key)
    assert resumed["train"]["tm_train_accuracy"] == reference["train"]["tm_train_accuracy"]


@pytest.mark.distributed
def test_kill_mid_training_keeps_partial_states_per_rank(runs):
    last = torch.load(runs["paths"]["kill_train"] / "checkpoints" / "last.pth", weights_only=True)
    assert last["loop"]["global_batch_step"] == 66  # the resumed run finished
    # the run that was killed had written last.pth at global batch 25, 3 batches into epoch 2's train loader
    assert "tm_train" not in last["callbacks"]  # at epoch end nothing is partial


def test_partial_state_is_saved_mid_loader_and_continued(tmp_path):
    """A checkpoint written mid-loader holds each member's states; loading them continues the sums."""
    import torchmetrics
    metric = torchmetrics.classification.MulticlassAccuracy(3, average="micro")
    callback = TorchMetricsCallback(metric, name="acc", loaders="train")
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    model = torch.nn.Linear(4, 3)
    SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             loaders={"train": DataLoader(TensorDataset(x, y), batch_size=8)}, logdir=str(tmp_path),
                             callbacks={"acc": callback, "stop": _StopAt(3)}, valid_loader="train",
                             valid_metric="acc", minimize_valid_metric=False, checkpoint_period=Batch(3))
    state = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)["callbacks"]["acc"]["per_rank"][0]
    assert state["loader"] == "train" and state["states"]["acc"]["update_count"] == 3
    assert int(state["states"]["acc"]["tp"].sum()) + int(state["states"]["acc"]["fn"].sum()) == 24


class _Probs(Callback):
    order = 19  # before the metrics

    def on_batch_end(self, runner):
        runner.batch["probs"] = runner.batch["logits"].softmax(1)


class _StopAt(Callback):  # ends the run after n train batches
    order = 500

    def __init__(self, n):
        self.n = n

    def on_batch_end(self, runner):
        if runner.global_batch_step == self.n:
            raise CancelRun()


def test_rejects_what_is_not_a_torchmetrics_metric():
    import torchmetrics
    with pytest.raises(TypeError, match="must be a torchmetrics.Metric or MetricCollection, got Linear"):
        TorchMetricsCallback(torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="name must be a non-empty str or None, got 3"):
        TorchMetricsCallback(torchmetrics.MeanSquaredError(), name=3)
    with pytest.raises(TypeError, match="input_key must be a str, got None"):
        TorchMetricsCallback(torchmetrics.MeanSquaredError(), input_key=None)


def test_default_name_and_per_class_values():
    import torchmetrics
    from sklearn.metrics import f1_score
    metric = torchmetrics.classification.MulticlassF1Score(3, average=None)
    callback = TorchMetricsCallback(metric)
    assert callback.produces == ("multiclass_f1_score",)
    x, y = torch.randn(90, 4), torch.arange(90) % 3
    model = torch.nn.Linear(4, 3)
    runner = SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                      loaders={"valid": DataLoader(TensorDataset(x, y), batch_size=32)},
                                      callbacks=[callback])
    with torch.no_grad():
        pred = model(x).argmax(1).numpy()
    per_class = f1_score(y.numpy(), pred, average=None)
    got = runner.epoch_metrics["valid"]
    assert [got[f"multiclass_f1_score/{i}"] for i in range(3)] == pytest.approx(list(per_class), abs=1e-6)
    assert np.isfinite(got["loss"])
