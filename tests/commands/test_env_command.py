"""``torchstage env``: the world train() would form, from arguments, torchrun variables or a real SLURM step."""
import json
import os
import subprocess
import sys

from tests.slurm_cluster import slurm_cluster  # noqa: F401

TORCHSTAGE = [sys.executable, "-m", "torchstage"]
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHSTAGE_", "RANK", "WORLD_SIZE",
                                                                  "LOCAL_RANK", "MASTER_"))}


def env_json(*args, env=None):
    result = subprocess.run([*TORCHSTAGE, "env", "--json", *args], capture_output=True, text=True, timeout=60,
                            env={**CLEAN, **(env or {})})
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


def test_local_launch_from_nprocs_and_text_output():
    info = env_json("--nprocs", "3")
    assert (info["source"], info["world_size"], info["spawn"], info["backend"]) == ("arguments", 3, 3, "gloo")
    text = subprocess.run([*TORCHSTAGE, "env"], capture_output=True, text=True, env={**CLEAN, "TORCHSTAGE_NPROC": "2"})
    assert "decided by:   local" in text.stdout and "launcher of 2 local process(es), ranks 0..1" in text.stdout


def test_bad_setting_is_a_clear_error():
    result = subprocess.run([*TORCHSTAGE, "env"], capture_output=True, text=True, env={**CLEAN, "TORCHSTAGE_NPROC": "x"})
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
