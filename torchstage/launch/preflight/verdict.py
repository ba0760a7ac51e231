"""What the pre-flight figures say: which ranks are outliers, the tables, and the ``--exclude`` to resubmit without
their nodes. Pure functions of the gathered figures (no clock, no collective), so they are tested on numbers.

A rank is an outlier in a measure when it is at least ``threshold`` (0.2: 20 %) below the median of the other
ranks (see :func:`outliers`): the median of the others, not of all, so that with two ranks (or half the ranks
slow) the slow ones are still compared with the fast ones. A host whose every rank is an outlier in a measure is
named as the host (what the whole node suffers is no rank's), and a host shared with other work (oversubscribed,
its cores full of another job's work, time stolen) gets its verdict marked low-confidence (:mod:`~torchstage.launch.
node_load`).
"""
import statistics
from dataclasses import dataclass, field
from typing import Optional

from torchstage.launch.node_load import between
from torchstage.launch.startup_waits import ranges

#: The measures compared across ranks: (key, column header, unit).
MEASURES = (("matmul", "matmul GFLOP/s", "GFLOP/s"), ("memory", "memory GB/s", "GB/s"),
            ("link", "link GB/s", "GB/s"))
#: A rank's link speed is compared with the others' only when it exchanged with at least this many peers.
MIN_PEERS = 2


@dataclass
class RankFigures:
    """One rank's figures: where it ran, each probe's result per repeat (``link``: the median over the peers it
    exchanged with in that repeat) and the median GB/s of its exchanges with each peer."""

    rank: int
    host: str
    local_rank: int
    device: str
    matmul: list
    memory: list
    link: list = field(default_factory=list)
    links: dict = field(default_factory=dict)
    #: Whether its links are compared with the others': between hosts, or between GPUs; not between the CPU
    #: processes of one host (loopback, as fast as the scheduler lets both sides run: the matmul already says it).
    judge_link: bool = True
    #: Ranks on its machine over the CPUs it may run on (more than 1: they take turns on the cores).
    crowding: float = 1.0
    #: Its CPU seconds and the wall seconds of the probes, its node's CPUs and ``/proc/stat`` ticks before and after
    #: them (:func:`~torchstage.launch.node_load.node_ticks`): how busy the node was besides the job.
    cpu_seconds: float = 0.0
    wall: float = 0.0
    cpus: float = 0.0
    node_ticks: tuple = ()

    def value(self, measure: str) -> Optional[float]:
        """The median of this rank's repeats of ``measure`` (None: it has none)."""
        samples = getattr(self, measure)
        return statistics.median(samples) if samples else None


@dataclass(frozen=True)
class Outlier:
    """A rank at least the threshold below the other ranks in one measure: ``value`` its figure (the median of its
    repeats), ``median`` the median of the other ranks' figures."""

    rank: int
    host: str
    measure: str
    value: float
    median: float

    @property
    def below(self) -> float:
        return 1 - self.value / self.median if self.median > 0 else 0.0


def outliers(ranks: list, threshold: float = 0.2) -> list:
    """Every (rank, measure) at least ``threshold`` below the median of the other ranks, in rank order. A rank's
    figure is the median of its repeats: a moment of load on one rank moves one repeat, not the median (ranks that
    share a machine's memory or cores trade speed from repeat to repeat, so repeats are not compared one by one)."""
    found = []
    for key, _, _ in MEASURES:
        # an exchange is as slow as its slower side: a rank's links say something of it only when it met several
        # peers (two nodes, or two ranks, cannot tell which side is slow)
        values = {r.rank: r.value(key) for r in ranks
                  if getattr(r, key) and (key != "link" or (r.judge_link and len(r.links) >= MIN_PEERS))}
        if len(values) < 2:
            continue
        for r in ranks:
            value = values.get(r.rank)
            if value is None:
                continue
            median = statistics.median(v for rank, v in values.items() if rank != r.rank)
            if median > 0 and value <= (1 - threshold) * median:
                found.append(Outlier(r.rank, r.host, key, value, median))
    return sorted(found, key=lambda o: (o.rank, [m[0] for m in MEASURES].index(o.measure)))


def host_loads(ranks: list) -> dict:
    """Host -> :class:`~torchstage.launch.node_load.NodeLoad` during the probes (the ticks of its first rank, the
    CPU seconds of all its ranks), for the hosts whose ranks sampled them."""
    loads = {}
    for host in dict.fromkeys(r.host for r in ranks):
        mine = [r for r in ranks if r.host == host]
        first = mine[0]
        if len(first.node_ticks) != 2 or None in first.node_ticks or first.wall <= 0 or first.cpus <= 0:
            continue
        own = sum(r.cpu_seconds for r in mine)
        loads[host] = between(host, first.cpus, *first.node_ticks, own, first.wall, len(mine))
    return loads


def whole_hosts(ranks: list, found: list) -> dict:
    """``(host, measure)`` -> its outliers, where every rank of a host of several ranks is an outlier in a measure:
    the node's doing, named as the host."""
    per_host = {}
    for r in ranks:
        per_host.setdefault(r.host, []).append(r.rank)
    whole = {}
    for host, members in per_host.items():
        for key, _, _ in MEASURES:
            mine = [o for o in found if o.host == host and o.measure == key]
            if len(members) > 1 and len(mine) == len(members):
                whole[(host, key)] = mine
    return whole


