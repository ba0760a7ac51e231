"""The file format: atomic writes that keep the old file on failure, loading that never runs pickled code."""
import copy
import errno
import itertools
import os
import pickle
import stat

import pytest
import torch
from torch import nn

from torchstage.files import atomic
from torchstage.files.checkpoint_format import FORMAT
from torchstage import CheckpointError, SupervisedRunner, load_checkpoint, load_model_weights

from tests.resume_helpers import tiny_train_kwargs


def test_write_atomic_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "last.pth"
    atomic.write_atomic(str(path), b"old")
    atomic.write_atomic(str(path), b"new")
    assert path.read_bytes() == b"new" and os.listdir(path.parent) == ["last.pth"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # what open() gives: shareable like torch.save's


def test_write_atomic_steps_over_temporaries_a_killed_process_left(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_temporary_numbers", itertools.count())
    stale = [tmp_path / f".last.pth.{os.getpid()}.{n}.tmp" for n in range(2)]  # same pid, as after a reboot
    for path in stale:
        path.write_bytes(b"stale")
    atomic.write_atomic(str(tmp_path / "last.pth"), b"new")
    assert (tmp_path / "last.pth").read_bytes() == b"new" and all(p.read_bytes() == b"stale" for p in stale)


@pytest.mark.parametrize("failing", ["write", "fsync", "replace"])
def test_failed_write_raises_clearly_and_keeps_the_old_file(tmp_path, monkeypatch, failing):
    path = tmp_path / "last.pth"
    atomic.write_atomic(str(path), b"good")

    def disk_full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(atomic.os, failing, disk_full)
    with pytest.raises(CheckpointError, match=r"could not write checkpoint .*last.pth.*No space left on device"):
        atomic.write_atomic(str(path), b"half")
    monkeypatch.undo()
    assert path.read_bytes() == b"good" and os.listdir(tmp_path) == ["last.pth"]


def test_unwritable_folder_raises_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="could not write checkpoint"):
        atomic.write_atomic(str(blocker / "last.pth"), b"x")


class Payload:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_that_needs_code_is_refused_and_the_code_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"format": FORMAT, "models": {"model": {}}, "x": Payload(str(marker))}, str(path))
    with open(path, "rb") as f:  # make sure the file really carries the payload
        assert b"pwned" in f.read()
    with pytest.raises(CheckpointError, match=r"refused to load .*evil.pth.*weights_only=True.*Unsupported global"):
        load_checkpoint(str(path))
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_plain_pickle_and_foreign_files_are_refused(tmp_path):
    path = tmp_path / "pickled.pth"
    path.write_bytes(pickle.dumps({"format": FORMAT}))
    with pytest.raises(CheckpointError):
        load_checkpoint(str(path))
    torch.save({"state_dict": {}}, str(tmp_path / "other.pth"))
    with pytest.raises(CheckpointError, match="is not a torchstage checkpoint: format is None"):
        load_checkpoint(str(tmp_path / "other.pth"))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(str(tmp_path / "missing.pth"))


def test_state_saved_with_ddp_or_compile_prefixes_loads_into_a_plain_model():
    source = nn.Linear(3, 2)
    prefixed = {f"module._orig_mod.{k}": v for k, v in source.state_dict().items()}
    target = nn.Linear(3, 2)
    load_model_weights(target, {"format": FORMAT, "models": {"model": prefixed}})
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)


def test_checkpoint_of_a_ddp_wrapped_model_loads_into_a_plain_one(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        kwargs = tiny_train_kwargs(tmp_path / "run", num_epochs=1)
        plain = kwargs["model"]
        ddp = nn.parallel.DistributedDataParallel(plain)
        SupervisedRunner().train(**{**kwargs, "model": ddp})
    finally:
        dist.destroy_process_group()
    path = str(tmp_path / "run" / "checkpoints" / "last.pth")
    saved = load_checkpoint(path)["models"]["model"]
    assert not any(k.startswith("module.") for k in saved)
    fresh = copy.deepcopy(plain)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    load_model_weights(fresh, path)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), plain.state_dict().values()))
    # the raw DDP state dict (keys "module.…") loads too
    load_model_weights(fresh, {"format": FORMAT, "models": {"model": ddp.state_dict()}})
