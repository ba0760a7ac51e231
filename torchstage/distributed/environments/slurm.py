"""A task of a SLURM job step (``srun``); the rules themselves live in :mod:`torchstage.distributed.slurm`."""
from typing import Mapping

from torchstage.distributed import slurm
from torchstage.distributed.environments.base import LauncherEnvironment, Place


class SlurmEnvironment(LauncherEnvironment):
    """``srun python train.py``: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_TASKS, node list."""

    name = "slurm"
    command = "srun -N 2 --ntasks-per-node=4 python train.py"
    variables = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID", "SLURM_JOB_ID", "SLURM_LOCALID",
                 "SLURM_NODEID", "SLURM_NTASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")

    def applies(self, environ: Mapping) -> bool:
        return slurm.slurm_step(environ) is not None

    def place(self, environ: Mapping, local_devices: int) -> Place:
        step = slurm.slurm_step(environ)
        layout = slurm.slurm_world(step, local_devices)
        return Place(layout.rank, layout.world_size, layout.local_rank, layout.node_rank,
                     slurm.master_addr(step, environ), slurm.master_port(step.job_id, environ),
                     spawn=layout.spawn_local)
