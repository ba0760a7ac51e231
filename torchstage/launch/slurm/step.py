"""SLURM job steps: who this task is, how the world is laid out, where the master listens.

Pure functions of an environment mapping (default ``os.environ``), so every rule is testable
without a cluster. Nothing here starts processes or touches ``torch.distributed``.
"""
import logging
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional

from torchstage.launch.slurm.hostlist import expand_hostlist
from torchstage.launch.world import World

logger = logging.getLogger(__name__)


class SlurmConfigError(ValueError):
    """SLURM settings (or SLURM_* variables) that cannot give a working distributed run."""


# ---- the job step ------------------------------------------------------------------------------
def expand_tasks_per_node(expr: str) -> list:
    """Task counts per node from SLURM's compressed form: ``2(x2),1`` -> ``[2, 2, 1]``."""
    counts = []
    for part in expr.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise SlurmConfigError(f"invalid tasks-per-node list {expr!r} (expected e.g. '2(x2),1')")
        counts.extend([int(m[1])] * int(m[2] or 1))
    return counts


@dataclass(frozen=True)
class SlurmStep:
    """One task of a SLURM job step (``srun``), as its SLURM_* variables describe it."""

    job_id: str
    step_id: str
    procid: int          # SLURM_PROCID: global task rank in the step
    localid: int         # SLURM_LOCALID: task rank on this node
    nodeid: int          # SLURM_NODEID: index of this node in ``nodes``
    ntasks: int
    nodes: tuple         # step node names, in SLURM's order (node index order)
    tasks_per_node: tuple

    @property
    def nnodes(self) -> int:
        return len(self.nodes)


def _get(environ, *names):
    for name in names:
        if environ.get(name, "") != "":
            return name, environ[name]
    raise SlurmConfigError(f"SLURM job step without {' / '.join(names)} in the environment")


def _int(environ, *names) -> int:
    name, value = _get(environ, *names)
    try:
        return int(value)
    except ValueError:
        raise SlurmConfigError(f"{name}={value!r} is not an integer") from None


def has_controlling_tty() -> bool:
    """Whether this process has a controlling terminal (true in ``srun --pty`` shells, false in step tasks)."""
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
        return True
    except OSError:
        return False


