"""Non-finite losses: the run stops at the first NaN with a clear error and finite checkpoints, or skips it."""
import csv
import math
import os
import sys

import pytest
import torch

from tests import script_server
from tests.resume_helpers import ROOT, child_env
from torchstage import NonFiniteLossCallback, load_checkpoint

NAN_RUN = os.path.join(ROOT, "tests", "callbacks", "training", "scripts", "nan_run.py")


def nan_run(logdir, *args, **env):
    proc = script_server.run([sys.executable, NAN_RUN, str(logdir), *args], env=child_env(**env), timeout=240,
                             merge=True)
    return proc.returncode, proc.stdout


def all_finite(checkpoint) -> bool:
    return all(torch.isfinite(t).all() for t in checkpoint["models"]["model"].values())


def test_a_nan_at_batch_10_stops_the_run_naming_where_and_keeps_the_last_epoch_checkpoint(tmp_path):
    code, out = nan_run(tmp_path, NAN_AT_BATCH=10)  # 8 train batches per epoch: epoch 2, batch 2
    assert code != 0, out
    assert "NonFiniteLossError: non-finite loss: 'loss' was nan at stage 'main', epoch 2, loader 'train', " \
           "batch 2 (global batch 10)" in out, out
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert (last["loop"]["epoch"], last["loop"]["epoch_done"]) == (1, True) and all_finite(last)
    assert all_finite(load_checkpoint(str(tmp_path / "checkpoints" / "best.pth")))


def test_mid_epoch_checkpoints_stop_at_the_last_finite_batch(tmp_path):
    code, out = nan_run(tmp_path, NAN_AT_BATCH=10, PERIOD=1)  # last.pth after every train batch
    assert code != 0 and "(global batch 10)" in out, out
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert last["loop"]["global_batch_step"] == 9 and all_finite(last)


def test_two_ranks_stop_together_when_one_rank_sees_a_nan(tmp_path):
    code, out = nan_run(tmp_path, NAN_AT_BATCH=6, POISON_RANK=1, NPROC=2)  # 4 batches per rank and epoch
    assert code != 0, out
    assert "'loss' was nan on rank 1 at stage 'main', epoch 2, loader 'train', batch 2 (global batch 6)" in out, out
    # the launcher's summary names the rank that saw it, whichever rank's error it reports
    assert "seen on rank 1 at stage 'main'" in out or "The first error, on rank 1 at stage 'main'" in out, out
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert (last["loop"]["epoch"], last["loop"]["epoch_done"]) == (1, True) and all_finite(last)


def test_skip_mode_skips_and_counts_the_batch_and_trains_on(tmp_path):
    code, out = nan_run(tmp_path, "skip", NAN_AT_BATCH=10)
    assert code == 0, out
    assert "skipped train batch 2 of epoch 2 (global batch 10): non-finite loss" in out, out
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert last["loop"]["global_batch_step"] == 24 and all_finite(last)
    rows = list(csv.DictReader(open(tmp_path / "logs" / "train.csv")))
    assert [float(r["nonfinite_skipped"]) for r in rows] == [0.0, 1.0, 0.0]  # counted and logged per epoch
    assert all(math.isfinite(float(r["loss"])) for r in rows)  # the skipped batch is left out of the average
    assert math.isfinite(last["metrics"]["train"]["loss"])


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="mode must be 'stop'"):
        NonFiniteLossCallback(mode="ignore")
    with pytest.raises(ValueError, match="check_every must be an integer >= 1, got 0"):
        NonFiniteLossCallback(check_every=0)


def test_a_nan_gradient_with_a_finite_loss_never_reaches_a_checkpoint(tmp_path):
    """The last train batch of epoch 2 makes the weights NaN while its loss is finite: the epoch-end checkpoint is
    refused, epoch 1's files stay the last finite ones, and the run resumes from them."""
    code, out = nan_run(tmp_path, NAN_GRAD_AT_BATCH=16)  # 8 train batches per epoch: the last one of epoch 2
    assert code != 0, out
    assert "NonFiniteStateError: non-finite weights: model 'model' tensor '0.weight' holds NaN/inf at stage " \
           "'main', epoch 2, after global batch 16" in out, out
    assert "no checkpoint was written, so " in out and "(stage 'main', epoch 1, global batch 8) is the last finite " \
           "one" in out, out
    folder = tmp_path / "checkpoints"
    for name in ("last.pth", "best.pth"):
        checkpoint = load_checkpoint(str(folder / name))
        assert checkpoint["loop"]["epoch"] == 1 and all_finite(checkpoint), name
        assert all(torch.isfinite(t).all() for state in checkpoint["optimizers"]["optimizer"]["state"].values()
                   for t in state.values())
    code, out = nan_run(tmp_path, "resume")  # no poison now: the run continues from epoch 1's checkpoint
    assert code == 0, out
    assert load_checkpoint(str(folder / "last.pth"))["loop"]["global_epoch_step"] == 3
