"""SLURM layouts that would hang or idle GPUs fail before any collective, saying what was found and the fix."""
import pytest

from torchstage.launch.resolve import resolve_world
from torchstage.launch.slurm.step import SlurmConfigError, master_port

# What the batch script of `sbatch -N 2 --ntasks-per-node=1` sees (measured on the local cluster).
BATCH = {"ENVIRONMENT": "BATCH", "SLURM_JOB_ID": "1", "SLURM_JOBID": "1", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node[1-2]",
         "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS_PER_NODE": "1"}


def step(procid=0, nodeid=0, localid=0, ntasks=2, tpn="1(x2)", nodes="node[1-2]", **extra):
    env = {"SLURM_JOB_ID": "55", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid), "SLURM_NODEID": str(nodeid),
           "SLURM_LOCALID": str(localid), "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_TASKS_PER_NODE": tpn,
           "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_NUM_NODES": str(len(tpn.split(",")) if "x" not in tpn else 2),
           "MASTER_ADDR": "127.0.0.1"}
    env.update(extra)
    return env


def torchrun(rank, world_size, local_world_size, **extra):
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank % local_world_size),
            "LOCAL_WORLD_SIZE": str(local_world_size), "GROUP_RANK": str(rank // local_world_size),
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500", **extra}


def test_batch_script_of_several_tasks_without_srun_fails_with_the_fix():
    with pytest.raises(SlurmConfigError) as info:
        resolve_world(environ=BATCH, gpus=0)
    text = str(info.value)
    assert "batch script of SLURM job 1 (ENVIRONMENT=BATCH)" in text and "SLURM_NTASKS=2" in text
    assert "srun did not start it" in text and "'srun python ...'" in text and "--ntasks=1" in text


def test_batch_script_of_one_task_and_salloc_shell_are_single_processes():
    assert resolve_world(environ={**BATCH, "SLURM_NTASKS": "1"}, gpus=0).source == "single"
    salloc = {k: v for k, v in BATCH.items() if k != "ENVIRONMENT"}
    assert resolve_world(environ=salloc, gpus=0).source == "single"
    # torchrun started from the batch script on one node is a supported form: torchrun decides
    assert resolve_world(environ={**BATCH, **torchrun(1, 2, 2)}, gpus=0).source == "torchrun"


def test_srun_plus_torchrun_per_node_is_one_world_and_torchrun_wins():
    env = {**step(procid=1, nodeid=1), **torchrun(3, 4, 2)}
    world = resolve_world(environ=env, gpus=0)
    assert (world.source, world.rank, world.world_size, world.local_rank, world.node_rank) == ("torchrun", 3, 4, 1, 1)
    assert (world.master_addr, world.master_port) == ("node1", 29500)
    assert "inside SLURM step 55.0 of 2 tasks, torchrun's variables win" in world.why


@pytest.mark.parametrize("slurm, run, found", [
    (step(ntasks=2, tpn="1(x2)"), torchrun(1, 2, 2), "srun started 2 task(s) (SLURM_STEP_TASKS_PER_NODE=1,1) and "
                                                       "inside them torchrun started a world of 2"),  # --standalone
    (step(ntasks=4, tpn="2(x2)"), torchrun(1, 8, 2), "srun started 4 task(s) (SLURM_STEP_TASKS_PER_NODE=2,2)"),
])
def test_a_second_launcher_inside_srun_is_refused(slurm, run, found):
    with pytest.raises(SlurmConfigError) as info:
        resolve_world(environ={**slurm, **run}, gpus=0)
    assert found in str(info.value) and "srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES" in str(info.value)


def test_an_elastic_torchrun_world_of_other_nodes_than_the_step_is_one_world():
    """``srun --no-kill torchrun --nnodes=1:2``: after a node of the step is lost, torchrun's re-formed world holds
    the nodes left (a restart); a node that comes back in a step of its own joins a world larger than its step."""
    lost = {**step(procid=0, ntasks=2, tpn="1(x2)"), **torchrun(1, 2, 2, GROUP_WORLD_SIZE="1",
                                                                TORCHELASTIC_RESTART_COUNT="1")}
    assert resolve_world(environ=lost, gpus=0).world_size == 2
    joined = {**step(procid=0, ntasks=1, tpn="1", nodes="node2", SLURM_STEP_NUM_NODES="1"),
              **torchrun(3, 4, 2, GROUP_WORLD_SIZE="2", GROUP_RANK="1")}
    assert (resolve_world(environ=joined, gpus=0).rank, resolve_world(environ=joined, gpus=0).world_size) == (3, 4)
    first_attempt = {**lost, "TORCHELASTIC_RESTART_COUNT": "0"}  # torchruns that never met: separate worlds
    with pytest.raises(SlurmConfigError, match="inside them torchrun started a world of 2"):
        resolve_world(environ=first_attempt, gpus=0)
    inconsistent = {**lost, "WORLD_SIZE": "6"}  # not torchrun's nodes times its processes: refused
    with pytest.raises(SlurmConfigError):
        resolve_world(environ=inconsistent, gpus=0)


def test_mpirun_inside_srun_tasks_is_refused_but_mpirun_in_an_allocation_is_mpi():
    two_mpiruns = {**step(procid=0, ntasks=2, tpn="2", nodes="node1", SLURM_STEP_NUM_NODES="1"),
                   "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                   "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "5"}
    with pytest.raises(SlurmConfigError, match="inside them openmpi started a world of 2.*'mpirun python train.py'"):
        resolve_world(environ=two_mpiruns, gpus=0)
    # Open MPI's daemons are one srun task per node; its ranks carry the daemon's SLURM variables
    in_allocation = {**step(procid=1, nodeid=1, ntasks=2, tpn="1(x2)"), "OMPI_COMM_WORLD_RANK": "3",
                     "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    world = resolve_world(environ=in_allocation, gpus=0)
    assert (world.source, world.rank, world.world_size, world.master_port) == ("openmpi", 3, 4, master_port(55, {}))


def test_gpus_hidden_by_gpus_per_task_are_named():
    env = step(procid=1, localid=1, ntasks=4, tpn="4", nodes="node1", SLURM_STEP_NUM_NODES="1",
               SLURM_GPUS_PER_TASK="1", CUDA_VISIBLE_DEVICES="1")
    with pytest.raises(ValueError) as info:
        resolve_world(environ=env, gpus=1)
    text = str(info.value)
    assert "local rank 1 would use cuda:1 but this process sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=1)" in text
    assert "SLURM_GPUS_PER_TASK=1 (--gpus-per-task)" in text and "--gpus-per-node=<n> with --ntasks-per-node=<n>" in text
    # the same tasks seeing all four GPUs of the node are fine
    assert resolve_world(environ={**env, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, gpus=4).local_rank == 1


def test_task_counts_that_do_not_match_the_gpus_per_node():
    env = step(procid=1, localid=1, ntasks=4, tpn="2(x2)")
    with pytest.raises(SlurmConfigError, match=r"tasks per node 2,2 on 2 node\(s\).*cannot use 4 local devices"):
        resolve_world(environ=env, gpus=4)
