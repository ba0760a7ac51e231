"""Checkpoint integrity: a content checksum verified on load; a damaged or missing last.pth falls back to the
newest intact checkpoint (saying which and why), or fails naming every candidate and why."""
import os

import pytest
import torch

from tests.resume_helpers import differences, tiny_train_kwargs
from torchstage import CheckpointError, SupervisedRunner, load_checkpoint


def _train(logdir, **overrides):
    return SupervisedRunner().train(**tiny_train_kwargs(str(logdir), topk=3, **overrides))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _zero(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(b"\0" * size)


def _change_a_weight(path):
    """Overwrite bytes inside the first weight tensor's stored data (the zip still reads)."""
    weight = torch.load(path, weights_only=True)["models"]["model"]["0.weight"]
    data = bytearray(open(path, "rb").read())
    at = data.find(weight.numpy().tobytes())
    assert at > 0
    data[at:at + 8] = b"\x7f\xff\xff\xff" * 2  # two NaN floats
    open(path, "wb").write(bytes(data))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted 4-epoch run's last checkpoint."""
    logdir = tmp_path_factory.mktemp("straight")
    _train(logdir, num_epochs=4)
    return load_checkpoint(str(logdir / "checkpoints" / "last.pth"))


@pytest.mark.parametrize("damage", [_truncate, _zero, _change_a_weight, os.remove],
                         ids=["truncated", "zeroed", "bytes-changed-in-a-tensor", "deleted"])
def test_damaged_last_falls_back_to_the_newest_intact_checkpoint(tmp_path, caplog, straight, damage):
    _train(tmp_path, num_epochs=3)
    folder = tmp_path / "checkpoints"
    damage(folder / "last.pth")
    caplog.set_level("WARNING", logger="torchstage")
    runner = _train(tmp_path, num_epochs=4, resume="last")
    assert runner.global_epoch_step == 4
    assert "resuming from" in caplog.text and "the newest intact checkpoint" in caplog.text
    assert str(folder / "last.pth") + " was passed over" in caplog.text
    resumed = load_checkpoint(str(folder / "last.pth"))
    assert differences(resumed["models"], straight["models"]) == []  # resumed exactly from epoch 3
    assert (folder / "epoch-0002.pth").exists() or (folder / "epoch-0001.pth").exists()  # nothing lost early


def test_a_changed_tensor_is_refused_by_its_checksum(tmp_path):
    _train(tmp_path, num_epochs=1)
    path = tmp_path / "checkpoints" / "best.pth"
    _change_a_weight(path)
    with pytest.raises(CheckpointError, match="is damaged: its content does not match the checksum"):
        load_checkpoint(str(path))


def test_truncated_and_empty_files_say_so(tmp_path):
    _train(tmp_path, num_epochs=1)
    path = tmp_path / "checkpoints" / "last.pth"
    _truncate(path)
    with pytest.raises(CheckpointError, match=r"bytes\) is truncated or damaged"):
        load_checkpoint(str(path))
    open(path, "wb").close()
    with pytest.raises(CheckpointError, match=r"the file is empty \(0 bytes\)"):
        load_checkpoint(str(path))


def test_no_intact_checkpoint_fails_naming_every_candidate_and_why(tmp_path):
    _train(tmp_path, num_epochs=2)
    folder = tmp_path / "checkpoints"
    names = sorted(p.name for p in folder.glob("*.pth"))
    for name in names:
        _truncate(folder / name)
    with pytest.raises(CheckpointError) as error:
        _train(tmp_path, num_epochs=3, resume="last")
    message = str(error.value)
    assert "no intact checkpoint" in message
    assert all(str(folder / name) in message for name in names), message
    assert sorted(p.name for p in folder.glob("*.pth")) == names  # nothing deleted or overwritten


def test_a_new_run_is_refused_while_only_best_and_epoch_files_remain(tmp_path):
    _train(tmp_path, num_epochs=2)
    os.remove(tmp_path / "checkpoints" / "last.pth")
    with pytest.raises(FileExistsError, match="already holds a run"):
        _train(tmp_path, num_epochs=2)
