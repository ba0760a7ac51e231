"""``torchstage run`` as a user runs it: a subprocess on YAML files, checked by weights, files and exit codes."""
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import torchstage
from torchstage.cli import main
from torchstage.data.synthetic import synthetic_regression

from tests import script_server

REPO = Path(torchstage.__file__).resolve().parent.parent

# The foundation script as a config, on a smaller workload: same data, model, optimizer, scheduler, loaders.
FOUNDATION = """\
seed: 7
model: {_target_: torch.nn.Linear, in_features: 10, out_features: 1}
criterion: {_target_: torch.nn.MSELoss}
optimizer: {_target_: torch.optim.Adam}
scheduler: {_target_: torch.optim.lr_scheduler.MultiStepLR, milestones: [1, 2]}
datasets:
  batch_size: 32
  num_workers: 1
  shuffle: false        # the script's DataLoader does not shuffle
  train: &data {_target_: torchstage.data.synthetic.synthetic_regression, num_samples: 1000, num_features: 10, seed: 0}
  valid: *data
num_epochs: 8
verbose: true
"""

# The same run with the script's DataLoaders spelled out as components.
FOUNDATION_LOADERS = FOUNDATION.split("datasets:")[0] + """\
loaders:
  train: &loader
    _target_: torch.utils.data.DataLoader
    dataset: {_target_: torchstage.data.synthetic.synthetic_regression, num_samples: 1000, num_features: 10, seed: 0}
    batch_size: 32
    num_workers: 1
  valid: *loader
num_epochs: 8
verbose: true
"""


def run_cli(*args, cwd, timeout=120):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return script_server.run([sys.executable, "-m", "torchstage", *map(str, args)], env=env, cwd=cwd, timeout=timeout)


def checkpoint(logdir) -> dict:
    return torchstage.load_checkpoint(str(Path(logdir) / "checkpoints" / "last.pth"))


def weights(logdir) -> dict:
    return checkpoint(logdir)["models"]["model"]


def train_script(logdir, seed=7, lr=0.01, num_epochs=3) -> dict:
    """The foundation script with the config's seed: ``set_seed`` before the model is built."""
    torchstage.set_seed(seed)
    loader = DataLoader(synthetic_regression(1000, 10, seed=0), batch_size=32, num_workers=1)
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    torchstage.SupervisedRunner().train(
        model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.MultiStepLR(optimizer, [1, 2]),
        loaders={"train": loader, "valid": loader}, logdir=str(logdir), num_epochs=num_epochs, seed=seed)
    return weights(logdir)


