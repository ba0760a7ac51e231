"""torchstage checkpoint export: a model's weights as safetensors from a checkpoint file or a sharded directory, in
one file or in shards with their index; what it cannot do is refused naming the argument."""
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.helpers import tiny_run
from torchstage import FSDP
from torchstage.cli import main as cli


def model():
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    tiny_run(model(), logdir=base / "file", torch_seed=0)
    tiny_run(model(), logdir=base / "sharded", strategy=FSDP(), torch_seed=1)
    return {kind: base / kind / "checkpoints" / "last.pth" for kind in ("file", "sharded")}


@pytest.mark.parametrize("kind", ["file", "sharded"])
def test_one_file_holds_the_checkpoints_weights(checkpoints, tmp_path, kind, capsys):
    from torchstage.files.checkpoint_read import load_checkpoint
    assert cli(["checkpoint", "export", str(checkpoints[kind]), str(tmp_path / "out"), "--format", "safetensors"]) == 0
    assert "wrote" in capsys.readouterr().out
    weights = load_file(tmp_path / "out" / "model.safetensors")
    saved = load_checkpoint(str(checkpoints[kind]))["models"]["model"]
    assert sorted(weights) == sorted(saved) and all(torch.equal(weights[k], saved[k]) for k in saved)


def test_shards_and_their_index_past_the_shard_size_with_the_config_copied(checkpoints, tmp_path):
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "x"}')
    assert cli(["checkpoint", "export", str(checkpoints["file"]), str(tmp_path / "out"), "--config", str(source),
                "--max-shard-size", "200B"]) == 0
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert (tmp_path / "out" / "config.json").read_text() == '{"model_type": "x"}'


def test_tied_weights_are_written_apart(tmp_path):
    from torchstage.files.safetensors_io import save_safetensors
    shared = torch.randn(3, 2)
    save_safetensors({"embed.weight": shared, "head.weight": shared}, tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    assert torch.equal(weights["embed.weight"], shared) and torch.equal(weights["head.weight"], shared)


@pytest.mark.parametrize("extra, message", [
    (["--config", "/nonexistent"], "--config '/nonexistent' has no config.json"),
    (["--max-shard-size", "5 parsecs"], "a size must be a number of bytes or end in KB, MB, GB or TB"),
    (["--model", "generator"], "has no model 'generator'; it has ['model']"),
])
def test_what_it_cannot_do_is_refused(checkpoints, tmp_path, capsys, extra, message):
    assert cli(["checkpoint", "export", str(checkpoints["file"]), str(tmp_path / "out"), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_holding_weights_is_not_written_into(checkpoints, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_bytes(b"")
    assert cli(["checkpoint", "export", str(checkpoints["file"]), str(tmp_path / "out")]) == 2
    assert "already holds safetensors weights; give a new or empty folder" in capsys.readouterr().err
