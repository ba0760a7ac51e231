"""Run a scripts/catalyst22/ script on real Catalyst 22.04 (its original imports), live, on the machine and in the
test run that runs it on torchstage: the tests compare both runs bit for bit (float summation order depends on the
CPU's kernels, so numbers recorded on another machine cannot be compared). Catalyst 22.04 comes from setup.py's
``catalyst-reference`` extra. By hand: ``python tests/catalyst/catalyst_reference.py SCRIPT [ARGS]``.

Each ``import ... # was: <original import>`` line of the script is put back to its original. Catalyst 22.04 on
torch 2.x needs one patch, applied here only, in the Catalyst process: its scheduler check is ``isinstance(s,
torch.optim.lr_scheduler._LRScheduler)``, which torch 2's schedulers no longer pass, so without it Catalyst never
steps a scheduler. And Catalyst 22.04 runs as installed without its optional integrations (the scripts use
none): its settings import every one it finds to see whether it is there (DeepSpeed, MLflow, scikit-learn...),
which would double the time of each run.
"""
import importlib.util
import os
import re
import runpy
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts", "catalyst22")
EXTRA = 'pip install -e ".[catalyst-reference]"'
#: What Catalyst 22.04's settings probe for its optional integrations; the Catalyst process sees them absent.
INTEGRATIONS = ("deepspeed", "mlflow", "sklearn", "pandas", "matplotlib", "onnx", "onnxruntime", "cv2", "imageio",
                "skimage", "torchvision", "wandb", "comet_ml", "neptune", "fairscale", "apex", "torch_xla")


def catalyst_source(text: str) -> str:
    """The script as written for Catalyst: each ``<line>  # was: <original>`` becomes ``<original>``."""
    return re.sub(r"^(\s*)\S.*#\s*was:\s*(.+)$", r"\1\2", text, flags=re.MULTILINE)


def script_command(script: str, logdir, catalyst: bool = False) -> list:
    """The command running scripts/catalyst22/<script> on torchstage, or on Catalyst 22.04 through this file."""
    path = os.path.join(SCRIPTS, script)
    return [sys.executable, *([os.path.abspath(__file__)] if catalyst else []), path, str(logdir)]


def script_env() -> dict:
    """One environment for both runs (one intra-op thread, torchstage importable from this checkout)."""
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}


class CatalystRun:
    """One script's run on Catalyst 22.04, started in the background (it overlaps torchstage's run)."""

    def __init__(self, script: str, logdir):
        self.script, self._output = script, None
        self._process = subprocess.Popen(script_command(script, logdir, catalyst=True), env=script_env(), text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def stdout(self) -> str:
        """What the script printed on Catalyst (waits for it once); a failed run fails the test."""
        if self._output is None:
            out, err = self._process.communicate(timeout=300)
            assert self._process.returncode == 0, f"{self.script} on Catalyst 22.04:\n{out[-3000:]}{err[-3000:]}"
            self._output = out
        return self._output

    def lines(self) -> list:
        return self.stdout().strip().splitlines()


class Catalyst2204:
    """The module's Catalyst 22.04 runs, one per script, started on first ask and kept (a module-scoped fixture)."""

    def __init__(self, folder):
        if importlib.util.find_spec("catalyst") is None:
            import pytest  # here: the Catalyst process imports this file too

            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true and Catalyst 22.04, these tests' reference, is missing (.ci/run: {EXTRA})")
            pytest.skip(f"Catalyst 22.04 is the reference of these tests: {EXTRA}")
        self.folder, self.runs = folder, {}

    def __call__(self, script: str) -> CatalystRun:
        if script not in self.runs:
            self.runs[script] = CatalystRun(script, os.path.join(self.folder, script[:-len(".py")]))
        return self.runs[script]

    def close(self) -> None:
        for run in self.runs.values():
            if run._process.poll() is None:
                run._process.kill()
                run._process.communicate()


def main(script: str, *args) -> None:
    import torch.optim.lr_scheduler  # patched in this (Catalyst's) process only, before catalyst is imported

    torch.optim.lr_scheduler._LRScheduler = torch.optim.lr_scheduler.LRScheduler
    sys.modules.update(dict.fromkeys(INTEGRATIONS))  # "import deepspeed" raises ModuleNotFoundError here
    with open(script) as f:
        source = catalyst_source(f.read())
    with tempfile.TemporaryDirectory() as folder:
        copy = os.path.join(folder, os.path.basename(script))
        with open(copy, "w") as f:
            f.write(source)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # the script's own helpers (common.py)
        sys.argv = [copy, *args]
        runpy.run_path(copy, run_name="__main__")


if __name__ == "__main__":
    main(*sys.argv[1:])
