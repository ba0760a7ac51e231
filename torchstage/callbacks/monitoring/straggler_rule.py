"""When a rank counts as a straggler: the rule of :class:`~torchstage.callbacks.monitoring.stragglers.StragglerDetector`,
pure arithmetic on the ranks' times (no clock, no collective, no torch), so it is tested on numbers alone.

Every rank's data, compute and wait seconds over the same train batches come in (:meth:`StragglerRule.add`); once
they cover ``window`` seconds of training they are judged as one window. A rank is slow in a part (compute or
data) in a window when its time per batch is at least ``1 + threshold`` times the median of the other ranks', at
least :data:`MIN_EXCESS` seconds more per batch, and the excess is at least ``min_share`` of the job's time per
batch (every rank waits for the slowest, so the excess is the share of the job's time lost to it). It is named
after ``patience`` slow windows in a row; it has recovered after ``patience`` windows in a row under half the
threshold (or half the share): the gap between the two keeps a rank near the line from being named again and
again. While named, a share that grows by half (and by ``min_share``) for ``patience`` windows is reported as
worse.
:func:`whole_host` tells when every rank of a host is named in a part: the node's doing, said of the host.
"""
import statistics
from dataclasses import dataclass, field

#: The parts of a step a rank can be slow in.
PARTS = ("compute", "data")
#: Below this many seconds more per batch than the others nothing is named (timer and scheduler noise).
MIN_EXCESS = 2e-4
#: A share of the job's time that grows by this factor (and by ``min_share``) is reported as worse.
WORSE = 1.5


@dataclass(frozen=True)
class Finding:
    """What the rule found in a window: ``kind`` is "slow" (a rank is named), "worse", "recovered" or "ended" (the
    run ended while it was slow). Times are seconds per batch: ``value`` the rank's, ``median`` the other ranks'
    median; ``share`` the share of the job's time lost to it; ``worst`` the largest share of its episode;
    ``windows`` how many windows in a row led to it (the slow ones before a rank is named, the calm ones before it
    recovered), so the caller can date the change to the first of them."""

    kind: str
    rank: int
    part: str
    value: float
    median: float
    share: float
    worst: float = 0.0
    windows: int = 1

    @property
    def excess(self) -> float:
        """How much longer than the median, as a fraction of the median (0.5: 50 % longer)."""
        return self.value / self.median - 1 if self.median > 0 else float("inf")


@dataclass
class _Episode:
    """The state of one (rank, part): slow windows in a row, and once named, calm and worse windows in a row."""

    streak: list = field(default_factory=list)  # (value, median, share) of the slow windows in a row
    named: bool = False
    calm: int = 0
    worse: int = 0
    reported: float = 0.0  # the share last reported
    worst: float = 0.0
    last: tuple = (0.0, 0.0, 0.0)  # (value, median, share) of the last window judged


