"""``--allow-targets`` admits what it names: components of the kinds ``train()`` takes below an allowed prefix, and
callables listed by their full name; it imports no module a config names before checking it, and never admits what
writes files or starts processes. Each gadget below ran its payload before; here its marker file never appears."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.commands.test_run_command import FOUNDATION, REPO, run_cli
from tests.commands.test_tune import CONFIGS, tune

SYNTHETIC = "torchstage.data.synthetic.synthetic_regression"
ALLOW = f"torch,torchstage,{SYNTHETIC}"


def _config(tmp_path, criterion: str) -> None:
    (tmp_path / "c.yml").write_text(FOUNDATION.replace("criterion: {_target_: torch.nn.MSELoss}",
                                                       f"criterion: {criterion}"))


def _refused(run, fragment):
    assert run.returncode == 2, run.stderr[-3000:]
    assert "criterion._target_: " in run.stderr and fragment in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr


LAUNCH = "{_target_: torch.distributed.launch.main, args: [--standalone, --nproc-per-node=1, --no-python, touch, MARKER]}"
WRITE = "{_target_: torchstage.files.atomic.write_atomic, path: MARKER, data: !!binary aW1wb3J0IG9zCg==}"
SAVE = "{_target_: torch.save, obj: 1, f: MARKER}"


@pytest.mark.parametrize("gadget, allow, reason", [
    (LAUNCH, ALLOW, "it is in 'torch.distributed.launch', which starts processes; nothing was imported"),
    (LAUNCH, f"{ALLOW},torch.distributed.launch.main", "'torch.distributed.launch', which starts processes"),
    (WRITE, ALLOW, "it is defined in 'torchstage.files.atomic', which writes files"),
    (WRITE, f"{ALLOW},torchstage.files.atomic.write_atomic", "it is defined in 'torchstage.files.atomic', which "
                                                             "writes files"),
    (SAVE, ALLOW, "torch.serialization.save writes files"),
    ("{_target_: evilpkg.dump, path: MARKER}", f"{ALLOW},evilpkg", "'evilpkg.dump' is refused under --allow-targets: "
                                                                   "it is a function, not a component of a kind"),
    (SAVE, f"{ALLOW},torch.save", "torch.serialization.save writes files"),
    ("{_target_: torchstage.launch.restarts.supervise, command: [touch, MARKER], world: null, max_restarts: 0}",
     f"{ALLOW},torchstage.launch.restarts.supervise", "which starts and restarts processes"),
])
def test_a_gadget_is_refused_whatever_the_allow_list_names(tmp_path, gadget, allow, reason):
    """Under allowed prefixes a function is refused unless listed by full name; listed, what writes files or
    starts processes is refused all the same; nothing ran, no file was written."""
    marker = tmp_path / "site" / "evil.pth"
    marker.parent.mkdir()
    (tmp_path / "evilpkg.py").write_text("def dump(path):\n    open(path, 'w').write('import os')\n")
    _config(tmp_path, gadget.replace("MARKER", str(marker)))
    _refused(run_cli("run", "-C", "c.yml", "--dry-run", "--allow-targets", allow, cwd=tmp_path), reason)
    assert not marker.exists() and list(marker.parent.iterdir()) == []


def test_a_target_module_is_not_imported_before_it_is_checked(tmp_path):
    """``torch.utils.model_dump.__main__`` runs its module code when imported: refused before any import, and a
    module the package's import did not bring in is neither imported nor run."""
    code = textwrap.dedent(f"""
        import os, sys
        os.environ["TORCHSTAGE_ALLOWED_TARGETS"] = "torch,torchstage"
        from torchstage.config.instantiate import ConfigError, import_target
        for target in ["torch.utils.model_dump.__main__", "torch.utils.model_dump.main",
                       "torch.utils.hipify.hipify_python.hipify"]:
            try:
                import_target(target, "model")
            except ConfigError as exc:
                print("refused:", exc)
        print("imported:", [m for m in sys.modules if m.startswith(("torch.utils.model_dump", "torch.utils.hipify"))])
    """)
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[-1] == "imported: []", ran.stdout
    assert lines[0].startswith("refused: model._target_: 'torch.utils.model_dump.__main__' walks through the "
                               "attribute '__main__'"), ran.stdout
    assert "it is in 'torch.utils.model_dump', which runs its module code when imported; nothing was imported" \
        in lines[1], ran.stdout
    assert "'torch.utils.hipify' is not imported by importing 'torch'" in lines[2], ran.stdout  # it writes files


