"""Sharded (directory) checkpoints never run code from their ``.metadata`` pickle, and a damaged one is a clear error.

The malicious pickle reaches ``os.system`` through globals that DCP's own modules hold (``operator`` is an
attribute of ``torch.distributed.checkpoint.filesystem``, ``os`` one of its ``FileSystemReader.__init__``'s
globals): every place that loads checkpoints must refuse it before the marker file appears.
"""
import os
import random
import warnings

import pytest
import torch

from torchstage import CheckpointError, SupervisedRunner, load_checkpoint, load_model_weights
from torchstage.cli import main
from torchstage.files.checkpoint_format import FORMAT

from tests.resume_helpers import tiny_train_kwargs


def _payload(command: str) -> bytes:
    """A protocol-4 pickle: attrgetter('system')(itemgetter('os')(FileSystemReader.__init__.__globals__))(command)."""
    module = b"torch.distributed.checkpoint.filesystem"

    def glob(name):
        return b"c" + module + b"\n" + name + b"\n"

    def text(value):
        data = value.encode()
        return b"X" + len(data).to_bytes(4, "little") + data
    call = b"\x85R"  # TUPLE1, REDUCE
    return (b"\x80\x04" + glob(b"operator.attrgetter") + text("system") + call
            + glob(b"operator.itemgetter") + text("os") + call
            + glob(b"operator.attrgetter") + text("__init__.__globals__") + call
            + glob(b"FileSystemReader") + call + call + call + text(command) + call + b".")


def _sharded(path, metadata: bytes = None) -> str:
    """A sharded checkpoint directory written by DCP; its ``.metadata`` replaced by ``metadata`` if given."""
    import torch.distributed.checkpoint as dcp
    model = torch.nn.Linear(6, 1)
    state = {"format": FORMAT, "models": {"model": model.state_dict()}, "meta": {"sharded": True}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP says it saves in a single process
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    if metadata is not None:
        (path / ".metadata").write_bytes(metadata)
    return str(path)


@pytest.fixture
def attack(tmp_path):
    marker = tmp_path / "code-ran"
    return _sharded(tmp_path / "evil", _payload(f"touch {marker}")), marker


def test_the_payload_runs_code_under_a_plain_unpickler(tmp_path):
    """The check that the payload is real: unpickled without restriction, it creates the marker."""
    import pickle
    marker = tmp_path / "code-ran"
    pickle.loads(_payload(f"touch {marker}"))
    assert marker.exists()


def test_load_checkpoint_and_load_model_weights_refuse_it(attack):
    path, marker = attack
    with pytest.raises(CheckpointError, match="names torch.distributed.checkpoint.filesystem.operator.attrgetter"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="torchstage does not run code from checkpoint files"):
        load_model_weights(torch.nn.Linear(6, 1), path)
    assert not marker.exists()


def test_checkpoint_commands_refuse_it(attack, tmp_path, capsys):
    path, marker = attack
    assert main(["checkpoint", "inspect", path]) == 2
    assert main(["checkpoint", "consolidate", path, str(tmp_path / "out.pth")]) == 2
    assert "does not run code from checkpoint files" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "out.pth").exists()


def test_resume_last_refuses_it_when_last_is_a_directory(attack, tmp_path):
    path, marker = attack
    logdir = tmp_path / "run"
    (logdir / "checkpoints").mkdir(parents=True)
    os.symlink(path, logdir / "checkpoints" / "last.pth")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint(.|\n)*does not run code"):
        SupervisedRunner().train(**tiny_train_kwargs(logdir, resume="last"))
    assert not marker.exists()


def test_a_legitimate_sharded_checkpoint_loads(tmp_path):
    checkpoint = load_checkpoint(_sharded(tmp_path / "good"))
    assert checkpoint["format"] == FORMAT and set(checkpoint["models"]["model"]) == {"weight", "bias"}


@pytest.mark.parametrize("damage", [random.Random(0).randbytes(256), b"", b"\x80\x04K\x01."], ids=["random", "empty", "an int"])
def test_damaged_metadata_is_a_checkpoint_error_naming_the_file(tmp_path, damage):
    path = _sharded(tmp_path / "damaged", damage)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert repr(path) in str(error.value)
    assert "is damaged" in str(error.value) or "never holds" in str(error.value)