@pytest.fixture(scope="module")
def config_run(tmp_path_factory):
    """One config run with --set overrides (lr, epochs, logdir) that the tests below compare against."""
    folder = tmp_path_factory.mktemp("config_run")
    (folder / "foundation.yml").write_text(FOUNDATION)
    result = run_cli("run", "-C", "foundation.yml", "--set", "optimizer.lr=1e-2", "--set", "num_epochs=3",
                     "--set", "logdir=out", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder, result


def test_config_run_gives_the_scripts_final_weights(config_run, tmp_path):
    folder, result = config_run
    assert "[main] epoch 3/3" in result.stdout
    expected = train_script(tmp_path / "script")
    got = weights(folder / "out")
    assert set(got) == {"weight", "bias"}
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    torchstage.set_seed(7)
    assert not torch.equal(got["weight"], torch.nn.Linear(10, 1).weight)  # it did train


def test_loaders_spelled_as_components_give_the_same_weights(config_run, tmp_path, monkeypatch):
    folder, _ = config_run
    (tmp_path / "loaders.yml").write_text(FOUNDATION_LOADERS)
    monkeypatch.chdir(tmp_path)  # in-process this time: cli.main is what the subprocess runs
    assert main(["run", "-C", "loaders.yml", "--set", "optimizer.lr=0.01", "--set", "num_epochs=3",
                 "--set", "logdir=out", "--set", "verbose=false"]) == 0
    got, expected = weights(tmp_path / "out"), weights(folder / "out")
    assert all(torch.equal(got[name], expected[name]) for name in expected)


def test_saved_config_reproduces_the_run(config_run, monkeypatch):
    folder, _ = config_run
    monkeypatch.chdir(folder)
    saved = torchstage.load_config(folder / "out" / "config.yml")
    assert saved["optimizer"] == {"_target_": "torch.optim.Adam", "lr": 0.01}
    assert saved["num_epochs"] == 3 and saved["seed"] == 7 and saved["logdir"] == "out"
    assert main(["run", "-C", "out/config.yml", "--set", "logdir=again", "--set", "verbose=false"]) == 0
    got, expected = weights(folder / "again"), weights(folder / "out")
    assert all(torch.equal(got[name], expected[name]) for name in expected)


TWO_STAGES = """\
stages:
  warmup:
    num_epochs: 2
    optimizer: {_target_: torch.optim.SGD, lr: 0.05}
  finetune:
    num_epochs: 1
    optimizer: {_target_: torch.optim.Adam, lr: 1e-3}
    datasets:
      batch_size: 100
      train: {_target_: torchstage.data.synthetic.synthetic_regression, num_samples: 300, seed: 0}
      valid: {_target_: torchstage.data.synthetic.synthetic_regression, num_samples: 100, seed: 1}
logdir: two
"""


def test_two_stage_config(tmp_path):
    (tmp_path / "base.yml").write_text(FOUNDATION)
    (tmp_path / "stages.yml").write_text(TWO_STAGES)
    result = run_cli("run", "-C", "base.yml", "stages.yml", "--set", "scheduler=null", "--set", "verbose=false",
                     "--set", "datasets.num_workers=0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = (tmp_path / "two" / "logs" / "train.csv").read_text().splitlines()
    assert [row.split(",")[:3] for row in rows[1:]] == [["warmup", "1", "1"], ["warmup", "2", "2"],
                                                        ["finetune", "1", "3"]]
    assert [float(row.split(",")[-1]) for row in rows[1:]] == [0.05, 0.05, 0.001]  # lr: each stage's optimizer
    state = checkpoint(tmp_path / "two")
    assert state["meta"]["stage_names"] == ["warmup", "finetune"]
    assert state["loop"]["global_batch_step"] == 2 * 32 + 3  # train batches: 1000/32 twice, then 300/100


def test_dry_run_prints_config_and_chains_and_trains_nothing(tmp_path):
    (tmp_path / "base.yml").write_text(FOUNDATION)
    (tmp_path / "stages.yml").write_text(TWO_STAGES)
    result = run_cli("run", "-C", "base.yml", "stages.yml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("# merged config\nseed: 7\n") and "  finetune:\n    num_epochs: 1\n" in out
    assert "# stage 'warmup': 2 epoch(s); loaders train (32 batches), valid (32 batches); criterion MSELoss; " \
           "optimizer SGD; scheduler MultiStepLR" in out
    assert "# stage 'finetune': 1 epoch(s); loaders train (3 batches), valid (1 batches)" in out
    assert out.count("OptimizerCallback") == 2 and out.count("ConfigSaver") == 2
    assert "epoch 1/" not in out and "nothing was trained" in out
    assert not (tmp_path / "two").exists()


def test_config_error_exits_2_with_the_path_and_no_traceback(tmp_path):
    (tmp_path / "base.yml").write_text(FOUNDATION)
    result = run_cli("run", "-C", "base.yml", "--set", "model.in_feature=3", "--set", "logdir=out", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("torchstage run: error: model.in_feature: torch.nn.Linear has no argument "
                                    "'in_feature' (did you mean 'in_features'?); it accepts: "), result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--set", "num_epochs"], "--set 'num_epochs': expected KEY.PATH=VALUE"),
    (["--set", "stages.a.epochs=2"], "stages.a.epochs: unknown stage key 'epochs'"),
    (["--set", "optimizer._target_=torch.optim.Adamm"], "optimizer._target_: cannot import 'torch.optim.Adamm'"),
    (["missing.yml"], "missing.yml: cannot read config file"),
])
def test_config_errors_in_process(tmp_path, monkeypatch, capsys, args, message):
    (tmp_path / "base.yml").write_text(FOUNDATION)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-C", "base.yml", *args, "--set", "logdir=out"]) == 2
    assert capsys.readouterr().err.startswith(f"torchstage run: error: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.distributed
def test_distributed_config_on_two_cpu_processes(tmp_path):
    (tmp_path / "base.yml").write_text(FOUNDATION)
    (tmp_path / "ddp.yml").write_text("distributed: true\nnprocs: 2\nnum_epochs: 2\nlogdir: ddp\nverbose: false\n")
    result = run_cli("run", "-C", "base.yml", "ddp.yml", cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    state = checkpoint(tmp_path / "ddp")
    assert state["meta"]["world_size"] == 2 and state["loop"]["global_epoch_step"] == 2
    assert (tmp_path / "ddp" / "config.yml").exists()


@pytest.mark.distributed
def test_distributed_config_under_torchrun(tmp_path):
    (tmp_path / "base.yml").write_text(FOUNDATION)
    (tmp_path / "ddp.yml").write_text("distributed: true\nnum_epochs: 1\nlogdir: ddp\nverbose: false\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = script_server.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "-m", "torchstage", "run", "-C", "base.yml", "ddp.yml"],
                               env=env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert checkpoint(tmp_path / "ddp")["meta"]["world_size"] == 2
    assert torchstage.load_config(tmp_path / "ddp" / "config.yml")["distributed"] is True


SMALL = """\
model: {_target_: NET, in_features: 10, out_features: 1}
criterion: {_target_: torch.nn.MSELoss}
optimizer: {_target_: torch.optim.SGD, lr: "1e-2"}
datasets:
  batch_size: 16
  train: {_target_: torchstage.data.synthetic.synthetic_regression, num_samples: 64, num_features: 10}
  valid: {_target_: torchstage.data.synthetic.synthetic_regression, num_samples: 32, num_features: 10, seed: 1}
num_epochs: 1
logdir: out
"""


def run_script_cli(*args, cwd):
    """The installed ``torchstage`` script: neither the cwd nor a config's folder is on sys.path (python -P)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return script_server.run([sys.executable, "-P", "-c", "import sys; from torchstage.cli import main; "
                           "sys.exit(main())", *map(str, args)], env=env, cwd=cwd,
                             timeout=120)


@pytest.mark.parametrize("module_in", ["config_folder", "cwd"])
def test_a_module_beside_the_config_or_in_the_cwd_is_importable(tmp_path, module_in):
    (tmp_path / "proj").mkdir()
    folder = tmp_path / "proj" if module_in == "config_folder" else tmp_path
    (folder / "mynet.py").write_text("import torch\n\nclass SmallNet(torch.nn.Linear):\n    pass\n")
    (tmp_path / "proj" / "net.yml").write_text(SMALL.replace("NET", "mynet.SmallNet"))
    result = run_script_cli("run", "-C", "proj/net.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert set(weights(tmp_path / "out")) == {"weight", "bias"}


def test_user_errors_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "run.yml").write_text(SMALL.replace("NET", "torch.nn.Linear"))
    assert run_script_cli("run", "-C", "run.yml", cwd=tmp_path).returncode == 0
    again = run_script_cli("run", "-C", "run.yml", cwd=tmp_path)  # the same logdir twice
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.count("\n") == 1 and again.stderr.startswith(
        "torchstage run: error: logdir 'out' already holds a run (out/checkpoints/last.pth); pass --set resume=last "
        "to continue it, --set overwrite=true to replace it or --set logdir=<another folder>")
    mismatch = run_script_cli("run", "-C", "run.yml", "--set", "model.out_features=3", "--set", "logdir=other",
                              "--set", "criterion._target_=torch.nn.BCEWithLogitsLoss", cwd=tmp_path)  # first batch
    assert mismatch.returncode == 2 and "Traceback" not in mismatch.stderr and mismatch.stderr.count("\n") == 1
    assert mismatch.stderr.startswith("torchstage run: error: BCEWithLogitsLoss compares model output 'logits' of "
                                      "shape [16, 3] (float32) with target 'targets' of shape [16, 1] (float32): it "
                                      "needs both of one shape"), mismatch.stderr


def test_allow_targets_refuses_a_target_outside_the_prefixes_before_importing_it(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef run(**kw):\n    return None\n")
    (tmp_path / "c.yml").write_text(FOUNDATION.replace("criterion: {_target_: torch.nn.MSELoss}",
                                                       "criterion: {_target_: evil.run}"))
    refused = run_cli("run", "-C", "c.yml", "--dry-run", "--allow-targets", "torch,torchstage", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "criterion._target_: 'evil.run' is not under the allowed module prefixes ['torch', 'torchstage']" \
           in refused.stderr
    assert not marker.exists()  # nothing of it was imported, let alone called
    # a function is admitted when the allow-list names it in full (a class of a kind train() takes, by its prefix)
    allowed = run_cli("run", "-C", "c.yml", "--dry-run", "--allow-targets", "torch,torchstage,evil,evil.run", cwd=tmp_path)
    assert marker.exists() and "criterion._target_" not in allowed.stderr


@pytest.mark.parametrize("target, reason", [
    ("torch.os.system", "'torch.os' is the module 'os', which is not under the allowed module prefixes"),
    ("torch.serialization.os.system", "'torch.serialization.os' is the module 'os'"),
    ("torch.hub.urlopen", "is defined in module 'urllib.request', which is not under the allowed module prefixes"),
    ("torch.nn.Module.__init__", "walks through the attribute '__init__'"),
])
def test_allow_targets_checks_where_the_object_is_defined_not_only_its_name(tmp_path, target, reason):
    """A name under an allowed prefix may still lead out of it (``torch.os`` is ``os``): the object is resolved
    step by step and its defining module checked, and nothing outside the prefixes is called."""
    marker = tmp_path / "code-ran"
    (tmp_path / "c.yml").write_text(FOUNDATION.replace(
        "criterion: {_target_: torch.nn.MSELoss}", f"criterion: {{_target_: {target}, command: 'touch {marker}'}}"))
    refused = run_cli("run", "-C", "c.yml", "--dry-run", "--allow-targets", "torch,torchstage", cwd=tmp_path)
    assert refused.returncode == 2 and f"criterion._target_: {target!r}" in refused.stderr, refused.stderr
    assert reason in refused.stderr and "Traceback" not in refused.stderr
    assert not marker.exists()


def test_dry_run_on_a_logdir_holding_a_run_gives_the_fix_as_command_line_options(tmp_path):
    (tmp_path / "run.yml").write_text(SMALL.replace("NET", "torch.nn.Linear"))
    assert run_script_cli("run", "-C", "run.yml", cwd=tmp_path).returncode == 0
    dry = run_script_cli("run", "-C", "run.yml", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 2 and "Traceback" not in dry.stderr
    assert "already holds a run (out/checkpoints/last.pth); pass --set resume=last to continue it" in dry.stderr
    assert "resume='last'" not in dry.stderr and "overwrite=True" not in dry.stderr
    assert run_script_cli("run", "-C", "run.yml", "--dry-run", "--set", "resume=last", cwd=tmp_path).returncode == 0


class _Payload:  # unpickling it runs a shell command: what a malicious .pt file does
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("gadget, reason", [
    ("{_target_: torch.load, f: payload.pt, weights_only: false}",
     "torch.serialization.load unpickles the file, which can run code; it is allowed only with weights_only: true"),
    ("{_target_: torch.load, f: payload.pt}", "it is allowed only with weights_only: true"),
    ("{_target_: torch.hub.load, repo_or_dir: hub, model: entry, source: local}",
     "it is defined in 'torch.hub', which runs a repository's hubconf.py"),
    ("{_target_: torchstage.launch.restarts.supervise, command: [touch, MARKER], world: null, max_restarts: 0}",
     "it is defined in 'torchstage.launch.restarts', which starts and restarts processes"),
    ("{_target_: torch.hub.torch.hub.load, repo_or_dir: hub, model: entry, source: local}", "which runs a repository's"),
    ("{_target_: torch.multiprocessing.start_processes, fn: null}", "which starts processes"),
    ("{_target_: torch.utils.benchmark.Timer, stmt: 'import os'}", "executes statements given as strings"),
    ("{_target_: torch.serialization._load, zip_file: payload.pt}", "names the private '_load'"),
    ("{_target_: torch.ops.load_library, path: payload.pt}", "torch._ops.load_library loads a native library"),
])
def test_allow_targets_refuses_what_runs_code_even_below_an_allowed_prefix(tmp_path, gadget, reason):
    """Each gadget sits under ``torch``/``torchstage`` and ran its payload before: refused, nothing ran."""
    marker = tmp_path / "code-ran"
    torch.save({"x": _Payload(marker)}, tmp_path / "payload.pt")
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "hubconf.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef entry():\n    return 1\n")
    (tmp_path / "c.yml").write_text(FOUNDATION.replace(
        "criterion: {_target_: torch.nn.MSELoss}", f"criterion: {gadget.replace('MARKER', str(marker))}"))
    refused = run_cli("run", "-C", "c.yml", "--dry-run", "--allow-targets", "torch,torchstage", cwd=tmp_path)
    assert refused.returncode == 2 and "criterion._target_: " in refused.stderr, refused.stderr
    assert "refused under --allow-targets even below an allowed prefix" in refused.stderr or "private" in reason
    assert reason in refused.stderr and "Traceback" not in refused.stderr
    assert not marker.exists()


def test_a_safe_torch_load_stays_allowed_and_without_an_allow_list_nothing_changes(tmp_path, monkeypatch):
    from torchstage.config.instantiate import ALLOWED_TARGETS_VAR, instantiate
    torch.save(torch.arange(3.0), tmp_path / "weights.pt")
    node = {"_target_": "torch.load", "f": str(tmp_path / "weights.pt"), "weights_only": True}
    monkeypatch.setenv(ALLOWED_TARGETS_VAR, "torch,torchstage,torch.load")  # a function is listed by full name
    assert torch.equal(instantiate(node, "criterion.weight"), torch.arange(3.0))
    monkeypatch.delenv(ALLOWED_TARGETS_VAR)
    assert torch.equal(instantiate({**node, "weights_only": False}, "x"), torch.arange(3.0))  # a config is code