def slurm_step(environ: Mapping = os.environ, controlling_tty: Optional[bool] = None) -> Optional[SlurmStep]:
    """This process's SLURM job step, or None where it is not a task of a step.

    None outside SLURM, in an ``salloc`` shell and in an sbatch batch script (no SLURM_STEP_ID or
    SLURM_PROCID), and in an interactive ``srun --pty`` shell or a program started from it: such a
    step may claim N tasks, but only task 0 runs the shell, so it is one process. The shell is told
    apart from a step started inside it (which inherits SLURM_PTY_PORT too) by its controlling
    terminal: srun's tasks have none. Step-level variables win over job-level ones.
    """
    if not all(environ.get(k) for k in ("SLURM_JOB_ID", "SLURM_PROCID")):
        return None
    step_id = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    if not step_id or not step_id.isdigit() or int(step_id) >= 0xFFFFFFF0:  # batch/extern/interactive steps
        return None
    if environ.get("SLURM_PTY_PORT"):
        if has_controlling_tty() if controlling_tty is None else controlling_tty:
            logger.debug("interactive srun --pty shell (job %s): a single process", environ["SLURM_JOB_ID"])
            return None
    name, nodelist = _get(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    try:
        nodes = tuple(expand_hostlist(nodelist))
    except ValueError as e:
        raise SlurmConfigError(f"{name}: {e}") from None
    tpn_name, tpn = _get(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    step = SlurmStep(
        job_id=environ["SLURM_JOB_ID"], step_id=step_id,
        procid=_int(environ, "SLURM_PROCID"), localid=_int(environ, "SLURM_LOCALID"),
        nodeid=_int(environ, "SLURM_NODEID"),
        ntasks=_int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
        nodes=nodes, tasks_per_node=tuple(expand_tasks_per_node(tpn)))
    nnodes = _int(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    _check_step(step, nnodes, f"{name}={nodelist!r}, {tpn_name}={tpn!r}")
    return step


def _check_step(step: SlurmStep, nnodes: int, given: str) -> None:
    problems = []
    if step.nnodes != nnodes:
        problems.append(f"{step.nnodes} node names but {nnodes} nodes")
    if len(step.tasks_per_node) != step.nnodes:
        problems.append(f"{len(step.tasks_per_node)} task counts for {step.nnodes} nodes")
    if sum(step.tasks_per_node) != step.ntasks:
        problems.append(f"task counts add up to {sum(step.tasks_per_node)}, not {step.ntasks} tasks")
    if not 0 <= step.procid < step.ntasks or not 0 <= step.nodeid < step.nnodes:
        problems.append(f"task {step.procid} on node {step.nodeid} is outside the step")
    elif step.nodeid < len(step.tasks_per_node) and not 0 <= step.localid < step.tasks_per_node[step.nodeid]:
        problems.append(f"local id {step.localid} but node {step.nodeid} runs {step.tasks_per_node[step.nodeid]} tasks")
    if problems:
        raise SlurmConfigError(f"SLURM step variables do not add up ({given}): {'; '.join(problems)}")


# ---- layout ------------------------------------------------------------------------------------
def slurm_world(step: SlurmStep, local_devices: int) -> World:
    """Decide the layout: one task per device (no spawn) or one task per node spawning a process per device.

    Nodes are assumed alike (``local_devices`` on each). Raises SlurmConfigError, before any
    collective, for task counts per node that are neither 1 nor ``local_devices``. The master address
    and port are left to :func:`master_addr` and :func:`master_port`.
    """
    tpn, n = step.tasks_per_node, step.nnodes
    if local_devices <= 1 or all(t == local_devices for t in tpn):
        return World(rank=step.procid, world_size=step.ntasks, local_rank=step.localid, source="slurm",
                     node_rank=step.nodeid, local_size=tpn[step.nodeid], nnodes=n)
    if all(t == 1 for t in tpn):
        return World(rank=step.nodeid * local_devices, world_size=n * local_devices, local_rank=0, source="slurm",
                     spawn=local_devices, node_rank=step.nodeid, local_size=local_devices, nnodes=n)
    kind = "uneven tasks per node" if len(set(tpn)) > 1 else "tasks per node"
    raise SlurmConfigError(
        f"{kind} {','.join(map(str, tpn))} on {n} node(s) (SLURM_STEP_TASKS_PER_NODE) cannot use {local_devices} "
        f"local devices per node: use --ntasks-per-node=1 (one launcher per node spawns {local_devices} "
        f"processes) or --ntasks-per-node={local_devices} (one task per device), the same on every node")


# ---- rendezvous --------------------------------------------------------------------------------
def rank0_host(step: SlurmStep, environ: Mapping = os.environ) -> str:
    """Name of the node running task 0: the first node with tasks, in the step's node order.

    True for SLURM's block, cyclic and plane distributions; with ``--distribution=arbitrary``
    task 0 may run anywhere, so that raises and asks for MASTER_ADDR.
    """
    if environ.get("SLURM_DISTRIBUTION", "").startswith("arbitrary"):
        raise SlurmConfigError("SLURM_DISTRIBUTION=arbitrary: the node of task 0 is unknown; set MASTER_ADDR")
    return next(host for host, t in zip(step.nodes, step.tasks_per_node) if t > 0)


def master_addr(step: SlurmStep, environ: Mapping = os.environ) -> str:
    """MASTER_ADDR if set, else the address of task 0's node (DNS/hosts, then ``scontrol show node``)."""
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    host = rank0_host(step, environ)
    try:
        return socket.gethostbyname(host)
    except OSError:
        logger.debug("%s does not resolve; asking scontrol for its NodeAddr", host)
    addr = scontrol_node_addr(host)
    if addr:
        try:
            return socket.gethostbyname(addr)
        except OSError:
            pass
    raise SlurmConfigError(f"cannot resolve {host!r}, the node of task 0 (not in DNS/hosts, no usable NodeAddr "
                           f"from scontrol: {addr!r}); set MASTER_ADDR")


def scontrol_node_addr(host: str) -> Optional[str]:
    try:
        out = subprocess.run(["scontrol", "show", "node", host], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m[1] if m else None


PORT_WINDOW = (15000, 30000)  # preferred [low, high) window for job-derived master ports


def ephemeral_port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple:
    """Linux's ephemeral port range (inclusive), default 32768-60999 where unreadable."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def master_port(job_id, environ: Mapping = os.environ, ephemeral: Optional[tuple] = None) -> int:
    """MASTER_PORT if set, else a port derived from the job id: every job on a node gets its own.

    Ports are the window 15000-29999 minus the ephemeral range (whole 1024-65535 minus it if that
    is empty); port = candidates[job_id % len(candidates)], so consecutive job ids never collide
    and two jobs collide only when their ids differ by a multiple of the window size.
    """
    if environ.get("MASTER_PORT"):
        port = environ["MASTER_PORT"]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise SlurmConfigError(f"MASTER_PORT={port!r} is not a port number (1-65535)")
        return int(port)
    if not str(job_id).isdigit():
        raise SlurmConfigError(f"SLURM job id {job_id!r} is not an integer")
    jid = int(job_id)
    lo, hi = ephemeral or ephemeral_port_range()
    for start, stop in (PORT_WINDOW, (1024, 65536)):
        below = (start, max(start, min(stop, lo)))          # window ports under the ephemeral range
        above = (min(stop, max(start, hi + 1)), stop)       # and over it
        n_below, n_above = below[1] - below[0], above[1] - above[0]
        if n_below + n_above:
            i = jid % (n_below + n_above)
            return below[0] + i if i < n_below else above[0] + i - n_below
    raise SlurmConfigError(f"no port outside the ephemeral range {lo}-{hi}; set MASTER_PORT")
