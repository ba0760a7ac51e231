"""Stragglers named while training: in a run of several processes, the rank whose compute or data is slower than
the others', by rank, host, local rank and part, within seconds of its slowdown, again when it gets worse or
recovers.

Each rank times its train batches (:mod:`~torchstage.callbacks.monitoring.step_clock`: data, compute, and the
wait for the others at the end of backward). The sums ride the run's agreement channel, about every 0.5 s
(a :class:`~torchstage.distributed.agreement.Rider` of ``runner.channel``, with the stop requests and any other
signal): no collective of its own per step. The main rank judges them
(:mod:`~torchstage.callbacks.monitoring.straggler_rule`) and logs one line per finding. Per train loader, one small
all-reduce on the channel gathers each rank's times for the loggers.
"""
import logging
import os
import statistics
import time
from numbers import Real

import torch

from torchstage.arguments import ArgumentError
from torchstage.callbacks.base import Callback, CallbackScope
from torchstage.callbacks.loggers.logger_base import RANKS, log_metrics
from torchstage.callbacks.monitoring.step_clock import BackwardWait, StepClock
from torchstage.callbacks.monitoring.straggler_rule import PARTS, StragglerRule, note
from torchstage.distributed.agreement import Rider
from torchstage.files.log_files import LogFiles
from torchstage.files.straggler_log import EPISODES_FILE, RANKS_FILE, event_line, ranks_text
from torchstage.launch.hosts import host_name
from torchstage.launch.node_load import LoadMeter, mean_load
from torchstage.launch.resolve import restart_attempt
from torchstage.one_or_many import each

logger = logging.getLogger("torchstage")
#: Numbers per rank in a payload: data, compute and wait microseconds, batches.
SLOT = 4
#: Above this many processes the loggers get summaries of the ranks' times, not each rank's.
PER_RANK_LIMIT = 64
#: Agreements kept to date a finding (about a minute at two a second); those covering fewer seconds of training are
#: too noisy to date one (each train loader starts with agreements after 1, 4, 16... batches).
RECENT, BRIEF = 128, 0.2
#: What an agreement that does not show a finding's change weighs against the 1 of one that does, in dating it.
MISS = 2.0


