"""IBM LSF jobs launched by ``jsrun`` (OLCF Summit, LLNL Lassen/Sierra)."""
from torchstage.launch.environments.base import LaunchError
from torchstage.launch.environments.mpi import MpiEnvironment


class LsfEnvironment(MpiEnvironment):
    """``jsrun -n 2 -a 4 -g 4 python train.py``: JSM_NAMESPACE_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; hosts from
    LSB_MCPU_HOSTS (without the launch node), the port from LSB_JOBID."""

    name = "lsf"
    command = "jsrun -n 2 -a 4 -g 4 python train.py  (LSF)"
    rank_var, size_var = "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"
    local_rank_var, local_size_var = "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE"
    job_vars = ("LSB_JOBID",)
    variables = (rank_var, size_var, local_rank_var, local_size_var, "LSB_JOBID", "LSB_MCPU_HOSTS", "MASTER_ADDR",
                 "MASTER_PORT")

    def hosts(self, environ):
        return compute_hosts(environ["LSB_MCPU_HOSTS"]) if environ.get("LSB_MCPU_HOSTS") else None


def compute_hosts(mcpu_hosts: str) -> list:
    """Compute hosts of ``LSB_MCPU_HOSTS`` ("host slots host slots ..."), launch node left out.

    On jsrun systems the first pair is the launch (batch) node with one slot, where no rank runs;
    a list of one pair is a single-host job.
    """
    words = mcpu_hosts.split()
    if len(words) % 2 or not all(w.isdigit() for w in words[1::2]):
        raise LaunchError(f"LSB_MCPU_HOSTS={mcpu_hosts!r} is not 'host slots host slots ...'")
    hosts = words[0::2]
    return hosts[1:] if len(hosts) > 1 and words[1] == "1" else hosts