def excluded(found: list, ranks: list = None) -> list:
    """The hosts of the outliers, each once, in the order found (none when ``ranks`` all run on one host: excluding
    it would leave nothing to run on)."""
    if ranks is not None and len({r.host for r in ranks}) < 2:
        return []
    return list(dict.fromkeys(o.host for o in found))


def found_text(found: list) -> str:
    """``slow ranks 2-3 on node2``: what a stop record says of the outliers."""
    ranks = sorted({o.rank for o in found})
    return f"slow rank{'s' * (len(ranks) > 1)} {ranges(ranks)} on {', '.join(dict.fromkeys(o.host for o in found))}"


def node_links(ranks: list) -> dict:
    """``(host, host)`` -> the median GB/s of the exchanges between the ranks of two different hosts."""
    host_of = {r.rank: r.host for r in ranks}
    pairs = {}
    for r in ranks:
        for peer, value in r.links.items():
            a, b = sorted((r.host, host_of[peer]))
            if a != b:
                pairs.setdefault((a, b), []).append(value)
    return {pair: statistics.median(values) for pair, values in sorted(pairs.items())}


def report(ranks: list, found: list, all_reduce: Optional[float], threshold: float, slurm: bool) -> str:
    """The pre-flight report: one table per host, the all-reduce and the links between hosts, then the verdict
    (the outliers by rank and host, and under SLURM the ``--exclude`` to resubmit without them)."""
    flagged = {(o.rank, o.measure) for o in found}
    lines = []
    hosts = list(dict.fromkeys(r.host for r in ranks))
    for host in hosts:
        mine = [r for r in ranks if r.host == host]
        lines.append(f"node {host} ({len(mine)} rank{'s' * (len(mine) > 1)})")
        lines.append(f"  {'rank':>5} {'local':>5}  {'device':<22}" + "".join(f" {h:>16}" for _, h, _ in MEASURES))
        for r in mine:
            cells = "".join(f" {_cell(r.value(key), (r.rank, key) in flagged):>16}" for key, _, _ in MEASURES)
            lines.append(f"  {r.rank:>5} {r.local_rank:>5}  {r.device[:22]:<22}{cells}")
    if all_reduce is not None:
        lines.append(f"all-reduce over the {len(ranks)} ranks: {all_reduce:.2f} GB/s bus bandwidth")
    links = node_links(ranks)
    if links:
        lines.append("links between nodes: " + ", ".join(f"{a}-{b} {value:.2f} GB/s" for (a, b), value in links.items()))
    crowded = {r.host: r.crowding for r in ranks if r.crowding > 1}
    if crowded:
        lines.append("note: " + ", ".join(f"{host} runs {value:.1f} processes per CPU" for host, value in crowded.items())
                     + ": they take turns on the cores, and the kernel's turns are not even; an outlier there may "
                       "be the scheduler's (give each rank its own cores for a verdict on the hardware)")
    doubts = {host: load.confidence() for host, load in host_loads(ranks).items() if load.doubt() is not None}
    for confidence in doubts.values():
        lines.append(f"confidence {confidence}: its ranks are measured as the kernel shares the cores, not as their "
                     f"hardware runs")
    if len(ranks) < 2:
        lines.append("one process: nothing to compare (start it under srun, torchrun or mpirun, or with --nprocs N)")
    elif not found:
        lines.append(f"all {len(ranks)} ranks agree (none is {threshold:.0%} or more below the median of the others)")
    else:
        lines.append(f"outliers ({threshold:.0%} or more below the median of the other ranks, marked *):")
        units = {key: unit for key, _, unit in MEASURES}
        whole = whole_hosts(ranks, found)
        for (host, key), mine in whole.items():
            value, median = statistics.median(o.value for o in mine), statistics.median(o.median for o in mine)
            lines.append(f"  host {host}, all its {len(mine)} ranks ({ranges([o.rank for o in mine])}): {key} "
                         f"{value:.2f} {units[key]} against {median:.2f} for the others ({value / median - 1:+.0%}): "
                         f"the node, not one rank{' (low confidence)' if host in doubts else ''}")
        for o in found:
            if (o.host, o.measure) not in whole:
                lines.append(f"  rank {o.rank} on {o.host}: {o.measure} {o.value:.2f} {units[o.measure]} against "
                             f"{o.median:.2f} for the others ({-o.below:+.0%})"
                             f"{' (low confidence)' if o.host in doubts else ''}")
        hosts = excluded(found)
        if len(set(r.host for r in ranks)) > 1:
            lines.append(f"resubmit without them: --exclude={','.join(hosts)}" if slurm else
                         f"slow host{'s' * (len(hosts) > 1)}: {', '.join(hosts)}")
        else:
            lines.append(f"every rank runs on {hosts[0]}: the outliers are ranks of it, not a slower host (look at "
                         f"what shares their cores, and at their binding)")
    return "\n".join(lines)


def _cell(value, flagged: bool) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{' *' if flagged else '  '}"
