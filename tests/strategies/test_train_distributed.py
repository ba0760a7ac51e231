"""train(distributed=True) on 3 gloo processes: exact validation metrics, agreeing ranks, synced gradients once."""
import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT, run, script_env

pytestmark = pytest.mark.distributed

PROBE = ROOT / "tests" / "launch" / "scripts" / "probe.py"
EPOCHS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The probe (1001 samples, valid loader first) on 1 process and on 3, started together."""
    single, triple = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("triple")
    first = subprocess.Popen([sys.executable, str(PROBE), str(single)], cwd=ROOT, env=script_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result = run([PROBE, triple], nproc=3, timeout=170)
    single_out = first.communicate(timeout=120)[0]
    assert first.returncode == 0, single_out
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads((triple / f"report-rank{r}.json").read_text()) for r in range(3)]
    return {"single": json.loads((single / "report-rank0.json").read_text()), "ranks": reports,
            "out": result.stdout, "logdir": triple}


@pytest.mark.timeout(200)
def test_validation_metrics_of_a_fixed_model_equal_the_single_process_values(runs):
    expected = runs["single"]["history"][0]["metrics"]["valid"]  # epoch 1 validates the untrained model
    for report in runs["ranks"]:
        got = report["history"][0]["metrics"]["valid"]
        assert set(got) == {"loss", "accuracy"}
        assert got["loss"] == pytest.approx(expected["loss"], abs=1e-6)
        assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    assert 0.2 < expected["accuracy"] < 0.8  # a real number of correct answers out of 1001, not 0 or 1


def test_each_validation_sample_counts_exactly_once(runs):
    shards = [report["indices"]["1/valid"] for report in runs["ranks"]]
    assert [len(s) for s in shards] == [334, 334, 333]
    assert sorted(sum(shards, [])) == list(range(1001))


def test_ranks_take_identical_decisions(runs):
    first, *others = runs["ranks"]
    lrs = [entry["lr"] for entry in first["history"]]
    assert len(first["history"]) == EPOCHS
    for report in others:
        assert report["history"] == first["history"]  # metrics and plateau-scheduled lr, every epoch
        assert report["best_epoch"] == first["best_epoch"]
        assert report["weights"] == first["weights"]
    summary = json.loads((runs["logdir"] / "checkpoints" / "metrics.json").read_text())
    assert summary["best"]["epoch"] == first["best_epoch"]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] == 0.5


def test_accumulation_steps_skip_gradient_sync(runs):
    # 334 training samples per rank in batches of 32 -> 11 batches; 2 per step -> 6 syncs per epoch
    assert [report["syncs"] for report in runs["ranks"]] == [6 * EPOCHS] * 3
    assert runs["single"]["syncs"] == 0


def test_models_are_wrapped_during_the_run_and_plain_after_it(runs):
    assert {report["wrapped"] for report in runs["ranks"]} == {"DistributedDataParallel"}
    assert runs["out"].count("plain model after training: Sequential") == 3
    for rank in range(3):
        assert f"[rank{rank}]: plain model after training: Sequential" in runs["out"]


def test_logs_and_checkpoints_are_written_once(runs):
    logdir, out = runs["logdir"], runs["out"]
    for epoch in range(1, EPOCHS + 1):
        assert out.count(f"epoch {epoch}/{EPOCHS} |") == 1
    assert len((logdir / "logs" / "valid.csv").read_text().splitlines()) == EPOCHS + 1
    names = sorted(p.name for p in (logdir / "checkpoints").iterdir())
    assert names == ["best.pth", "last.pth", "metrics.json"]  # topk=0 by default: no epoch-NNNN.pth
    checkpoint = torch.load(logdir / "checkpoints" / "last.pth", weights_only=True)
    assert checkpoint["meta"]["world_size"] == 3 and len(checkpoint["rng"]) == 3
    assert not any(key.startswith("module.") for key in checkpoint["models"]["model"])


def test_an_unknown_strategy_is_refused_before_any_process_starts():
    from torchstage import SupervisedRunner
    model = torch.nn.Linear(2, 2)
    loader = [(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))]
    with pytest.raises(ValueError, match="strategy must be 'ddp', 'fsdp', 'hsdp' or 'deepspeed', got 'zero'"):
        SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 loaders={"train": loader, "valid": loader}, distributed=True, strategy="zero")
