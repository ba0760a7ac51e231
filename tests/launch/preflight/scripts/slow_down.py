"""Slow this process down as a test asks, by its rank or node, to play a node that shares its cores with a busy
neighbour: ``PIN=<cpu>`` pins every process, ``PIN_RANK<k>`` / ``PIN_NODE<k>`` the process of rank k / on SLURM node
k (``SLURM_NODEID``); ``NICE_RANK<k>`` / ``NICE_NODE<k>`` lower its priority by that much, its session's too (the
kernel shares CPU time between sessions first, ``/proc/self/autogroup``; the tasks of one SLURM node share
slurmstepd's session), so that another session's busy process on its core leaves it less time than the others
get, whatever else runs on the machine. ``NICE`` does so for every other process (its session's too where it
leads one): ``NICE=-10`` raises the ranks above whatever else shares their core (a busy job beside the suite,
which the kernel moves onto their core whenever they wait), so that ranks meant to be alike get even turns.

``restored()`` undoes it once the check is over: what the tests judge is the check, and a starved process's exit
(finalizing torch on an eighth of a core) at times took minutes, which no test is about."""
import contextlib
import os


def rank() -> str:
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "") != "":
            return os.environ[name]
    return ""


_AUTOGROUP = "/proc/self/autogroup"
_before = {}  # what slow_down_this_process changed, as it was: "cpus", "nice", "autogroup"


def slow_down_this_process() -> None:
    """Pin every thread of this process and lower its priority, as the environment asks for its rank or node."""
    env, node, me = os.environ, os.environ.get("SLURM_NODEID", ""), rank()
    cpu = env.get(f"PIN_RANK{me}") or env.get(f"PIN_NODE{node}") or env.get("PIN", "")
    nice = env.get(f"NICE_RANK{me}") or env.get(f"NICE_NODE{node}") or env.get("NICE", "")
    if cpu:
        _before["cpus"] = os.sched_getaffinity(0)
    if nice:
        _before["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    for task in map(int, os.listdir("/proc/self/task")):
        if cpu:
            os.sched_setaffinity(task, {int(cpu)})
        if nice:
            os.setpriority(os.PRIO_PROCESS, task, int(nice))
    # the session's group: a SLURM node's tasks share one (slurmstepd's), a worker of torchrun or torchstage's
    # launcher leads its own; a rank's nice must not reach the other ranks of its session
    own = env.get(f"NICE_NODE{node}") or os.getsid(0) == os.getpid()
    if nice and own and os.path.exists(_AUTOGROUP):
        with open(_AUTOGROUP) as f:
            _before["autogroup"] = f.read().split()[-1]  # "/autogroup-<n> nice <value>"
        with open(_AUTOGROUP, "w") as f:
            f.write(nice)


@contextlib.contextmanager
def restored():
    """Run the block (the check), then give this process back the CPUs, priority and session group's priority
    that :func:`slow_down_this_process` changed."""
    try:
        yield
    finally:
        for task in map(int, os.listdir("/proc/self/task")):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                if "cpus" in _before:
                    os.sched_setaffinity(task, _before["cpus"])
                if "nice" in _before:
                    os.setpriority(os.PRIO_PROCESS, task, _before["nice"])
        if "autogroup" in _before:
            with open(_AUTOGROUP, "w") as f:
                f.write(_before["autogroup"])
