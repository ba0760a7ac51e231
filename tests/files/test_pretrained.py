"""train(init_from=...) on one process: a plain .pth, a torchstage checkpoint (file or sharded directory), a
safetensors file and a Hugging Face-style folder of shards with its index give exactly their weights; keys that do
not match the model, and sources that are none of these, are refused before training naming what is wrong."""
import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tests.helpers import tiny_run
from torchstage import Callback, FSDP
from torchstage.callbacks.base import CancelRun
from torchstage.files.pretrained import check_keys, open_weights


class Initial(Callback):
    """Keeps the model's weights as the first epoch starts, and trains nothing."""

    order = 0

    def on_experiment_start(self, runner):
        self.state = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}

    def on_batch_start(self, runner):
        raise CancelRun()


def weights(seed=7):
    g = torch.Generator().manual_seed(seed)
    return {"0.weight": torch.randn(8, 4, generator=g), "0.bias": torch.randn(8, generator=g),
            "2.weight": torch.randn(1, 8, generator=g), "2.bias": torch.randn(1, generator=g)}


def model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def start(init_from, **kwargs):
    initial = Initial()
    tiny_run(model(), init_from=init_from, callbacks=[initial], **kwargs)
    return initial.state


def assert_weights(state, expected):
    assert sorted(state) == sorted(expected)
    for key in expected:
        assert torch.equal(state[key], expected[key]), key


def hf_folder(folder, state):
    """A folder as save_pretrained writes one of several shards: two safetensors files and their index."""
    folder.mkdir()
    names = sorted(state)
    parts = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    for file, keys in parts.items():
        save_file({k: state[k] for k in keys}, folder / file, metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.numel() * 4 for t in state.values())},
             "weight_map": {k: file for file, keys in parts.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_a_plain_pth_file(tmp_path):
    torch.save(weights(), tmp_path / "w.pth")
    assert_weights(start(tmp_path / "w.pth"), weights())


def test_a_safetensors_file_and_a_folder_of_shards_with_its_index(tmp_path):
    save_file(weights(), tmp_path / "w.safetensors")
    assert_weights(start(str(tmp_path / "w.safetensors")), weights())
    folder = hf_folder(tmp_path / "hf", weights(3))
    assert_weights(start(folder), weights(3))
    assert sorted(open_weights(folder).files.values())[0].endswith("model-00001-of-00002.safetensors")


def test_torchstage_checkpoints_file_and_sharded(tmp_path):
    tiny_run(model(), logdir=tmp_path / "a", torch_seed=1)
    saved = torch.load(tmp_path / "a" / "checkpoints" / "last.pth", weights_only=True)["models"]["model"]
    assert_weights(start(str(tmp_path / "a" / "checkpoints" / "last.pth")), saved)
    tiny_run(model(), logdir=tmp_path / "b", strategy=FSDP(), torch_seed=2)  # a directory of DCP shards
    source = open_weights(tmp_path / "b" / "checkpoints" / "last.pth")
    assert type(source).__name__ == "ShardedCheckpointSource" and sorted(source.shapes()) == sorted(weights())
    state = start(str(tmp_path / "b" / "checkpoints" / "last.pth"))
    sharded = {k: torch.empty(v.shape) for k, v in weights().items()}
    source.load_into(sharded)
    assert_weights(state, sharded)


def test_a_resumed_run_does_not_read_init_from(tmp_path):
    tiny_run(model(), logdir=tmp_path, torch_seed=1)
    saved = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)["models"]["model"]
    torch.save(weights(), tmp_path / "w.pth")
    state = start(tmp_path / "w.pth", logdir=tmp_path, resume="last")
    assert_weights(state, saved)


def test_keys_that_do_not_match_are_named_before_training(tmp_path):
    state = weights()
    state["0.weight"] = torch.zeros(8, 5)
    state["extra.weight"] = torch.zeros(2)
    del state["2.bias"]
    torch.save(state, tmp_path / "w.pth")
    with pytest.raises(ValueError, match=r"init_from='.*w.pth' does not match the model: of its tensors, 1 missing "
                                         r"\(2.bias\); 1 unexpected \(extra.weight\); 1 of another shape \(0.weight: "
                                         r"\[8, 5\] in the source, \[8, 4\] in the model\)"):
        start(tmp_path / "w.pth")


def test_a_checkpoint_of_a_model_around_this_one_is_said_so(tmp_path):
    torch.save({f"model.{k}": v for k, v in weights().items()}, tmp_path / "w.pth")
    with pytest.raises(ValueError, match=r"The source's names start with 'model.' where the model's do not"):
        start(tmp_path / "w.pth")


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), r"is a folder without model.safetensors.index.json, model.safetensors or a sharded "
                          r"torchstage checkpoint's .metadata"),
    (lambda p: p.write_bytes(b"not a checkpoint"), r"could not read init_from="),
    (lambda p: torch.save([1, 2], p), r"holds a list, not a state dict"),
    (lambda p: None, r"does not exist"),
])
def test_sources_that_are_none_of_these_are_refused(tmp_path, make, message):
    path = tmp_path / "source"
    make(path)
    with pytest.raises(ValueError, match=message):
        start(path)


def test_check_keys_counts_a_tied_key_present_under_its_other_name():
    class Source:
        path = "x"

        def shapes(self):
            return {"embed.weight": (10, 4)}

    check_keys(Source(), {"embed.weight": (10, 4), "head.weight": (10, 4)}, {"head.weight": "embed.weight"})


def test_a_damaged_pth_is_refused_before_training(tmp_path):
    torch.save(weights(), tmp_path / "w.pth")
    import struct
    import zipfile
    record = next(i for i in zipfile.ZipFile(tmp_path / "w.pth").infolist() if i.filename.endswith("data/0"))
    data = bytearray((tmp_path / "w.pth").read_bytes())
    name, extra = struct.unpack("<HH", data[record.header_offset + 26:record.header_offset + 30])
    data[record.header_offset + 30 + name + extra + 5] ^= 0xFF  # a byte of the first tensor
    (tmp_path / "w.pth").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"init_from='.*w.pth' is damaged: its content does not match the checksum"):
        start(tmp_path / "w.pth")
