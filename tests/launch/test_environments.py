"""Launcher environments from recorded variable sets: Open MPI and MPICH as measured here (2 ranks on one
host), PBS/PALS and LSF/jsrun as their documentation describes them (no such scheduler installs here)."""
import pytest

from torchstage.launch.environments import mpi
from torchstage.launch.environments.lsf import compute_hosts
from torchstage.launch.resolve import resolve_world
from torchstage.launch.slurm.step import master_port

# Measured: rank 1 of `mpirun -np 2` (Open MPI 4.1.4) and of `mpiexec.mpich -np 2` (MPICH 4.0.2).
OPENMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_MCA_ess_base_jobid": "698810369",
           "PMIX_NAMESPACE": "698810369", "PMIX_RANK": "1"}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "8",
         "HYDI_CONTROL_FD": "7"}
# PBS Pro + PALS (ALCF Polaris user guide: mpiexec -n 8 --ppn 4; Cray PMI sets PMI_*), rank 5 on the 2nd node.
PALS = {"PBS_JOBID": "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov", "PBS_NODEFILE": None,
        "PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PALS_DEPTH": "8", "PALS_APID": "a1b2",
        "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4"}
# LSF + jsrun (OLCF Summit user guide: jsrun -n 2 -a 6 -g 6; the launch node comes first in LSB_MCPU_HOSTS).
LSF = {"LSB_JOBID": "987654", "LSB_MCPU_HOSTS": "batch3 1 a01n01 42 a01n02 42", "JSM_NAMESPACE_RANK": "7",
       "JSM_NAMESPACE_SIZE": "12", "JSM_NAMESPACE_LOCAL_RANK": "1", "JSM_NAMESPACE_LOCAL_SIZE": "6",
       "OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_SIZE": "12", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}


@pytest.fixture(autouse=True)
def no_mpi4py(monkeypatch):
    """Unit tests never initialise MPI; the exchange itself is tested under a real mpirun."""
    monkeypatch.setattr(mpi, "exchange_through_mpi4py", lambda rank, size: None)


