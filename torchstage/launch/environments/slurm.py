"""A task of a SLURM job step (``srun``); the rules themselves live in :mod:`torchstage.launch.slurm.step`."""
from dataclasses import replace
from typing import Mapping

from torchstage.launch.environments.base import LauncherEnvironment
from torchstage.launch.slurm import step as slurm
from torchstage.launch.world import World


class SlurmEnvironment(LauncherEnvironment):
    """``srun python train.py``: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_TASKS, node list."""

    name = "slurm"
    command = "srun -N 2 --ntasks-per-node=4 python train.py"
    variables = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID", "SLURM_JOB_ID", "SLURM_LOCALID",
                 "SLURM_NODEID", "SLURM_NTASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                 "SLURM_GPUS_PER_TASK", "ENVIRONMENT")  # the last two: read by the layout checks

    def applies(self, environ: Mapping) -> bool:
        return slurm.slurm_step(environ) is not None

    def ranks(self, environ: Mapping) -> int:
        return slurm.slurm_step(environ).ntasks

    def job_id(self, environ: Mapping):
        return environ["SLURM_JOB_ID"]

    def place(self, environ: Mapping, local_devices: int) -> World:
        step = slurm.slurm_step(environ)
        return replace(slurm.slurm_world(step, local_devices), master_addr=slurm.master_addr(step, environ),
                       master_port=slurm.master_port(step.job_id, environ))