def test_a_user_module_beside_the_config_is_admitted_for_its_components_and_listed_functions(tmp_path):
    """A model class in an allowed package is a component of a kind train() takes: admitted. A function of it is
    refused until --allow-targets lists it by full name, as the message says; then the run trains."""
    (tmp_path / "mynet.py").write_text(textwrap.dedent("""
        import torch
        from torchstage.data.synthetic import synthetic_regression

        class SmallNet(torch.nn.Linear):
            def __init__(self):
                super().__init__(10, 1)

        def data(num_samples):
            return synthetic_regression(num_samples=num_samples, num_features=10, seed=0)
    """))
    config = FOUNDATION.replace("{_target_: torch.nn.Linear, in_features: 10, out_features: 1}", "{_target_: mynet.SmallNet}")
    config = config.replace(f"{{_target_: {SYNTHETIC}, num_samples: 1000, num_features: 10, seed: 0}}",
                            "{_target_: mynet.data, num_samples: 64}").replace("num_epochs: 8", "num_epochs: 1")
    (tmp_path / "c.yml").write_text(config)
    refused = run_cli("run", "-C", "c.yml", "--allow-targets", "torch,torchstage,mynet", cwd=tmp_path)
    assert refused.returncode == 2 and "datasets.train._target_: 'mynet.data' is refused under --allow-targets: it "\
                                       "is a function, not a component of a kind train() takes" in refused.stderr, \
        refused.stderr[-2000:]
    assert "list it by its full name: --allow-targets torch,torchstage,mynet,mynet.data" in refused.stderr
    ran = run_cli("run", "-C", "c.yml", "--allow-targets", "torch,torchstage,mynet,mynet.data",
                  "--set", f"logdir={tmp_path / 'out'}", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "out" / "checkpoints" / "last.pth").exists()


def test_a_module_the_package_does_not_import_is_imported_once_the_allow_list_names_it(tmp_path):
    """The fix the refusal gives (name the module in --allow-targets) works."""
    (tmp_path / "mypkg" / "models").mkdir(parents=True)
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "models" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "models" / "net.py").write_text(
        "import torch\n\nclass Net(torch.nn.Linear):\n    def __init__(self):\n        super().__init__(10, 1)\n")
    config = FOUNDATION.replace("{_target_: torch.nn.Linear, in_features: 10, out_features: 1}",
                                "{_target_: mypkg.models.net.Net}")
    (tmp_path / "c.yml").write_text(config)
    refused = run_cli("run", "-C", "c.yml", "--dry-run", "--allow-targets", f"{ALLOW},mypkg", cwd=tmp_path)
    assert refused.returncode == 2 and "model._target_: 'mypkg.models' is not imported by importing 'mypkg'" \
        in refused.stderr, refused.stderr[-2000:]
    assert "name it in --allow-targets (e.g. mypkg.models.net)" in refused.stderr
    ran = run_cli("run", "-C", "c.yml", "--dry-run", "--allow-targets", f"{ALLOW},mypkg.models.net", cwd=tmp_path)
    assert ran.returncode == 0 and "every component was built" in ran.stdout, ran.stderr[-2000:]


def test_tune_refuses_a_process_starting_sampler_before_any_trial(tmp_path):
    marker = tmp_path / "code-ran"
    (tmp_path / "bad.yml").write_text(f"tune: {{sampler: {{_target_: torch.distributed.launch.main, args: "
                                      f"[--standalone, --nproc-per-node=1, --no-python, touch, {marker}]}}}}\n")
    allow = f"{ALLOW},optuna,tests.commands.tune_probe,torch.distributed.launch.main"
    ran = tune(tmp_path, "--allow-targets", allow, configs=[*CONFIGS, tmp_path / "bad.yml"])
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert "tune.sampler._target_: 'torch.distributed.launch.main' is refused under --allow-targets" in ran.stderr
    assert "which starts processes" in ran.stderr and "Traceback" not in ran.stderr
    assert not marker.exists() and not (tmp_path / "study.db").exists()
