"""Every rank a launcher starts seeds its module-level code alike when it imports torchstage: from
TORCHSTAGE_SCRIPT_SEED, else from an id every rank of the job reads alike (the scheduler's job id, torchrun's run id,
Open MPI's job id), kept by requeues and restarts; a process alone is left unseeded."""
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT, script_env
from torchstage.launch.script_seed import FIXED_SEED, SEED_ENV, launched_seed


def ranks(**common):
    """The environments of ranks 0 and 1 of a two-rank launch, from the variables all ranks share."""
    return [{k: v.format(rank=rank) for k, v in common.items()} for rank in (0, 1)]


TORCHRUN = dict(RANK="{rank}", LOCAL_RANK="{rank}", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                TORCHELASTIC_RUN_ID="7f3c")
SLURM = dict(SLURM_JOB_ID="1234", SLURM_STEP_ID="0", SLURM_PROCID="{rank}", SLURM_LOCALID="0", SLURM_NODEID="{rank}",
             SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="node[1-2]", SLURM_STEP_TASKS_PER_NODE="1(x2)",
             SLURM_STEP_NUM_NODES="2")
OPENMPI = dict(OMPI_COMM_WORLD_RANK="{rank}", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="{rank}",
               OMPI_COMM_WORLD_LOCAL_SIZE="2", OMPI_MCA_ess_base_jobid="1326776321")


@pytest.mark.parametrize("launch", [TORCHRUN, SLURM, OPENMPI], ids=["torchrun", "slurm", "openmpi"])
def test_the_ranks_of_one_launch_get_one_seed_and_another_job_another(launch):
    seeds = [launched_seed(env) for env in ranks(**launch)]
    assert seeds[0] is not None and seeds[0] == seeds[1]
    other = {k: v + "9" if k in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid") else v
             for k, v in launch.items()}
    assert launched_seed(ranks(**other)[0]) != seeds[0]


def test_the_scheduler_job_keeps_the_seed_through_requeues_and_launchers_inside_it():
    first = launched_seed(ranks(**SLURM)[0])
    assert launched_seed({**ranks(**SLURM)[1], "SLURM_RESTART_COUNT": "1", "SLURM_STEP_ID": "3"}) == first
    inside = {**ranks(**TORCHRUN)[1], "SLURM_JOB_ID": "1234"}  # srun ... torchrun: the job id, not torchrun's run id
    assert launched_seed(inside) == first


def test_torchrun_without_a_run_id_uses_its_master_and_mpich_across_hosts_a_fixed_seed():
    static = ranks(**{**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"})
    assert launched_seed(static[0]) == launched_seed(static[1]) != launched_seed(ranks(**TORCHRUN)[0])
    hydra = ranks(PMI_RANK="{rank}", PMI_SIZE="2", MPI_LOCALRANKID="0", MPI_LOCALNRANKS="1")  # a rank per host
    assert [launched_seed(env) for env in hydra] == [FIXED_SEED, FIXED_SEED]


def test_a_process_alone_is_not_seeded_and_the_variable_wins_everywhere():
    assert launched_seed({}) is None
    assert launched_seed({**ranks(**TORCHRUN)[0], "WORLD_SIZE": "1"}) is None
    assert launched_seed({"SLURM_JOB_ID": "1234"}) is None  # an salloc shell is no step of several tasks
    assert launched_seed({SEED_ENV: "5"}) == 5 and launched_seed({**ranks(**SLURM)[1], SEED_ENV: "5"}) == 5
    with pytest.raises(ValueError, match=f"{SEED_ENV} must be an integer .*got 'x'"):
        launched_seed({SEED_ENV: "x"})


@pytest.mark.parametrize("launched, seeded", [(True, True), (False, False)])
def test_importing_torchstage_seeds_a_launched_rank_before_the_script_draws(launched, seeded):
    code = ("import torch, torchstage\nfrom torchstage.launch.script_seed import applied_seed\n"
            "print(torch.rand(1).item(), applied_seed())")
    env = script_env(**(ranks(**TORCHRUN)[1] if launched else {}))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    expected = launched_seed(ranks(**TORCHRUN)[0])
    torch.manual_seed(expected)
    assert (float(out[0]) == torch.rand(1).item()) is seeded
    assert out[1] == (str(expected) if seeded else "None")


def test_a_seed_the_script_set_before_importing_torchstage_is_kept():
    code = ("import torch\ntorch.manual_seed(5)\nimport torchstage\nfrom torchstage.launch.script_seed import "
            "applied_seed\nprint(torch.rand(1).item(), applied_seed())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=script_env(**ranks(**TORCHRUN)[1]),
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    torch.manual_seed(5)
    assert float(out[0]) == torch.rand(1).item() and out[1] == "None"
