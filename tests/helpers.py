"""Running real multi-process training scripts from tests: subprocess, timeout, this checkout on the path."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script_env(nproc=None, **extra) -> dict:
    """The environment of a test run: this checkout first on PYTHONPATH, no inherited world variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHSTAGE_NPROC",
                        "TORCHSTAGE_LAUNCHED", "TORCHSTAGE_PARENT_PID") and not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU/gloo in tests, also on a GPU machine
    if nproc is not None:
        env["TORCHSTAGE_NPROC"] = str(nproc)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, nproc=None, timeout=120, **extra) -> subprocess.CompletedProcess:
    """Run ``python *args`` (or a full command when args[0] is '-m') in the repo root; capture output."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=script_env(nproc, **extra),
                          capture_output=True, text=True, timeout=timeout)


def alive(pid: int) -> bool:
    """True if process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
