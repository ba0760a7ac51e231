"""Every runnable example under scripts/ runs to completion and leaves what it promises."""
import csv
import os
import re

import pytest
import torch

from tests import script_server
from tests.helpers import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tutorial_trains_and_writes_logs_and_checkpoints(tmp_path):
    result = run_script("tutorial.py", str(tmp_path))
    assert "[main] epoch 8/8" in result.stdout
    rows = list(csv.DictReader(open(tmp_path / "logs" / "valid.csv")))
    assert len(rows) == 8 and float(rows[-1]["loss"]) < float(rows[0]["loss"])
    checkpoint = torch.load(tmp_path / "checkpoints" / "best.pth", weights_only=True)
    assert set(checkpoint["models"]["model"]) == {"weight", "bias"}


def test_stages_example_runs_both_stages(tmp_path):
    result = run_script("stages.py", str(tmp_path))
    assert "[warmup] epoch 2/2" in result.stdout and "[finetune] epoch 3/3" in result.stdout
    rows = list(csv.DictReader(open(tmp_path / "logs" / "train.csv")))
    assert [r["stage"] for r in rows] == ["warmup"] * 2 + ["finetune"] * 3
    assert float(rows[0]["lr"]) == 0.1 and float(rows[-1]["lr"]) == 1e-3


def test_classification_example_learns(tmp_path):
    result = run_script("classification_metrics.py", str(tmp_path))
    accuracy = float(result.stdout.split("valid accuracy=")[1].split()[0])
    assert accuracy > 0.9
    rows = list(csv.DictReader(open(tmp_path / "logs" / "valid.csv")))
    assert {"accuracy", "accuracy_top3", "precision", "recall", "f1", "auc"} <= set(rows[0])
    assert "auc" not in list(csv.DictReader(open(tmp_path / "logs" / "train.csv")))[0]


def test_custom_callback_example_stops_early():
    result = run_script("custom_callback.py")
    epoch = int(result.stdout.split("stopped after epoch ")[1].split()[0])
    assert 1 <= epoch < 100


def test_the_readme_snippet_is_the_tutorial():
    """README.md's 20 lines are scripts/tutorial.py's train() call, so the tested script is the documented one."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    snippet = re.search(r"## In 20 lines\n\n```python\n(.*?)```", readme, re.S).group(1)
    tutorial = open(os.path.join(ROOT, "scripts", "tutorial.py")).read()
    assert len(snippet.strip().splitlines()) <= 20
    assert snippet.split("runner = SupervisedRunner()")[1].replace('"./logdir"', "logdir") in tutorial


def test_the_rollback_example_rolls_back_past_its_two_bad_records(tmp_path):
    result = run_script("rollback_example.py", str(tmp_path))
    out = result.stdout + result.stderr
    assert "rollback 1 of at most 10: non-finite loss: 'loss' was nan" in out or \
        "rollback 1 of at most 10: loss spike: 'loss' was" in out, out[-3000:]
    left_out = result.stdout.split("left out:")[1]
    assert "17," in left_out and "200" in left_out  # the two bad records, in the batches left out
    final = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)
    assert all(torch.isfinite(t).all() for t in final["models"]["model"].values())


@pytest.mark.distributed
def test_the_elastic_example_trains_under_torchrun_and_its_rate_follows_the_world(tmp_path):
    """Two processes under an elastic torchrun, then the same script alone as a restarted job (one process): it
    continues the run with the learning rate of its world (0.01 x 1/4), saying so."""
    import sys
    from tests.helpers import free_port, script_env
    script = os.path.join(ROOT, "scripts", "elastic_train.py")
    env = script_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, EPOCHS=1)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2",
                "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                "--rdzv-id=example", "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"]
    first = script_server.run([*torchrun, script, str(tmp_path)], env=env, timeout=240)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    again = script_server.run([sys.executable, script, str(tmp_path)], env={**env, "EPOCHS": "2",
                                                                         "TORCHSTAGE_RESTART_COUNT": "1"},
                              timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "lr is 0.0025 now but 0.005 in the checkpoint; using 0.0025 (resume_lr='new')" in again.stdout
    final = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)
    assert final["meta"]["world_size"] == 1 and final["optimizers"]["optimizer"]["param_groups"][0]["lr"] == 0.0025


@pytest.mark.alone  # times the ranks
@pytest.mark.distributed
def test_slow_ranks_example_checks_the_ranks_then_names_the_slow_one_and_its_recovery(tmp_path):
    """Both ranks on one core (even turns, whatever else runs here), so that the pre-flight check agrees."""
    result = run_script("slow_ranks.py", str(tmp_path), cpus=0)
    out = result.stdout + result.stderr
    assert "[rank0]: pre-flight check:" in out and "[rank0]: all 2 ranks agree" in out, out[-3000:]
    lines = [line.split("]: ", 1)[1] for line in out.splitlines() if re.match(r"\[rank0\]: straggler", line)]
    assert [line.split(":")[0] for line in lines] == ["straggler", "straggler recovered"], out[-3000:]
    assert lines[0].startswith("straggler: rank 1 (host ") and ", local rank 1) is slow in compute: " in lines[0]
    # dated within a few agreements: epoch 3 starts after 512 batches, epoch 5 (back to speed) after 1024
    assert 500 <= int(re.search(r"slow since epoch \d+, global batch (\d+)", lines[0])[1]) <= 600, lines[0]
    assert 1000 <= int(re.search(r"back to speed since epoch \d+, global batch (\d+)", lines[1])[1]) <= 1300, lines[1]
