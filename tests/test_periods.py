"""Batch(n) and Epoch(n): when they are due, and the errors a wrong period gives before training."""
from types import SimpleNamespace

import pytest

from torchstage import Batch, Epoch, SupervisedRunner
from torchstage.periods import as_periods, batch_due, epoch_due

from tests.resume_helpers import tiny_train_kwargs


def test_batch_period_counts_global_train_batches():
    due = [b for b in range(1, 13) if batch_due((Batch(4),), SimpleNamespace(loop=SimpleNamespace(is_train_loader=True, global_batch_step=b)))]
    assert due == [4, 8, 12]
    assert not Batch(1).batch_due(SimpleNamespace(loop=SimpleNamespace(is_train_loader=False, global_batch_step=4)))
    assert not Batch(1).epoch_due(SimpleNamespace(loop=SimpleNamespace(epoch=1)))


def test_epoch_period_and_combinations():
    assert [e for e in range(1, 7) if epoch_due((Epoch(3),), SimpleNamespace(loop=SimpleNamespace(epoch=e)))] == [3, 6]
    assert as_periods(2) == (Epoch(2),)
    assert as_periods((Batch(5), 1)) == (Batch(5), Epoch(1))
    assert as_periods(None) == ()


@pytest.mark.parametrize("bad", ["5", 0, 1.5, True, (Batch(2), "x")])
def test_wrong_checkpoint_period_fails_before_training(tmp_path, bad):
    with pytest.raises(ValueError, match="checkpoint_period must be Batch"):
        SupervisedRunner().train(**tiny_train_kwargs(tmp_path, checkpoint_period=bad))
    assert not (tmp_path / "checkpoints").exists()


def test_period_n_must_be_positive():
    with pytest.raises(ValueError, match=r"Batch\(n\) needs an integer n >= 1, got 0"):
        Batch(0)
