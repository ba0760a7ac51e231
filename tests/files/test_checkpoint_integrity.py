"""Checkpoint integrity: the CRC-32 of every record of the file verified on load (and the content checksum of
files written before); a damaged or missing last.pth falls back to the
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


def _text(path):
    with open(path, "w") as f:  # printf hello > last.pth
        f.write("hello")


def _passwd_copy(path):
    with open("/etc/passwd", "rb") as source, open(path, "wb") as f:
        f.write(source.read())


def _passwd_link(path):
    os.remove(path)
    os.symlink("/etc/passwd", path)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted 4-epoch run's last checkpoint."""
    logdir = tmp_path_factory.mktemp("straight")
    _train(logdir, num_epochs=4)
    return load_checkpoint(str(logdir / "checkpoints" / "last.pth"))


@pytest.mark.parametrize("damage", [_truncate, _zero, _change_a_weight, os.remove, _text, _passwd_copy, _passwd_link],
                         ids=["truncated", "zeroed", "bytes-changed-in-a-tensor", "deleted", "text", "passwd-copy",
                              "passwd-link"])
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


def test_a_changed_plain_value_is_refused_naming_the_record(tmp_path):
    _train(tmp_path, num_epochs=1)
    path = tmp_path / "checkpoints" / "last.pth"
    data = open(path, "rb").read()
    assert data.count(b"torchstage/1") == 1
    open(path, "wb").write(data.replace(b"torchstage/1", b"torchstage/2"))  # still a valid pickle and zip
    with pytest.raises(CheckpointError, match=r"is damaged: .* in record 'archive/data.pkl'"):
        load_checkpoint(str(path))


def test_a_damaged_record_header_is_refused_as_damaged(tmp_path):
    _train(tmp_path, num_epochs=1)
    path = tmp_path / "checkpoints" / "last.pth"
    data = bytearray(open(path, "rb").read())
    assert data[:4] == b"PK\x03\x04"
    data[:4] = b"XX\x03\x04"  # the first record's header; the directory at the end still reads
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match=r"is damaged: .* in record 'archive/data.pkl'"):
        load_checkpoint(str(path))


def test_records_keep_their_crc_when_a_user_turned_torch_crcs_off(tmp_path):
    from torch.utils.serialization import config
    with config.patch({"save.compute_crc32": False}):
        _train(tmp_path, num_epochs=1)
    path = tmp_path / "checkpoints" / "best.pth"
    assert load_checkpoint(str(path))["loop"]["global_epoch_step"] == 1
    _change_a_weight(path)
    with pytest.raises(CheckpointError, match="is damaged: its content does not match the checksum"):
        load_checkpoint(str(path))


def _write_the_older_way(path, checkpoint):
    """A file as torchstage wrote it before relying on the zip CRCs: a ``checksum`` key over the content; here
    with torch's CRCs off too, so only that key can tell a changed weight."""
    from torch.utils.serialization import config

    from torchstage.files.checkpoint_file import content_checksum
    with config.patch({"save.compute_crc32": False}):
        torch.save({**checkpoint, "checksum": {"crc32": content_checksum(checkpoint)}}, path)


def test_files_written_before_are_verified_by_their_content_checksum(tmp_path, straight):
    path = tmp_path / "older.pth"
    _write_the_older_way(path, straight)
    assert differences(load_checkpoint(str(path))["models"], straight["models"]) == []
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


@pytest.mark.parametrize("damage, said", [
    (_text, "it begins with b'hello'"), (_passwd_copy, "it begins with b'root:"),
    (_passwd_link, "it is a link to '/etc/passwd', which begins with b'root:")])
def test_a_file_that_is_not_a_checkpoint_is_a_checkpoint_error_naming_it(tmp_path, damage, said):
    path = tmp_path / "last.pth"
    path.write_bytes(b"")
    damage(path)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(str(path))
    message = str(error.value)
    assert message.startswith(f"{str(path)!r} is not a checkpoint: a torchstage checkpoint is a zip archive "
                              f"(torch.save's format), and this file is not one"), message
    assert said in message


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
