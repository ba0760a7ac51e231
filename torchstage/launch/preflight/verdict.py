"""What the pre-flight figures say: which ranks are outliers, the tables, and the ``--exclude`` to resubmit without
their nodes. Pure functions of the gathered figures (no clock, no collective), so they are tested on numbers.

A rank is an outlier in a measure when it is at least ``threshold`` (0.2: 20 %) below the median of the other
ranks (see :func:`outliers`): the median of the others, not of all, so that with two ranks (or half the ranks
slow) the slow ones are still compared with the fast ones.
"""
import statistics
from dataclasses import dataclass, field
from typing import Optional

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


def excluded(found: list) -> list:
    """The hosts of the outliers, each once, in the order found."""
    return list(dict.fromkeys(o.host for o in found))


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
    if len(ranks) < 2:
        lines.append("one process: nothing to compare (start it under srun, torchrun or mpirun, or with --nprocs N)")
    elif not found:
        lines.append(f"all {len(ranks)} ranks agree (none is {threshold:.0%} or more below the median of the others)")
    else:
        lines.append(f"outliers ({threshold:.0%} or more below the median of the other ranks, marked *):")
        units = {key: unit for key, _, unit in MEASURES}
        for o in found:
            lines.append(f"  rank {o.rank} on {o.host}: {o.measure} {o.value:.2f} {units[o.measure]} against "
                         f"{o.median:.2f} for the others ({-o.below:+.0%})")
        hosts = excluded(found)
        if slurm:
            lines.append(f"resubmit without them: --exclude={','.join(hosts)}")
        else:
            lines.append(f"slow host{'s' * (len(hosts) > 1)}: {', '.join(hosts)}")
    return "\n".join(lines)


def _cell(value, flagged: bool) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{' *' if flagged else '  '}"
