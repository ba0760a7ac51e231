"""torchstage plan: each rank's memory for a config's strategy and world, the model built on the meta device, no
process started."""
import os

import torch.distributed as dist

from torchstage.cli import main as cli

CONFIG = os.path.join(os.path.dirname(__file__), "configs", "plan.yml")


def test_the_plan_of_the_configs_world(capsys):
    assert cli(["plan", "-C", CONFIG, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "memory plan: FSDP(" in out and "on 4 process(es) (shard 4) (MiB per rank)" in out
    header, row = out.splitlines()[1:3]
    assert header.split() == ["ranks", "params", "grads", "optimizer", "activations", "buffers", "peak"]
    assert row.split()[0] == "0-3" and float(row.split()[1]) == round(4 * 1025 / 2 ** 20, 1)
    assert not dist.is_initialized()


def test_another_world_and_strategy_from_the_command_line(capsys):
    assert cli(["plan", "-C", CONFIG, "--nprocs", "2", "--set", "strategy=ddp", "--device", "cpu"]) == 0
    assert "memory plan: DDP() on 2 process(es) (MiB per rank)" in capsys.readouterr().out


def test_a_bad_world_is_refused(capsys):
    assert cli(["plan", "-C", CONFIG, "--nprocs", "0"]) == 2
    assert "--nprocs must be >= 1, got 0" in capsys.readouterr().err
    assert cli(["plan", "-C", CONFIG, "--nprocs", "3", "--set", "strategy=hsdp", "--node-size", "2"]) == 2
    assert "does not divide" in capsys.readouterr().err


def test_a_configs_dry_run_plans_instead_of_training(capsys, tmp_path):
    assert cli(["run", "-C", CONFIG, "--set", "dry_run=true", "--set", f"logdir={tmp_path}"]) == 0
    assert not (tmp_path / "checkpoints").exists()


def test_the_llama_example_config_plans_a_7b_model_in_seconds(capsys):
    config = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "configs", "llama_plan.yml")
    assert cli(["plan", "-C", config, "--device", "cuda"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row[0] == "0-7" and float(row[1]) == 3213.1  # 6.74B fp32 parameters over 8 ranks
    assert float(row[5]) > 30_000  # FSDP's default policy gathers the whole base model at once (docs/large-models)
