"""A process's node as its scheduler names it: SLURM's node name inside a SLURM job (several SLURM nodes may share
one machine, as the local test cluster's do), else the short host name."""
import socket

from torchstage.launch.hosts import host_name, in_slurm_job


def test_the_slurm_node_name_wins_and_the_host_name_is_short_otherwise():
    assert host_name({"SLURMD_NODENAME": "node2"}) == "node2"
    assert host_name({}) == socket.gethostname().split(".")[0]
    assert in_slurm_job({"SLURM_JOB_ID": "12"}) and not in_slurm_job({})
