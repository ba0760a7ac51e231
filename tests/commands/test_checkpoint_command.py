"""``torchstage checkpoint inspect``: position, metrics and versions of a checkpoint, and refusals."""
import json
import sys

import pytest
import torch

from torchstage import Batch, CancelRun, Callback, SupervisedRunner
from torchstage.cli import main

from tests import script_server
from tests.resume_helpers import ROOT, child_env, tiny_train_kwargs


class StopAt(Callback):
    order = 500

    def on_batch_end(self, runner):
        if runner.global_batch_step == 13:
            raise CancelRun()


@pytest.fixture(scope="module")
def mid_epoch_checkpoint(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("cli")
    SupervisedRunner().train(**tiny_train_kwargs(logdir, checkpoint_period=Batch(6), callbacks=[StopAt()]))
    return str(logdir / "checkpoints" / "last.pth")


def test_inspect_prints_position_counters_versions_and_model_size(mid_epoch_checkpoint, capsys):
    assert main(["checkpoint", "inspect", mid_epoch_checkpoint]) == 0
    out = capsys.readouterr().out
    assert "format      torchstage/1" in out
    assert "stage 'main', epoch 2 (mid-epoch, after batch 2 of loader 'train')" in out
    assert "global epoch 2, global batch 12, global sample 48" in out
    assert f"torch {torch.__version__}" in out and "world size 1" in out
    assert "model       model: 4 tensors, 65 values" in out
    assert "metrics     valid: loss=" not in out  # the epoch's validation had not run yet


def test_inspect_json_is_machine_readable(mid_epoch_checkpoint, capsys):
    assert main(["checkpoint", "inspect", "--json", mid_epoch_checkpoint]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["loop"]["global_batch_step"] == 12 and info["loop"]["epoch_done"] is False
    assert info["optimizers"] == ["optimizer"] and info["ranks"] == 1


def test_inspect_refuses_unsafe_files_with_exit_code_2(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"format": "torchstage/1", "x": torch.nn.Linear(1, 1)}, str(path))  # a pickled module
    proc = script_server.run([sys.executable, "-m", "torchstage.cli", "checkpoint", "inspect", str(path)],
                             env=child_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "refused to load" in proc.stderr and proc.stdout == ""


def test_inspect_of_a_file_that_is_not_a_checkpoint_says_so_with_exit_code_2(tmp_path):
    path = tmp_path / "last.pth"
    path.write_text("hello")
    proc = script_server.run([sys.executable, "-m", "torchstage.cli", "checkpoint", "inspect", str(path)],
                             env=child_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    assert f"{str(path)!r} is not a checkpoint: a torchstage checkpoint is a zip archive" in proc.stderr
