"""``torchstage env``: the world train() would form, from arguments, torchrun variables or a real SLURM step."""
import json
import os
import subprocess
import sys

import pytest

from tests import script_server
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401

TORCHSTAGE = [sys.executable, "-m", "torchstage"]
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHSTAGE_", "RANK", "WORLD_SIZE",
                                                                  "LOCAL_RANK", "MASTER_"))}


def env_json(*args, env=None):
    result = script_server.run([*TORCHSTAGE, "env", "--json", *args], env={**CLEAN, **(env or {})}, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_single_process_on_a_plain_machine():
    info = env_json()
    assert (info["source"], info["rank"], info["world_size"], info["spawn"]) == ("single", 0, 1, 0)


def test_torchrun_variables_decide():
    info = env_json(env={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.7",
                         "MASTER_PORT": "29511"})
    assert (info["source"], info["rank"], info["world_size"], info["local_rank"]) == ("torchrun", 3, 4, 1)
    assert (info["master_addr"], info["master_port"]) == ("10.0.0.7", 29511)
    assert info["variables"]["RANK"] == "3"


def test_every_variable_a_launcher_environment_reads_is_shown():
    """The shown variables derive from the launcher environments: none is left out, none is hand-kept."""
    from torchstage.launch.resolve import ENVIRONMENTS, LOCAL_VARIABLES, variables_read
    read = [name for env in ENVIRONMENTS for name in env.variables] + list(LOCAL_VARIABLES)
    assert set(variables_read()) == set(read) and len(variables_read()) == len(set(read))
    shown = env_json(env={"GROUP_WORLD_SIZE": "2", "PALS_NODEID": "1", "LSB_MCPU_HOSTS": "a 1 b 4"})["variables"]
    assert {"GROUP_WORLD_SIZE": "2", "PALS_NODEID": "1", "LSB_MCPU_HOSTS": "a 1 b 4"}.items() <= shown.items()


def test_local_launch_from_nprocs_and_text_output():
    info = env_json("--nprocs", "3")
    assert (info["source"], info["world_size"], info["spawn"], info["backend"]) == ("arguments", 3, 3, "gloo")
    text = script_server.run([*TORCHSTAGE, "env"], env={**CLEAN, "TORCHSTAGE_NPROC": "2"})
    assert "decided by:   local" in text.stdout and "launcher of 2 local process(es), ranks 0..1" in text.stdout


def test_bad_setting_is_a_clear_error():
    result = script_server.run([*TORCHSTAGE, "env"], env={**CLEAN, "TORCHSTAGE_NPROC": "x"})
    assert result.returncode == 2
    assert "TORCHSTAGE_NPROC must be an integer, got 'x'" in result.stderr


def test_every_task_of_a_real_srun_step_sees_its_rank_and_one_master(slurm_cluster):  # noqa: F811
    result = subprocess.run(["srun", "-N", "2", "--ntasks-per-node=2", *TORCHSTAGE, "env", "--json"],
                            capture_output=True, text=True, timeout=120, env=slurm_cluster)
    assert result.returncode == 0, result.stderr
    infos = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sorted(i["rank"] for i in infos) == [0, 1, 2, 3]
    assert {i["source"] for i in infos} == {"slurm"} and {i["world_size"] for i in infos} == {4}
    assert len({(i["master_addr"], i["master_port"]) for i in infos}) == 1


@pytest.mark.mpi
def test_real_mpirun_ranks_see_openmpi_and_why():
    import shutil

    import pytest
    if not shutil.which("mpirun"):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true and mpirun is missing (.ci/run installs openmpi-bin)")
        pytest.skip("mpirun is not installed")
    result = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", *TORCHSTAGE, "env",
                             "--json"], capture_output=True, text=True, timeout=120, env=CLEAN)
    assert result.returncode == 0, result.stderr
    infos = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sorted(i["rank"] for i in infos) == [0, 1] and {i["source"] for i in infos} == {"openmpi"}
    assert all(i["why"].startswith("openmpi: OMPI_COMM_WORLD_RANK=") for i in infos)
    assert len({(i["master_addr"], i["master_port"]) for i in infos}) == 1
    rows = {row["name"]: row["applies"] for row in infos[0]["environments"]}
    assert rows == {"torchrun": False, "slurm": False, "lsf": False, "pals": False, "openmpi": True, "mpich": False}


def test_text_output_lists_every_launcher_and_the_batch_script_error():
    env = {**CLEAN, "PMI_RANK": "0", "PMI_SIZE": "1"}
    text = script_server.run([*TORCHSTAGE, "env"], env=env, timeout=60).stdout
    assert "decided by:   mpich" in text and "why:          mpich: PMI_RANK=0, PMI_SIZE=1" in text
    assert "  mpich     applies: PMI_RANK=0, PMI_SIZE=1" in text and "  torchrun  not present" in text
    batch = {**CLEAN, "ENVIRONMENT": "BATCH", "SLURM_JOB_ID": "8", "SLURM_NTASKS": "2"}
    result = script_server.run([*TORCHSTAGE, "env"], env=batch, timeout=60)
    assert result.returncode == 2 and "but srun did not start it" in result.stderr
