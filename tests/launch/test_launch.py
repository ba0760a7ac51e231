"""The three documented forms on 2 real gloo processes, launched by torchstage and by torchrun."""
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, run, script_env

pytestmark = pytest.mark.distributed

FORMS = ["scripts/distributed_loaders.py", "scripts/distributed_datasets.py", "scripts/distributed_cmd_run.py"]


def check_run(result, logdir, prefixed: bool):
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    finals = re.findall(r"rank (\d)/(\d): trained (\w+), valid loss ([\d.]+)", out)
    assert sorted((r, n, cls) for r, n, cls, _ in finals) == [("0", "2", "Linear"), ("1", "2", "Linear")]
    assert len({loss for *_, loss in finals}) == 1  # every rank holds the same validation metrics
    assert out.count("epoch 1/2") == 1 and out.count("epoch 2/2") == 1  # console on the main rank only
    if prefixed:
        assert re.search(r"^\[rank1\]: rank 1/2: trained Linear", out, re.M)
    rows = (logdir / "logs" / "valid.csv").read_text().splitlines()
    assert len(rows) == 3  # header + 2 epochs, written once
    assert len(list((logdir / "tensorboard" / "train").iterdir())) == 1
    assert (logdir / "checkpoints" / "last.pth").is_file() and (logdir / "checkpoints" / "best.pth").is_file()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("script", FORMS)
def test_form_trains_on_two_processes(script, tmp_path):
    result = run([script, tmp_path / "logs"], nproc=2)
    check_run(result, tmp_path / "logs", prefixed=True)
    assert "starting 2 processes (gloo" in result.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("script", [FORMS[0], FORMS[2]])
def test_form_runs_unchanged_under_torchrun(script, tmp_path):
    result = run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", script, tmp_path / "logs"])
    check_run(result, tmp_path / "logs", prefixed=False)
    assert "starting" not in result.stdout  # torchrun made the world; torchstage joined it


def test_an_interactive_session_cannot_be_relaunched():
    code = "import torch\nfrom torchstage import distributed_cmd_run\ndistributed_cmd_run(print)\n"
    result = subprocess.run([sys.executable, "-"], input=code, cwd=ROOT, env=script_env(2), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert "an interactive session has none" in result.stderr


def test_without_devices_or_settings_the_function_runs_here(monkeypatch):
    from torchstage import distributed_cmd_run
    monkeypatch.delenv("TORCHSTAGE_NPROC", raising=False)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("torchstage.launch.resolve.local_gpus", lambda: 0)
    assert distributed_cmd_run(lambda a, b=0: a + b, 2, b=3) == 5
    assert distributed_cmd_run(lambda: "here", distributed=False, nprocs=4) == "here"
