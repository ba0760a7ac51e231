"""scripts/huggingface_example.py: a save_pretrained folder of a small Llama (sharded safetensors and their index)
loads into FSDP 2 and TP 2 x DP 2 runs built on the meta device, with the first-batch loss of from_pretrained on one
process; the trained weights exported as safetensors load back with from_pretrained and give the trained model's
outputs."""
import ast
import re
import sys

import pytest
import torch

from tests.helpers import ROOT, run_script
from torchstage import CausalLMLoss
from torchstage.cli import main as cli
from torchstage.files.checkpoint_read import load_model_weights

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]
sys.path.insert(0, str(ROOT / "scripts"))
from huggingface_example import counting_data, save_tiny  # noqa: E402


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    save_tiny(str(folder))
    return folder


def example(logdir, pretrained, layout, nproc):
    out = run_script("huggingface_example.py", "train", logdir, pretrained, layout, 1, timeout=600,
                     env={"TORCHSTAGE_NPROC": str(nproc)})
    return out.stdout + out.stderr


def reference_losses(pretrained, dp_size: int) -> list:
    """from_pretrained on this process: the loss of each data-parallel rank's first batch (the distributed sampler
    deals sample i to rank i mod dp_size; the train loader is not shuffled)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(pretrained)
    data = counting_data(256)
    with torch.no_grad():
        return [float(CausalLMLoss()(model(x), y)) for x, y in
                (data[[rank + dp_size * i for i in range(8)]] for rank in range(dp_size))]


def first_losses(out: str) -> list:
    return ast.literal_eval(re.search(r"first batch loss by data-parallel rank: (\[.*?\])", out).group(1))


def continuation(out: str) -> list:
    return ast.literal_eval(re.search(r"5 6 7 8 continues as (\[.*?\])", out).group(1))


def test_the_folder_is_what_save_pretrained_writes(pretrained):
    assert (pretrained / "model.safetensors.index.json").is_file() and (pretrained / "config.json").is_file()
    assert len(list(pretrained.glob("model-0000*-of-0000*.safetensors"))) > 1


@pytest.mark.parametrize("layout, nproc, dp_size, announced", [
    ("fsdp", 2, 2, "strategy FSDP, mesh shard 2"),
    ("tp", 4, 2, "strategy ModelParallel, mesh shard 2 x tensor 2, data-parallel 2 x tensor-parallel 2"),
])
def test_pretrained_weights_load_into_shards_with_from_pretrained_s_first_loss(pretrained, tmp_path, layout, nproc,
                                                                               dp_size, announced):
    out = example(tmp_path / "logs", pretrained, layout, nproc)
    assert announced in out
    assert first_losses(out) == pytest.approx(reference_losses(pretrained, dp_size), abs=1e-5)
    if layout == "tp":
        exported_matches_the_trained_model(tmp_path, pretrained, out)


def exported_matches_the_trained_model(tmp_path, pretrained, out):
    """The TP run's checkpoint exported: from_pretrained continues the prompt as the trained sharded model did, and
    its logits are those of the checkpoint's weights in the model class itself."""
    from transformers import AutoConfig, AutoModelForCausalLM
    checkpoint = tmp_path / "logs" / "checkpoints" / "last.pth"
    assert cli(["checkpoint", "export", str(checkpoint), str(tmp_path / "out"), "--format", "safetensors",
                "--config", str(pretrained), "--max-shard-size", "100KB"]) == 0
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tokens = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        for _ in range(6):
            tokens = torch.cat([tokens, exported(tokens).logits[:, -1:].argmax(-1)], dim=1)
    assert tokens[0, 4:].tolist() == continuation(out)
    trained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(pretrained))
    load_model_weights(trained, str(checkpoint))
    probe = counting_data(4, seed=5)[:][0]
    with torch.no_grad():
        torch.testing.assert_close(exported(probe).logits, trained(probe).logits, atol=1e-6, rtol=0)