class StragglerDetector(Callback, Rider):
    """Names a rank whose compute or data time per train batch stays at least ``threshold`` (0.2: 20 %) above the
    median of the other ranks' for ``patience`` windows of about ``window`` seconds of training in a row, and costs
    the job at least ``min_share`` of its time: one warning with the word ``straggler``, the rank, its host and
    local rank, the part, its time against the median and the share of the job's time lost. Once per episode;
    again when the rank gets worse, when it recovers, and if the run ends while it is slow. With a logdir the
    findings go to ``logs/stragglers.jsonl`` (``torchstage diagnose``) and each rank's times per train loader to
    the loggers (``logs/ranks/<loader>.csv``, TensorBoard, MLflow; ``torchstage report``).

    Part of the default chain of every run of several processes (``callbacks={"stragglers": None}`` removes it).
    """

    order = 10_010  # a batch ends after every other callback (the graceful stop's 10_000 too): their work counts
    scope = CallbackScope.Distributed
    train_batches_only = True
    name = "stragglers"

    def __init__(self, threshold: float = 0.2, window: float = 2.0, patience: int = 3, min_share: float = 0.05):
        for name, value in (("threshold", threshold), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, Real) or not value > 0:
                raise ArgumentError(name, f"must be a number > 0, got {value!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ArgumentError("patience", f"must be an integer >= 1 (windows in a row), got {patience!r}")
        if isinstance(min_share, bool) or not isinstance(min_share, Real) or not 0 <= min_share < 1:
            raise ArgumentError("min_share", f"must be a share of the job's time in [0, 1), got {min_share!r}")
        self.threshold, self.window, self.patience, self.min_share = threshold, float(window), patience, min_share
        self._clock = self._wait = self._rule = self._files = None
        self._found, self._episodes, self._places, self._recent, self._first, self._loop = [], {}, [], [], None, None
        self._meter, self._loads, self._windows = None, [], 0  # the main rank's node load, per window judged

    # ---- the run ---------------------------------------------------------------------------------
    def on_experiment_start(self, runner):
        engine = runner.engine
        self._rank, self._world, self._main = engine.rank, engine.world_size, engine.is_main
        gathered = runner.channel.all_gather_object((host_name(), engine.local_rank, os.getpid()))
        self._places = [(host, local) for host, local, _ in gathered]
        here = gathered[self._rank][0]  # the main rank measures how busy its node is besides the job
        self._meter = LoadMeter(here, [pid for host, _, pid in gathered if host == here]) if self._main else None
        self._loads = []
        self._wait = BackwardWait(each(runner.model))
        self._clock = StepClock(self._wait)
        self._found, self._episodes = [], {}
        self._loop = runner.loop
        # (end mark, seconds, batches, window) of recent agreements (the window: how many the rule had judged before
        # it); the first train loader's start
        self._recent, self._first, self._windows = [], None, 0
        self._rule = StragglerRule(self._world, self.threshold, self.window, self.patience, self.min_share) \
            if self._main else None
        logdir = runner.spec.logdir if runner.spec is not None else None
        self._logdir = logdir
        self._files = LogFiles() if self._main and logdir is not None else None
        if self._files is not None:
            self._files.replace(runner, f"{logdir}/{RANKS_FILE}", ranks_text(self._places))

    def on_stage_start(self, runner):
        runner.channel.join(self)

    def on_loader_start(self, runner):
        if runner.loop.is_train_loader:
            if self._first is None:
                self._first = self._mark()
            self._clock.loader_start()

    def on_batch_start(self, runner):
        self._clock.batch_start()

    def on_batch_end(self, runner):
        self._clock.batch_end()
        if self._found:
            self._report(runner)

    def on_loader_end(self, runner):
        if runner.loop.is_train_loader:
            self._log_loader(runner)

    def on_epoch_end(self, runner):
        if self._found:  # read by an agreement at the epoch end
            self._report(runner)

    def on_experiment_end(self, runner):  # the loop read the channel's last agreement first
        if self._rule is not None:
            self._found += [(self._rule.ended(rank, part), self._mark()) for rank, part in self._rule.named()]
        self._report(runner)
        self._release(runner)

    def on_exception(self, runner):
        self._release(runner)

    def _release(self, runner):
        if self._wait is not None:
            self._wait.remove()
            self._wait = None
        if self._files is not None:
            self._files.close(runner)

    # ---- the agreement channel ---------------------------------------------------------------------
    def payload(self) -> torch.Tensor:
        """This rank's data, compute and wait microseconds and batches since the last agreement, in its slot."""
        data, compute, waited, batches = self._clock.take()
        values = torch.zeros(self._world * SLOT, dtype=torch.int64)
        start = self._rank * SLOT
        values[start:start + SLOT] = torch.tensor([_us(data), _us(compute), _us(waited), batches], dtype=torch.int64)
        return values

    def arrived(self, values: torch.Tensor) -> None:
        """Every rank's sums of the same train batches: judged on the main rank (reported at its next batch end)."""
        if self._rule is None:
            return
        rows = values.view(self._world, SLOT).tolist()
        batches = rows[0][3]
        if any(row[3] != batches for row in rows):  # not the same batches: nothing to compare
            logger.debug("straggler detector: the ranks timed different batches %s", [row[3] for row in rows])
            return
        if batches == 0:  # an agreement between loaders (an epoch's end, a validation pass): no train batch timed
            return
        data, compute, waited = ([row[i] / 1e6 for row in rows] for i in range(3))
        mark = self._mark()
        self._recent = self._recent + [(mark, {"data": data, "compute": compute, "wait": waited}, batches,
                                        self._windows)]
        self._recent = self._recent[-max(16, min(RECENT, 131_072 // self._world)):]  # a few MB on the main rank
        window = self._rule.last_window
        found = self._rule.add(data, compute, waited, batches)
        if self._rule.last_window is window:
            return
        self._windows += 1
        if self._meter is not None:
            self._loads = (self._loads + [self._meter.take()])[-RECENT:]
        for finding in found:
            self._found.append((finding, self._began(finding)))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("straggler window (ms per batch): %s", {part: [round(v * 1e3, 2) for v in values]
                                                                 for part, values in self._rule.last_window.items()})

    def _began(self, finding) -> tuple:
        """When and where the change a finding reports began, to the agreement: the start of the agreement from
        which on the rank was slow (for "slow", "worse") or no longer slow (for "recovered") by the rule's own test
        on each agreement's figures, most consistently: each agreement that agrees counts 1, each that does not
        :data:`MISS` (a change point: a blip in the run costs little, noise before it on a shared core cannot add
        up). Only the agreements of the windows that led to the finding and of the one before them are weighed:
        that window, as a whole, did not show the change, so it cannot have begun earlier. Agreements of under
        :data:`BRIEF` seconds are left out."""
        rule, rank, part = self._rule, finding.rank, finding.part
        test = (lambda *figures: not rule.slow(*figures)) if finding.kind == "recovered" else rule.slow
        earliest = self._windows - finding.windows - 1  # the window before those that led to the finding
        start, score, best = len(self._recent), 0.0, 0.0
        for index in range(len(self._recent) - 1, -1, -1):
            _, sums, batches, window = self._recent[index]
            if window < earliest:
                break
            values = [value / batches for value in sums[part]]
            step = statistics.median(sum(sums[p][r] for p in sums) / batches for r in range(self._world))
            if step * batches < BRIEF:  # a loader's first agreements, after 1, 4, 16... batches: noise
                continue
            median = statistics.median(values[:rank] + values[rank + 1:])
            score += 1.0 if step > 0 and test(values[rank], median, (values[rank] - median) / step) else -MISS
            if score > 0 and score >= best:
                start, best = index, score
        return self._recent[start - 1][0] if start > 0 else self._first

    def _mark(self) -> tuple:
        """Now, and where the loop is: ``(time, {stage, epoch, global_batch_step})``."""
        loop = self._loop
        return time.time(), {"stage": loop.stage_key, "epoch": loop.epoch, "global_batch_step": loop.global_batch_step}

    # ---- what the main rank says -------------------------------------------------------------------
    def _report(self, runner) -> None:
        found, self._found = self._found, []
        now = time.time()
        where = {"stage": runner.loop.stage_key, "epoch": runner.loop.epoch, "global_batch_step": runner.loop.global_batch_step}
        for finding, began in found:
            key = (finding.rank, finding.part)
            if finding.kind == "slow":
                self._episodes[key] = began
            since = self._episodes.get(key, began)
            host, local_rank = self._places[finding.rank]
            note, load = self._note(finding)
            logger.warning("%s%s", describe(finding, host, local_rank, since, began, now, where), note)
            if self._files is not None:
                event = {"kind": finding.kind, "rank": finding.rank, "host": host, "local_rank": local_rank,
                         "part": finding.part, "value_ms": finding.value * 1e3, "median_ms": finding.median * 1e3,
                         "share": finding.share, "worst": finding.worst, "time": now, "began": began[0],
                         "confidence": None if load is None else ("high" if load.doubt() is None else "low"),
                         "began_at": began[1], "since": since[0], "since_at": since[1], "attempt": restart_attempt(),
                         **where}
                self._files.append(runner, f"{self._logdir}/{EPISODES_FILE}", event_line(event))
            if finding.kind in ("recovered", "ended"):
                self._episodes.pop(key, None)

    def _note(self, finding) -> tuple:
        """What a finding's line adds (:func:`~.straggler_rule.note`) and the load of its host it read (None: a rank
        of another host than the main rank's, whose load is not measured here)."""
        mine = self._meter is not None and self._places[finding.rank][0] == self._meter.host
        load = mean_load(self._loads[-max(1, finding.windows):]) if mine else None
        return note(finding, self._places, self._rule.named(), load), load

    def _log_loader(self, runner) -> None:
        """Each rank's data, compute and wait time per batch of this train loader, to the loggers (one all-reduce)."""
        data, compute, waited, batches = self._clock.loader_sums()
        values = torch.zeros(self._world * SLOT, dtype=torch.int64)
        start = self._rank * SLOT
        values[start:start + SLOT] = torch.tensor([_us(data), _us(compute), _us(waited), batches], dtype=torch.int64)
        runner.channel.all_reduce_max(values)
        if not self._main:
            return
        rows = values.view(self._world, SLOT).tolist()
        metrics = loader_figures(rows, per_rank=self._world <= PER_RANK_LIMIT)
        if metrics:
            log_metrics(runner, metrics, runner.loop.global_epoch_step, runner.loop.loader_key, RANKS)


def loader_figures(rows: list, per_rank: bool = True) -> dict:
    """The loggers' figures of one train loader from each rank's ``(data, compute, wait µs, batches)``:
    milliseconds per batch of each rank (``rank3/compute_ms``...; with ``per_rank``), their medians and maxima,
    the slowest rank of each part, and ``lost_share``, the largest share of the job's time one rank's excess
    over the median cost."""
    per_batch = {}
    for part, index in (("data", 0), ("compute", 1), ("wait", 2)):
        # the first batch of a loader has no data time (its workers start): one gap fewer than batches
        per_batch[part] = [row[index] / 1e3 / max(1, row[3] - (part == "data")) for row in rows]
    if not any(row[3] for row in rows):
        return {}
    metrics = {}
    if per_rank:
        for rank in range(len(rows)):
            for part in ("data", "compute", "wait"):
                metrics[f"rank{rank}/{part}_ms"] = per_batch[part][rank]
    step = statistics.median(sum(per_batch[part][rank] for part in per_batch) for rank in range(len(rows)))
    lost = 0.0
    for part in PARTS:
        values = per_batch[part]
        metrics[f"median/{part}_ms"] = statistics.median(values)
        metrics[f"max/{part}_ms"] = max(values)
        metrics[f"slowest/{part}_rank"] = values.index(max(values))
        for rank, value in enumerate(values):
            others = statistics.median(values[:rank] + values[rank + 1:])
            lost = max(lost, (value - others) / step if step > 0 else 0.0)
    metrics["lost_share"] = lost
    return metrics


def describe(finding, host: str, local_rank: int, since: tuple, began: tuple, now: float, where: dict) -> str:
    """The log line of a finding (each says ``straggler``, the rank, its host and local rank, and the part).
    ``since``: when and where the episode began; ``began``: when and where the change found now began."""
    who = f"rank {finding.rank} (host {host}, local rank {local_rank})"
    times = (f"{finding.value * 1e3:.1f} ms per batch against a median of {finding.median * 1e3:.1f} ms "
             f"({finding.excess:+.0%})")
    here = f"stage {where['stage']!r}, epoch {where['epoch']}, global batch {where['global_batch_step']}"
    start = f"epoch {since[1]['epoch']}, global batch {since[1]['global_batch_step']}"
    if finding.kind == "slow":
        return (f"straggler: {who} is slow in {finding.part}: {times}, costing the job {finding.share:.0%} of its "
                f"time; slow since {start}, {now - since[0]:.1f} s ago ({here})")
    if finding.kind == "worse":
        return (f"straggler worse: {who} in {finding.part}: {times}, costing the job {finding.share:.0%} of its time "
                f"({here}; slow since {start})")
    if finding.kind == "recovered":
        back = f"epoch {began[1]['epoch']}, global batch {began[1]['global_batch_step']}"
        return (f"straggler recovered: {who} in {finding.part}: {times} ({here}); back to speed since {back}, "
                f"{now - began[0]:.1f} s ago, after {began[0] - since[0]:.1f} s slow since {start}; at worst it cost "
                f"the job {finding.worst:.0%} of its time")
    return (f"straggler: {who} was still slow in {finding.part} when the run ended ({here}), for "
            f"{now - since[0]:.1f} s since {start}; at worst it cost the job {finding.worst:.0%} of its time")


def _us(seconds: float) -> int:
    return max(0, int(seconds * 1e6))
