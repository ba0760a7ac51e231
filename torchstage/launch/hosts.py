"""The name of the host a process runs on, as its scheduler knows it: what a user excludes or reports a node by."""
import os
import socket
from typing import Mapping


def host_name(environ: Mapping = None) -> str:
    """This process's node: SLURM's node name inside a SLURM job (``SLURMD_NODENAME``, what ``--exclude`` takes;
    several SLURM nodes may share one machine), else the machine's host name (short form)."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def in_slurm_job(environ: Mapping = None) -> bool:
    """True inside a SLURM job (a step's task or a batch script), where ``--exclude=<nodes>`` applies."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_JOB_ID"))
