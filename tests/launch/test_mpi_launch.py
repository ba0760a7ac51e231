"""Real MPI launches: Open MPI's mpirun and MPICH's mpiexec start the tutorial regression with
distributed=None; the processes form one gloo world and train to the single process's metrics."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, script_env

TRAIN = ROOT / "scripts" / "launch_anywhere.py"
LAUNCHERS = {
    "openmpi": ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np"],
    "mpich": ["mpiexec.mpich", "-np"],
}
pytestmark = [pytest.mark.distributed, pytest.mark.mpi, pytest.mark.timeout(300)]


def launcher(name):
    """The launch command, or skip (fail under CI=true: .ci/run installs openmpi-bin and mpich)."""
    command = LAUNCHERS[name]
    if not shutil.which(command[0]):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {command[0]} is missing (apt-get install openmpi-bin mpich)")
        pytest.skip(f"{command[0]} is not installed (apt-get install openmpi-bin mpich)")
    return command


def reports(logdir, n):
    return [json.loads((logdir / f"report-rank{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("single")
    result = script_server.run([sys.executable, str(TRAIN), str(logdir)], env=script_env(), cwd=ROOT, timeout=200)
    assert result.returncode == 0, result.stdout + result.stderr
    return reports(logdir, 1)[0]


@pytest.mark.parametrize("name, nproc", [("openmpi", 2), ("openmpi", 4), ("mpich", 2), ("mpich", 4)])
def test_mpi_launch_forms_one_world_with_single_process_metrics(name, nproc, single, tmp_path):
    command = launcher(name) + [str(nproc), sys.executable, str(TRAIN), str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=250)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = reports(tmp_path, nproc)
    assert [r["rank"] for r in ranks] == list(range(nproc))
    assert {r["world_size"] for r in ranks} == {nproc}  # one world, as torch.distributed saw it
    assert {r["source"] for r in ranks} == {name}
    assert len({r["pid"] for r in ranks}) == nproc and len({r["master"] for r in ranks}) == 1
    assert single["world_size"] == 1 and single["source"] == "single"
    for report in ranks:
        for loader in ("train", "valid"):
            assert report["metrics"][loader]["loss"] == pytest.approx(single["metrics"][loader]["loss"], abs=1e-6)
    assert (tmp_path / "checkpoints" / "last.pth").exists()
    assert result.stdout.count("epoch 2/2") == 1  # the console logs once, from rank 0


@pytest.mark.parametrize("name", ["openmpi", "mpich"])
def test_one_mpi_task_per_node_starts_the_nodes_ranks(name, single, tmp_path):
    """``mpirun -np <nodes>`` with one task per node and 2 local devices (TORCHSTAGE_NPROC on CPU): the task forks
    the node's ranks from a preloaded process, and they train to the single process's metrics."""
    command = launcher(name) + ["1", sys.executable, str(TRAIN), str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=script_env(2), capture_output=True, text=True, timeout=250)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "starting 2 processes (gloo, ranks 0-1 of 2) forked from a preloaded process" in out
    ranks = reports(tmp_path, 2)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    for report in ranks:
        assert report["metrics"]["valid"]["loss"] == pytest.approx(single["metrics"]["valid"]["loss"], abs=1e-6)


EXCHANGE = """
from torchstage.launch.environments.mpi import exchange_through_mpi4py
from torchstage.launch.resolve import resolve_world
import json, os
rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
print("EXCHANGE" + json.dumps([rank, exchange_through_mpi4py(rank, size)]), flush=True)
"""


def test_rank0_host_and_port_through_mpi4py(tmp_path):
    """The path for MPI launches across hosts without a scheduler host list: rank 0 shares host and a free port."""
    if os.environ.get("CI", "").lower() != "true":  # under CI .ci/run installs torchstage[mpi]
        pytest.importorskip("mpi4py")
    command = launcher("openmpi") + ["2", sys.executable, "-c", EXCHANGE]
    result = subprocess.run(command, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = sorted(json.loads(row) for row in re.findall(r"EXCHANGE(\[.*?\]\])", result.stdout))
    assert [r[0] for r in rows] == [0, 1]
    (host0, port0), (host1, port1) = rows[0][1], rows[1][1]
    assert (host0, port0) == (host1, port1) and 1024 <= port0 < 65536
    assert host0 == socket.gethostname()
