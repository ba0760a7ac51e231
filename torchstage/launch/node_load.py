"""How busy a node is besides this job, over an interval: the CPU time of the whole node (``/proc/stat``), of this
job's processes on it (``/proc/<pid>/stat``, their children included) and the time a hypervisor stole. The straggler
detector and the pre-flight check use it to say how far their verdict on a rank can be trusted: a rank that shares
saturated cores with other work is measured as the scheduler shares them, not as its hardware runs.
"""
import os
import time
from dataclasses import dataclass
from typing import Optional

#: Other work (in cores) from which a saturated node makes a verdict on its ranks uncertain.
MIN_OTHERS = 0.5
#: The node counts as saturated when its busy cores reach this share of its CPUs.
SATURATED = 0.9
#: A stolen share of the CPU time from which a verdict is uncertain (a virtual machine's neighbours).
MAX_STEAL = 0.05
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class NodeLoad:
    """A node over an interval: ``cpus`` it has, ``busy`` cores in use on average (every process), ``own`` cores
    this job's processes used, ``steal`` the share of CPU time taken by the hypervisor, ``ranks`` this job's ranks
    on it."""

    host: str
    cpus: float
    busy: float
    own: float
    steal: float
    ranks: int

    @property
    def others(self) -> float:
        """Cores of other work than this job's."""
        return max(0.0, self.busy - self.own)

    def doubt(self) -> Optional[str]:
        """Why a verdict on this node's ranks is uncertain (oversubscribed, saturated by other work, stolen time),
        or None when the node ran this job alone enough to trust it."""
        reasons = []
        if self.ranks > self.cpus:
            reasons.append(f"{self.ranks} ranks on {self.cpus:g} CPUs take turns on the cores")
        if self.others >= MIN_OTHERS and self.busy >= SATURATED * self.cpus:
            reasons.append(f"other work used {self.others:.1f} of its {self.cpus:g} CPUs (this job {self.own:.1f}), "
                           f"so the cores were full")
        if self.steal >= MAX_STEAL:
            reasons.append(f"the hypervisor took {self.steal:.0%} of its CPU time")
        return "; ".join(reasons) or None

    def confidence(self) -> str:
        """``"high"`` or ``"low: host vm ...: <why>"``: the words a report gives its verdict on this node."""
        doubt = self.doubt()
        return "high" if doubt is None else f"low: host {self.host} is shared: {doubt}"


def node_ticks() -> Optional[tuple]:
    """``(total, idle, steal)`` clock ticks of every CPU of this node since boot, None where /proc is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    fields += [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return user + nice + system + idle + iowait + irq + softirq + steal, idle + iowait, steal


def process_ticks(pids) -> int:
    """User and system clock ticks of ``pids`` and of their live children (data-loader workers), so far: each
    process's threads list the children they started (``/proc/<pid>/task/<tid>/children``), so only these are read."""
    total, seen, todo = 0, set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except (OSError, IndexError, ValueError):
            continue
    return total


class LoadMeter:
    """The :class:`NodeLoad` of this node between two calls of :meth:`take` (the first from construction), with
    ``pids`` the job's processes on it."""

    def __init__(self, host: str, pids, ranks: int = None):
        self.host, self.pids = host, tuple(pids)
        self.ranks = len(self.pids) if ranks is None else ranks
        self.cpus = float(os.cpu_count() or 1)
        self._last = self._sample()

    def _sample(self):
        return time.monotonic(), node_ticks(), process_ticks(self.pids)

    def take(self) -> Optional[NodeLoad]:
        """The load since the last call; None without /proc or over too short an interval."""
        now = self._sample()
        (t0, node0, own0), (t1, node1, own1) = self._last, now
        self._last = now
        if node0 is None or node1 is None or node1[0] <= node0[0] or t1 - t0 <= 0:
            return None
        return between(self.host, self.cpus, node0, node1, (own1 - own0) / _TICK, t1 - t0, self.ranks)


def between(host: str, cpus: float, before: tuple, after: tuple, own_seconds: float, wall: float,
            ranks: int) -> NodeLoad:
    """The :class:`NodeLoad` from two :func:`node_ticks` samples ``wall`` seconds apart, with this job's processes'
    CPU seconds over the same interval."""
    total, idle, steal = (b - a for a, b in zip(before, after))
    total = max(total, 1)
    busy = (total - idle - steal) / total * cpus
    return NodeLoad(host, cpus, busy, min(busy, own_seconds / wall), steal / total, ranks)


def mean_load(loads) -> Optional[NodeLoad]:
    """The average of consecutive :class:`NodeLoad` of one node (windows of about the same length); None for none."""
    loads = [load for load in loads if load is not None]
    if not loads:
        return None
    n = len(loads)
    return NodeLoad(loads[0].host, loads[0].cpus, sum(x.busy for x in loads) / n, sum(x.own for x in loads) / n,
                    sum(x.steal for x in loads) / n, loads[0].ranks)
