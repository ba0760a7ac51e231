"""Open MPI's ``mpirun``/``mpiexec`` (and launchers built on it, such as Spectrum MPI)."""
from torchstage.launch.environments.mpi import MpiEnvironment


class OpenMpiEnvironment(MpiEnvironment):
    """``mpirun -np 8 python train.py``: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; the job id for the port."""

    name = "openmpi"
    command = "mpirun -np 8 python train.py"
    rank_var, size_var = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    local_rank_var, local_size_var = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"
    job_vars = ("PBS_JOBID", "LSB_JOBID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")
    variables = (rank_var, size_var, local_rank_var, local_size_var, "OMPI_MCA_ess_base_jobid", "PBS_NODEFILE",
                 "MASTER_ADDR", "MASTER_PORT")