def test_resume_last_passes_a_damaged_sharded_last_over_for_the_newest_intact_one(tmp_path):
    logdir = tmp_path / "run"
    SupervisedRunner().train(**tiny_train_kwargs(logdir, num_epochs=1))
    folder = logdir / "checkpoints"
    os.replace(folder / "last.pth", folder / "best.pth")  # the intact single file, now the only other one
    os.symlink(_sharded(tmp_path / "damaged", random.Random(1).randbytes(256)), folder / "last.pth")
    runner = SupervisedRunner().train(**tiny_train_kwargs(logdir, num_epochs=2, resume="last"))
    assert runner.global_epoch_step == 2


class _Command:
    """Unpickling it runs a shell command: what a crafted value in a DCP data file does."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture
def data_attack(tmp_path):
    """A sharded checkpoint whose ``.metadata`` is clean and whose data file holds the payload as a value, written by
    DCP itself as an attacker would."""
    import torch.distributed.checkpoint as dcp
    marker = tmp_path / "code-ran"
    state = {"format": FORMAT, "models": {"model": torch.nn.Linear(6, 1).state_dict()},
             "meta": {"note": _Command(f"touch {marker}")}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "evil")), no_dist=True)
    assert [name for name in os.listdir(tmp_path / "evil") if name.endswith(".distcp")]
    return str(tmp_path / "evil"), marker


def test_a_payload_in_a_data_file_is_refused_on_every_loading_path(data_attack, tmp_path, capsys):
    path, marker = data_attack
    with pytest.raises(CheckpointError, match=r"refused to load .*a data file holds a value under 'meta.note' that "
                                              r"only unpickling code could rebuild"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="torchstage does not run code from checkpoint files"):
        load_model_weights(torch.nn.Linear(6, 1), path)
    assert main(["checkpoint", "inspect", path]) == 2
    assert main(["checkpoint", "consolidate", path, str(tmp_path / "out.pth")]) == 2
    assert "does not run code from checkpoint files" in capsys.readouterr().err
    logdir = tmp_path / "run"
    (logdir / "checkpoints").mkdir(parents=True)
    os.symlink(path, logdir / "checkpoints" / "last.pth")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint(.|\n)*does not run code"):
        SupervisedRunner().train(**tiny_train_kwargs(logdir, resume="last"))
    assert not marker.exists() and not (tmp_path / "out.pth").exists()


def test_plain_values_in_data_files_still_load(tmp_path):
    import torch.distributed.checkpoint as dcp
    values = {"stage": "main", "epoch": 3, "lr": [0.1, 0.01], "flags": (True, None), "nested": {"a": {"b": 1.5}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"format": FORMAT, "loop": values}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "ok")),
                 no_dist=True)
    assert load_checkpoint(str(tmp_path / "ok"))["loop"] == values


def test_empty_dicts_survive_a_sharded_checkpoint(tmp_path):
    """DCP keeps no empty dict: a run without a scheduler, or whose optimizer has no state yet, could not resume."""
    from torchstage.files.sharded import EMPTY_DICTS, save_sharded
    from torchstage.distributed.engine import Engine
    checkpoint = {"format": FORMAT, "models": {"model": {"w": torch.ones(2)}}, "schedulers": {}, "scaler": {},
                  "optimizers": {"optimizer": {"state": {}, "param_groups": [{"params": [0], "lr": 0.1}]}},
                  "callbacks": {"early_stopping": {}, "checkpoint": {"best": {"epoch": 1}, "kept": {}}}, "meta": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_sharded(checkpoint, [str(tmp_path / "last.pth")], Engine(device="cpu"))
    loaded = load_checkpoint(str(tmp_path / "last.pth"))
    assert EMPTY_DICTS not in loaded and loaded["meta"] == {"sharded": True}
    assert {key: value for key, value in loaded.items() if key not in ("models", "meta")} == \
           {key: value for key, value in checkpoint.items() if key not in ("models", "meta")}


def test_a_sharded_checkpoint_written_before_empty_dicts_were_kept_gets_the_formats_containers(tmp_path):
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as an earlier torchstage wrote it: no record of its empty dicts
        dcp.save({"format": FORMAT, "models": {"model": {"w": torch.ones(1)}},
                  "optimizers": {"optimizer": {"state": {}, "param_groups": [{"params": [0]}]}}, "schedulers": {}},
                 storage_writer=dcp.FileSystemWriter(str(tmp_path / "old")), no_dist=True)
    loaded = load_checkpoint(str(tmp_path / "old"))
    assert loaded["schedulers"] == {} and loaded["callbacks"] == {} and loaded["optimizers"]["optimizer"]["state"] == {}
