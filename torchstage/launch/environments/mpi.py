"""What MPI launches share: rank variables per launcher, and a master address and port found without MASTER_*.

The master address comes from MASTER_ADDR, else the scheduler's host list (first host runs rank 0),
else loopback when every rank runs on this host, else rank 0's host name exchanged through mpi4py
(``torchstage[mpi]``). The port comes from MASTER_PORT, else the job id (as for SLURM), else mpi4py.
"""
import logging
import os
import socket
import zlib
from typing import Mapping, Optional, Sequence, Tuple

from torchstage.launch.environments.base import (LauncherEnvironment, LaunchError, check_place, int_var, int_var_or,
                                                  this_host_names)
from torchstage.launch.environments.torchrun import parse_port
from torchstage.launch.slurm.hostlist import expand_hostlist
from torchstage.launch.slurm.step import master_port, scontrol_node_addr
from torchstage.launch.world import World

logger = logging.getLogger(__name__)


class MpiEnvironment(LauncherEnvironment):
    """An MPI launcher: subclasses name their rank variables and, where a scheduler has one, its host list.

    One task per node (the launcher's local size is 1) with several local devices (GPUs, or ``nprocs`` /
    ``TORCHSTAGE_NPROC``) starts a rank per device, as a SLURM step of one task per node does: global rank = MPI rank
    x local devices + local rank (nodes are assumed alike).
    """

    rank_var = size_var = local_rank_var = ""
    local_size_var: Optional[str] = None
    node_var: Optional[str] = None
    #: job id variables, most specific first (a scheduler's job id, then the launcher's own)
    job_vars: Tuple[str, ...] = ()

    def applies(self, environ: Mapping) -> bool:
        return all(environ.get(k, "") != "" for k in (self.rank_var, self.size_var))

    def ranks(self, environ: Mapping) -> int:
        return int_var(environ, self.size_var)

    def job_id(self, environ: Mapping):
        all_local = self.local_size_var is not None and environ.get(self.local_size_var) == environ.get(self.size_var)
        return self.launch_id(environ, all_local)

    def hosts(self, environ: Mapping) -> Optional[Sequence[str]]:
        """The job's hosts in rank order (rank 0 on the first), or None without a scheduler host list.

        PBS_NODEFILE under PBS; SLURM_JOB_NODELIST for mpirun/mpiexec inside a SLURM allocation.
        """
        if environ.get("PBS_NODEFILE"):
            return read_hostfile(environ["PBS_NODEFILE"], "PBS_NODEFILE")
        if environ.get("SLURM_JOB_NODELIST"):
            return expand_hostlist(environ["SLURM_JOB_NODELIST"])
        return None

    def launch_id(self, environ: Mapping, all_local: bool) -> Optional[str]:
        """An id shared by every rank of this launch and by no concurrent launch, or None."""
        for name in self.job_vars:
            if environ.get(name, "") != "":
                return environ[name]
        return None

    def place(self, environ: Mapping, local_devices: int) -> World:
        rank, size = int_var(environ, self.rank_var), int_var(environ, self.size_var)
        check_place(rank, size, self.rank_var, self.size_var)
        local_rank = int_var_or(environ, self.local_rank_var, 0)
        local_size = int_var_or(environ, self.local_size_var, None) if self.local_size_var else None
        hosts = self.hosts(environ)
        if self.node_var and environ.get(self.node_var, "") != "":
            node_rank = int_var(environ, self.node_var)
        elif hosts:
            unique = list(dict.fromkeys(hosts))
            mine = [i for i, h in enumerate(unique) if h in this_host_names() or h.split(".")[0] in this_host_names()]
            node_rank = mine[0] if mine else (rank // local_size if local_size else 0)
        else:
            node_rank = rank // local_size if local_size else 0
        all_local = local_size == size
        addr, port = self._rendezvous(environ, rank, size, hosts, all_local)
        if local_size == 1 and local_devices > 1:  # one task per node: it starts a rank per local device
            return World(rank=rank * local_devices, world_size=size * local_devices, local_rank=0, master_addr=addr,
                         master_port=port, source=self.name, spawn=local_devices, node_rank=rank,
                         local_size=local_devices, nnodes=size)
        return World(rank=rank, world_size=size, local_rank=local_rank, master_addr=addr, master_port=port,
                     source=self.name, node_rank=node_rank, local_size=local_size)

    def _rendezvous(self, environ, rank, size, hosts, all_local) -> Tuple[str, Optional[int]]:
        addr = environ.get("MASTER_ADDR") or (hosts[0] if hosts else None) or ("127.0.0.1" if all_local else None)
        port = parse_port(environ.get("MASTER_PORT"), "MASTER_PORT")
        if port is None and size > 1:
            job = self.launch_id(environ, all_local)
            port = job_port(job) if job is not None else None
        if size == 1:
            return addr or "127.0.0.1", port
        if addr is None or port is None:
            exchanged = exchange_through_mpi4py(rank, size)
            if exchanged is None:
                missing = " and ".join(n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if v is None)
                raise LaunchError(
                    f"{self.name} launch of {size} processes across hosts ({self.rank_var}={rank}, "
                    f"{self.size_var}={size}) without {missing}: there is no scheduler host list or job id to "
                    f"find rank 0's host and a port from. Set {missing} for every rank (e.g. mpirun -x "
                    f"MASTER_ADDR=<first host> -x MASTER_PORT=29500), or install mpi4py built for this MPI "
                    f"(pip install 'torchstage[mpi]') so rank 0 shares its host and a free port")
            addr, port = addr or exchanged[0], port or exchanged[1]
        return resolve(addr, slurm=bool(environ.get("SLURM_JOB_ID"))), port


def job_port(job_id: str) -> int:
    """A master port derived from a job id, collision-free between concurrent jobs as for SLURM."""
    digits = str(job_id).split(".")[0]
    number = int(digits) if digits.isdigit() else zlib.crc32(str(job_id).encode())
    return master_port(number, {})


def resolve(host: str, slurm: bool = False) -> str:
    """``host``'s address where this host can resolve it (inside SLURM also through the node's NodeAddr),
    else the name itself."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        pass
    node_addr = scontrol_node_addr(host) if slurm else None
    if node_addr:
        try:
            return socket.gethostbyname(node_addr)
        except OSError:
            pass
    logger.debug("%s does not resolve here; passing the name to the process group", host)
    return host


def exchange_through_mpi4py(rank: int, size: int) -> Optional[Tuple[str, int]]:
    """Rank 0's host name and a free port on it, broadcast through MPI; None without a matching mpi4py."""
    try:
        from mpi4py import MPI  # optional extra torchstage[mpi]: initialises MPI, so only imported here
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != size or comm.Get_rank() != rank:  # mpi4py built for another MPI: a singleton
        logger.debug("mpi4py sees rank %d of %d, not %d of %d: built for another MPI", comm.Get_rank(),
                     comm.Get_size(), rank, size)
        return None
    mine = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            mine = (socket.gethostname(), s.getsockname()[1])  # getfqdn() may say 'localhost'
    return comm.bcast(mine, root=0)


def read_hostfile(path: str, name: str) -> Sequence[str]:
    """Host names of a one-host-per-line file (PBS_NODEFILE), in order, repeats kept."""
    try:
        with open(path) as f:
            hosts = [line.split()[0] for line in f if line.strip()]
    except OSError as e:
        raise LaunchError(f"{name}={path!r} cannot be read ({e}); it should list the job's hosts") from None
    if not hosts:
        raise LaunchError(f"{name}={path!r} lists no hosts")
    return hosts


def ancestor_pid(command_name: str, start: int = None, depth: int = 16) -> Optional[int]:
    """PID of the nearest ancestor process whose command is ``command_name`` (Linux /proc), or None."""
    pid = os.getppid() if start is None else start
    for _ in range(depth):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return None
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if comm.startswith(command_name[:15]):
            return pid
        pid = int(rest[1])  # the parent's pid
        if pid <= 1:
            return None
    return None
