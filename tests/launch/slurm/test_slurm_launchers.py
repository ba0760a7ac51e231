"""On the real local SLURM cluster: srun + torchrun per node forms one world, an sbatch script that forgot
srun fails fast with the fix, and `torchstage slurm` scripts of both launcher forms train.

The training script is the tutorial regression with distributed=None (scripts/launch_anywhere.py); each
rank reports the world it trained in and its metrics.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from tests import script_server
from tests.helpers import ROOT
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401 (session fixture)
from torchstage.launch.slurm.step import master_port

TRAIN = str(ROOT / "scripts" / "launch_anywhere.py")
pytestmark = pytest.mark.timeout(400)


def reports(logdir, n):
    return [json.loads((logdir / f"report-rank{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("single")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = script_server.run([sys.executable, TRAIN, str(logdir)], env=env, timeout=200)
    assert result.returncode == 0, result.stderr
    return reports(logdir, 1)[0]["metrics"]


def assert_one_world(logdir, n, source, single):
    ranks = reports(logdir, n)
    assert [r["rank"] for r in ranks] == list(range(n)) and {r["world_size"] for r in ranks} == {n}
    assert {r["source"] for r in ranks} == {source} and len({r["master"] for r in ranks}) == 1
    for report in ranks:
        assert report["metrics"]["valid"]["loss"] == pytest.approx(single["valid"]["loss"], abs=1e-6)
    return ranks


def test_srun_plus_torchrun_per_node_forms_one_world_of_four(slurm_cluster, tmp_path, single):  # noqa: F811
    port = master_port(os.getpid(), {})  # any port free on node1; the test's pid keeps parallel runs apart
    command = ["srun", "-N", "2", "--ntasks-per-node=1", "torchrun", "--nnodes", "2", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"node1:{port}", TRAIN, str(tmp_path)]
    result = subprocess.run(command, env=slurm_cluster, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = assert_one_world(tmp_path, 4, "torchrun", single)
    assert [r["node_rank"] for r in ranks] == [0, 0, 1, 1]


@pytest.mark.waits  # how fast it fails
def test_sbatch_of_two_tasks_without_srun_fails_fast_with_the_fix(slurm_cluster, tmp_path):  # noqa: F811
    out = tmp_path / "job.out"
    start = time.monotonic()
    result = subprocess.run(["sbatch", "--wait", "-N", "2", "--ntasks-per-node=1", "-o", str(out), "--wrap",
                             f"{sys.executable} {TRAIN} {tmp_path}"], env=slurm_cluster, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert time.monotonic() - start < 60
    text = out.read_text()
    assert "(ENVIRONMENT=BATCH), whose allocation has SLURM_NTASKS=2 tasks, but srun did not start it" in text
    assert "Start it with 'srun python ...'" in text
    assert not list(tmp_path.glob("report-rank*.json"))


@pytest.mark.parametrize("form, extra, world", [("srun", [], 2), ("torchrun", ["--nproc-per-node", "1"], 2)])
def test_generated_script_of_each_launcher_form_trains(slurm_cluster, tmp_path, single, form, extra, world):  # noqa: F811
    out = tmp_path / "job.out"
    command = [sys.executable, "-m", "torchstage", "slurm", "--launcher", form, "--nodes", "2", "--time", "5",
               "--output", str(out), "--setup", "export OMP_NUM_THREADS=1", *extra,
               "--save", str(tmp_path / "job.sbatch"), "--submit", "--wait", "--", sys.executable, TRAIN, str(tmp_path)]
    result = subprocess.run(command, env=slurm_cluster, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    log = out.read_text() if out.exists() else ""
    assert result.returncode == 0, result.stderr + log[-3000:]
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    assert_one_world(tmp_path, world, "torchrun" if form == "torchrun" else "slurm", single)


@pytest.mark.mpi
def test_mpirun_inside_an_sbatch_allocation_is_one_open_mpi_world(slurm_cluster, tmp_path):  # noqa: F811
    """Open MPI starts its daemons as one srun task per node; the ranks carry that step's variables, and
    the MPI world (4) decides, meeting on the allocation's first node at the job's port."""
    import shutil
    if not shutil.which("mpirun"):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true and mpirun is missing (.ci/run installs openmpi-bin)")
        pytest.skip("mpirun is not installed")
    out = tmp_path / "job.out"
    script = f"mpirun --allow-run-as-root --oversubscribe -np 4 {sys.executable} -m torchstage env --json"
    result = subprocess.run(["sbatch", "--wait", "-N", "2", "--ntasks-per-node=1", "-o", str(out), "--parsable",
                             "--wrap", script], env=slurm_cluster, capture_output=True, text=True, timeout=120)
    text = out.read_text()
    assert result.returncode == 0, text[-3000:]
    job_id = result.stdout.strip().split(";")[0]
    infos = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert sorted(i["rank"] for i in infos) == [0, 1, 2, 3] and {i["world_size"] for i in infos} == {4}
    assert {i["source"] for i in infos} == {"openmpi"} and all(f"inside SLURM job {job_id}" in i["why"] for i in infos)
    assert {(i["master_addr"], i["master_port"]) for i in infos} == {("127.0.0.1", master_port(int(job_id), {}))}
    assert sorted(i["node_rank"] for i in infos) == [0, 0, 1, 1]
