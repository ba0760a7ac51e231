"""PBS Pro jobs launched by HPE Cray PALS ``mpiexec`` (ALCF Polaris and Aurora, NERSC-like Cray systems)."""
from torchstage.launch.environments.mpi import MpiEnvironment


class PalsEnvironment(MpiEnvironment):
    """``mpiexec -n 8 --ppn 4 python train.py`` in a PBS job: PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID,
    PMI_SIZE, PMI_LOCAL_SIZE; rank 0's host is the first line of PBS_NODEFILE, the port from PBS_JOBID."""

    name = "pals"
    command = "mpiexec -n 8 --ppn 4 python train.py  (PBS Pro + PALS)"
    rank_var, size_var = "PALS_RANKID", "PMI_SIZE"
    local_rank_var, local_size_var, node_var = "PALS_LOCAL_RANKID", "PMI_LOCAL_SIZE", "PALS_NODEID"
    job_vars = ("PBS_JOBID", "PALS_APID")
    variables = (rank_var, size_var, local_rank_var, "PALS_NODEID", "PBS_JOBID", "PBS_NODEFILE", "MASTER_ADDR",
                 "MASTER_PORT")
