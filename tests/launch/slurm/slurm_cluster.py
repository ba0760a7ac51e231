"""The local SLURM test cluster (scripts/slurm-local.sh) as a session-scoped pytest fixture.

Use it with ``from tests.launch.slurm.slurm_cluster import slurm_cluster``; the fixture yields an environment
(dict) whose SLURM_CONF points at the cluster. Where SLURM cannot be started here (not root, no
apt-get and no slurmctld) tests skip, except under CI=true where they fail. A cluster that was
already up is left up at the end of the session; one the fixture started is brought down.
"""
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "slurm-local.sh"
_state = {"env": None, "started": False, "users": 0}


def cluster_dir() -> Path:
    return Path(os.environ.get("TORCHSTAGE_SLURM_DIR") or REPO / ".slurm-local")


def unavailable_reason():
    """Why SLURM cannot be started on this machine, or None."""
    if platform.system() != "Linux" or not shutil.which("bash"):
        return "the local SLURM cluster needs Linux and bash"
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (slurmd runs as root)"
    if not shutil.which("slurmctld", path="/usr/sbin:/usr/bin") and not shutil.which("apt-get"):
        return "no slurmctld installed and no apt-get to install it (not Debian?)"
    return None


def skip_or_fail(reason: str):
    """Skip, except under CI=true, where a missing cluster is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def run_script(action: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), action], capture_output=True, text=True, timeout=300)


def clean_env(conf: str) -> dict:
    """os.environ without an enclosing job's SLURM_* variables, pointed at the test cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "MASTER_"))}
    env["SLURM_CONF"] = conf
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def ensure_cluster() -> dict:
    """Bring the cluster up once per session (if not up) and return its client environment."""
    if _state["env"] is None:
        reason = unavailable_reason()
        if reason:
            skip_or_fail(reason)
        was_up = run_script("status").returncode == 0
        if not was_up:
            res = run_script("up")
            if res.returncode != 0:
                pytest.fail(f"scripts/slurm-local.sh up failed:\n{res.stdout}\n{res.stderr}")
        _state["started"] = not was_up
        conf = (cluster_dir() / "env").read_text().split("SLURM_CONF=", 1)[1].strip()
        _state["env"] = clean_env(conf)
    return dict(_state["env"])


@pytest.fixture(scope="session")
def slurm_cluster():
    """Environment (dict) for srun/sbatch/scontrol against the local two-node cluster."""
    env = ensure_cluster()
    _state["users"] += 1  # the fixture may be imported into several modules: the last one out cleans up
    yield env
    _state["users"] -= 1
    if _state["users"] == 0 and _state["started"]:
        run_script("down")
        _state.update(env=None, started=False)