@pytest.fixture
def pals(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x3001c0s13b0n0.hsn.cm.polaris.alcf.anl.gov\nx3001c0s13b1n0.hsn.cm.polaris.alcf.anl.gov\n")
    return {**PALS, "PBS_NODEFILE": str(nodefile)}


def place(world):
    return world.rank, world.world_size, world.local_rank, world.node_rank, world.source


def test_openmpi_on_one_host_uses_loopback_and_the_job_id_port():
    world = resolve_world(environ=OPENMPI, gpus=0)
    assert place(world) == (1, 2, 1, 0, "openmpi") and world.spawn == 0
    assert (world.master_addr, world.master_port) == ("127.0.0.1", master_port(698810369, {}))
    assert "OMPI_COMM_WORLD_RANK=1" in world.why


def test_mpich_on_one_host_uses_the_hydra_proxy_for_the_port(monkeypatch):
    monkeypatch.setattr("torchstage.launch.environments.mpich.ancestor_pid", lambda name: 4242)
    world = resolve_world(environ=MPICH, gpus=0)
    assert place(world) == (1, 2, 1, 0, "mpich")
    assert (world.master_addr, world.master_port) == ("127.0.0.1", master_port(4242, {}))


def test_pals_reads_pbs_nodefile_and_job_id(pals):
    world = resolve_world(environ=pals, gpus=0)
    assert place(world) == (5, 8, 1, 1, "pals")
    assert world.master_addr == "x3001c0s13b0n0.hsn.cm.polaris.alcf.anl.gov"  # first host (not resolvable here)
    assert world.master_port == master_port(1234567, {})


def test_lsf_skips_the_launch_node_and_wins_over_open_mpi():
    world = resolve_world(environ=LSF, gpus=0)
    assert place(world) == (7, 12, 1, 1, "lsf")
    assert (world.master_addr, world.master_port) == ("a01n01", master_port(987654, {}))
    assert compute_hosts("hostA 4") == ["hostA"] and compute_hosts("h1 8 h2 8") == ["h1", "h2"]
    with pytest.raises(ValueError, match="LSB_MCPU_HOSTS='h1 x' is not"):
        compute_hosts("h1 x")


def test_master_variables_override_host_lists(pals):
    world = resolve_world(environ={**pals, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"}, gpus=0)
    assert (world.master_addr, world.master_port) == ("10.0.0.9", 29500)


def test_precedence_torchrun_then_slurm_then_mpi():
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    assert resolve_world(environ={**OPENMPI, **torchrun}, gpus=0).source == "torchrun"
    assert resolve_world(environ={**OPENMPI, **torchrun}, gpus=0, rank=0, world_size=1).source == "arguments"
    step = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "localhost",
            "SLURM_STEP_TASKS_PER_NODE": "2"}
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE equal to SLURM's: the SLURM step decides
    assert resolve_world(environ={**MPICH, **step}, gpus=0).source == "slurm"


def test_mpi_across_hosts_without_host_list_or_mpi4py_says_what_to_set():
    env = {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_MCA_ess_base_jobid": ""}
    env.pop("PMIX_NAMESPACE")
    with pytest.raises(ValueError) as info:
        resolve_world(environ=env, gpus=0)
    text = str(info.value)
    assert "openmpi launch of 2 processes" in text and "without MASTER_ADDR and MASTER_PORT" in text
    assert "mpirun -x MASTER_ADDR" in text and "torchstage[mpi]" in text
    # a job id gives the port, MASTER_ADDR the address: no exchange needed
    world = resolve_world(environ={**env, "OMPI_MCA_ess_base_jobid": "77", "MASTER_ADDR": "10.1.1.1"}, gpus=0)
    assert (world.master_addr, world.master_port) == ("10.1.1.1", master_port(77, {}))


def test_one_mpi_process_needs_no_rendezvous():
    world = resolve_world(environ={"PMI_RANK": "0", "PMI_SIZE": "1"}, gpus=0)
    assert (world.world_size, world.source, world.is_distributed) == (1, "mpich", False)


@pytest.mark.parametrize("env, match", [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK=2 and OMPI_COMM_WORLD_SIZE=2"),
    ({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK must be an integer, got 'x'"),
    ({**PALS, "PBS_NODEFILE": "/nonexistent/nodefile"}, "PBS_NODEFILE='/nonexistent/nodefile' cannot be read"),
])
def test_broken_launcher_variables_are_named(env, match):
    with pytest.raises(ValueError, match=match):
        resolve_world(environ=env, gpus=0)


def test_launched_into_world_for_mpi_launches():
    from torchstage.launch.resolve import launched_into_world
    assert launched_into_world(OPENMPI)
    assert not launched_into_world({"PMI_RANK": "0", "PMI_SIZE": "1"})


@pytest.mark.parametrize("devices", [{"gpus": 4}, {"gpus": 0, "nprocs": 4}])
def test_one_mpi_task_per_node_starts_a_rank_per_local_device(pals, devices):
    """``mpiexec -n 2 --ppn 1`` on two GPU nodes (or with nprocs on CPU): node 1's task starts global ranks 4-7."""
    one_per_node = {**pals, "PALS_RANKID": "1", "PMI_RANK": "1", "PMI_SIZE": "2", "PALS_LOCAL_RANKID": "0",
                    "PMI_LOCAL_RANK": "0", "PMI_LOCAL_SIZE": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    world = resolve_world(environ=one_per_node, **devices)
    assert (world.rank, world.world_size, world.spawn, world.node_rank, world.nnodes) == (4, 8, 4, 1, 2)
    assert [world.child(i).rank for i in range(4)] == [4, 5, 6, 7]
    assert resolve_world(environ=OPENMPI, **devices).spawn == 0  # two tasks on this node: each is a rank
