"""MPICH and Intel MPI hydra launchers (``mpiexec``, ``mpiexec.hydra``, ``mpiexec.mpich``)."""
from torchstage.launch.environments.mpi import MpiEnvironment, ancestor_pid


class MpichEnvironment(MpiEnvironment):
    """``mpiexec -n 8 python train.py``: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS.

    Hydra exports no job id: without a scheduler's, a launch on one host uses the pid of its
    ``hydra_pmi_proxy`` (shared by the ranks of one launch on one host) for the port.
    """

    name = "mpich"
    command = "mpiexec -n 8 python train.py"
    rank_var, size_var = "PMI_RANK", "PMI_SIZE"
    local_rank_var, local_size_var = "MPI_LOCALRANKID", "MPI_LOCALNRANKS"
    job_vars = ("PBS_JOBID", "LSB_JOBID", "SLURM_JOB_ID")
    variables = (rank_var, size_var, local_rank_var, local_size_var, "PBS_NODEFILE", "MASTER_ADDR", "MASTER_PORT")

    def launch_id(self, environ, all_local):
        job = super().launch_id(environ, all_local)
        if job is None and all_local:
            proxy = ancestor_pid("hydra_pmi_proxy")
            return None if proxy is None else str(proxy)
        return job