class StragglerRule:
    """Judges the ranks' times window by window and says who became slow, got worse or recovered."""

    def __init__(self, world_size: int, threshold: float = 0.2, window: float = 2.0, patience: int = 3,
                 min_share: float = 0.05):
        self.world_size, self.threshold, self.window = world_size, threshold, window
        self.patience, self.min_share = patience, min_share
        self._episodes = {(rank, part): _Episode() for rank in range(world_size) for part in PARTS}
        self.last_window = None  #: seconds per batch (``[part][rank]``) of the last window judged
        self._reset()

    def _reset(self) -> None:
        self._sums = {part: [0.0] * self.world_size for part in (*PARTS, "wait")}
        self._batches = 0

    def add(self, data, compute, wait, batches: int) -> list:
        """Every rank's seconds (lists indexed by rank) over the same ``batches`` train batches; the findings of the
        window these complete (none until they cover ``window`` seconds of training)."""
        if batches <= 0:
            return []
        for part, values in (("data", data), ("compute", compute), ("wait", wait)):
            sums = self._sums[part]
            for rank, value in enumerate(values):
                sums[rank] += value
        self._batches += batches
        if self._batches * self.step_time() < self.window:
            return []
        per_batch = {part: [value / self._batches for value in sums] for part, sums in self._sums.items()}
        self._reset()
        self.last_window = per_batch
        return self.judge(per_batch)

    def step_time(self) -> float:
        """The job's time per batch in the window so far: the median over ranks of data + compute + wait."""
        if not self._batches:
            return 0.0
        totals = [sum(self._sums[part][rank] for part in self._sums) for rank in range(self.world_size)]
        return statistics.median(totals) / self._batches

    def judge(self, per_batch: dict) -> list:
        """The findings of one window of seconds per batch (``per_batch[part][rank]``)."""
        step = statistics.median(sum(per_batch[part][rank] for part in per_batch) for rank in range(self.world_size))
        findings = []
        for part in PARTS:
            values = per_batch[part]
            for rank, value in enumerate(values):
                median = statistics.median(values[:rank] + values[rank + 1:])
                share = (value - median) / step if step > 0 else 0.0
                found = self._update(self._episodes[(rank, part)], rank, part, value, median, share)
                if found is not None:
                    findings.append(found)
        return findings

    def slow(self, value: float, median: float, share: float) -> bool:
        """Whether a rank taking ``value`` s per batch against the others' ``median`` is slow in this window."""
        return value >= (1 + self.threshold) * median and value - median >= MIN_EXCESS and share >= self.min_share

    def calm(self, value: float, median: float, share: float) -> bool:
        """Whether a named rank is back under half the threshold (or half the share): one window of recovery."""
        return (value < (1 + self.threshold / 2) * median or share < self.min_share / 2
                or value - median < MIN_EXCESS)

    def _update(self, episode: _Episode, rank, part, value, median, share):
        episode.last = (value, median, share)
        if not episode.named:
            if not self.slow(value, median, share):
                episode.streak = []
                return None
            episode.streak.append((value, median, share))
            if len(episode.streak) < self.patience:
                return None
            value, median, share = (statistics.median(column) for column in zip(*episode.streak))
            windows = len(episode.streak)
            episode.streak, episode.named, episode.calm, episode.worse = [], True, 0, 0
            episode.reported = episode.worst = share
            return Finding("slow", rank, part, value, median, share, share, windows)
        episode.worst = max(episode.worst, share)
        if self.calm(value, median, share):
            episode.calm, episode.worse = episode.calm + 1, 0
            if episode.calm >= self.patience:
                windows, episode.named, episode.calm = episode.calm, False, 0
                return Finding("recovered", rank, part, value, median, share, episode.worst, windows)
            return None
        episode.calm = 0
        if share >= episode.reported * WORSE and share >= episode.reported + self.min_share:
            episode.worse += 1
            if episode.worse >= self.patience:
                windows, episode.worse, episode.reported = episode.worse, 0, share
                return Finding("worse", rank, part, value, median, share, episode.worst, windows)
        else:
            episode.worse = 0
        return None

    def named(self) -> list:
        """``(rank, part)`` of every rank named slow and not recovered."""
        return [key for key, episode in self._episodes.items() if episode.named]

    def ended(self, rank: int, part: str) -> Finding:
        """The "ended" finding of a rank still named when the run ends, with the last window's figures."""
        episode = self._episodes[(rank, part)]
        episode.named = False
        return Finding("ended", rank, part, *episode.last, episode.worst)


def whole_host(rank: int, part: str, named: list, places: list):
    """The ranks of ``rank``'s host when every one of them is named slow in ``part`` (``named``: ``(rank, part)``
    pairs), the host has several ranks and the job more than one host: what the whole node suffers, not a rank's;
    else None. ``places``: ``(host, local rank)`` per rank."""
    host = places[rank][0]
    mine = [r for r, (h, _) in enumerate(places) if h == host]
    if len(mine) < 2 or len({h for h, _ in places}) < 2:
        return None
    return mine if all((r, part) in named for r in mine) else None


def note(finding: Finding, places: list, named: list, load=None) -> str:
    """What a finding's line adds: the host, when every rank of it is slow (:func:`whole_host`); low confidence and
    why, when ``load`` (a :class:`~torchstage.launch.node_load.NodeLoad` of the rank's host over the windows judged)
    shows other work on full cores, oversubscription or steal. "" when neither."""
    text = ""
    mine = whole_host(finding.rank, finding.part, named, places) if finding.kind in ("slow", "worse") else None
    if mine is not None:
        text = f"; every rank of host {places[finding.rank][0]} ({', '.join(map(str, mine))}) is slow in " \
               f"{finding.part}: the node, not this rank"
    if load is not None and load.doubt() is not None and finding.kind != "recovered":
        text += f"; confidence {load.confidence()} (the slowness may be its neighbours' on its cores, not this rank's)"
    return text
