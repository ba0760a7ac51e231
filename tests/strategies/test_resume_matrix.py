"""Every strategy resumes whatever the run holds: killed mid-epoch, a run with no scheduler and an optimizer whose
state is empty (plain SGD) goes on from its last checkpoint and ends bitwise equal to the run never killed.

Before, a sharded (FSDP) checkpoint lost the empty ``schedulers`` dict and every rank died resuming it with
``KeyError: 'schedulers'``, at any world size.
"""
import os

import pytest

from tests.resume_helpers import EXACT_KEYS, differences
from tests.strategies.test_fsdp import launch
from torchstage.files.checkpoint_read import load_checkpoint

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

#: strategy -> processes: one process (no strategy to speak of), DDP, FSDP2, DeepSpeed ZeRO-2.
MATRIX = {"single": ("ddp", 1), "ddp": ("ddp", 2), "fsdp": ("fsdp-units", 2), "deepspeed": ("deepspeed2", 2)}


@pytest.mark.parametrize("name", list(MATRIX))
def test_a_bare_run_killed_mid_epoch_resumes_bitwise(tmp_path, name):
    strategy, procs = MATRIX[name]
    settings = dict(STRATEGY=strategy, NPROC=procs, EPOCHS=2, PERIOD=2, BARE=1)
    whole = launch(tmp_path / "whole", **settings)
    assert whole["code"] == 0, whole["out"][-3000:]
    logdir = tmp_path / "killed"
    killed = launch(logdir, KILL_AT_BATCH=7, KILL_RANK=procs - 1, **settings)
    assert killed["code"] != 0
    last = load_checkpoint(os.path.join(logdir, "checkpoints", "last.pth"))
    assert last["schedulers"] == {} and last["loop"]["global_batch_step"] == 6  # mid-epoch, no scheduler
    resumed = launch(logdir, "last", **settings)
    assert resumed["code"] == 0, resumed["out"][-3000:]
    a, b = (load_checkpoint(os.path.join(run["logdir"], "checkpoints", "last.pth")) for run in (whole, resumed))
    for checkpoint in (a, b):  # where each run's DeepSpeed files are: its own folder
        checkpoint["optimizers"]["optimizer"].get("deepspeed", {}).pop("path", None)
    assert [d for key in EXACT_KEYS if key != "callbacks" for d in differences(a[key], b[key], key)] == []
