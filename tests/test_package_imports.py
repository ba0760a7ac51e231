"""``import torchstage`` loads what a run needs and nothing more; every public name still resolves, and static tools
see them all."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import torchstage
from tests.helpers import ROOT, script_env

#: Modules a bare ``import torchstage`` must not load: optional integrations, the CLI, the Catalyst layer, the loop,
#: report/plot code and torch's heavy corners (each loads when first used).
HEAVY = ("mlflow", "tensorboardX", "tensorboard", "torch.utils.tensorboard", "matplotlib", "deepspeed", "optuna",
         "torchmetrics", "yaml", "torch.distributed.checkpoint", "torch._dynamo", "torch.distributed.fsdp",
         "torchstage.catalyst", "torchstage.commands", "torchstage.cli", "torchstage.config", "torchstage.runner",
         "torchstage.callbacks", "torchstage.strategies", "torchstage.files.reports", "torchstage.launch")
#: What of them the seed hook of a launched rank (issue 54: module-level data alike on every rank) needs at import:
#: the launch seed's module alone (torch and the rng helpers), not the launchers.
SEED_HOOK = ("torchstage.launch", "torchstage.launch.script_seed")


def modules_after(code: str) -> list:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_import_torchstage_loads_none_of_the_heavy_modules():
    loaded = modules_after("import torchstage")
    heavy = [name for name in loaded if any(name == h or name.startswith(h + ".") for h in HEAVY)
             and name not in SEED_HOOK]
    assert heavy == []
    ours = [name for name in loaded if name.split(".")[0] == "torchstage"]
    # the package, its version, the metrics package and the seed hook with torchstage.rng (189 before names were lazy)
    assert len(ours) <= 13, ours


def test_a_name_loads_its_module_on_first_use_only():
    loaded = modules_after("import torchstage\ntorchstage.set_seed(0)")
    assert "torchstage.rng" in loaded and "torchstage.runner.runner" not in loaded


def test_every_public_name_resolves_and_is_listed():
    missing = [name for name in torchstage.__all__ if getattr(torchstage, name, None) is None]
    assert missing == []
    assert set(torchstage.__all__) <= set(dir(torchstage))
    from torchstage import dl, metrics, utils  # Catalyst's spelling of the same modules
    assert dl is utils is torchstage and metrics.AdditiveMetric is metrics.AdditiveValueMetric
    assert torchstage.SupervisedRunner.__module__ == "torchstage.catalyst.runners"


def test_static_tools_see_the_same_names_as_the_lazy_table():
    """pyright and ``help()`` read the TYPE_CHECKING imports; at run time names come from ``_PUBLIC``: the two agree."""
    tree = ast.parse(Path(torchstage.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
                 "TYPE_CHECKING")
    static = {}
    for node in block.body:
        static.setdefault(node.module, []).extend(alias.name for alias in node.names)
    assert {module: tuple(names) for module, names in static.items()} == torchstage._PUBLIC
    names = [name for names in torchstage._PUBLIC.values() for name in names]
    assert sorted(names) == sorted(set(names)) == sorted(torchstage.__all__)
