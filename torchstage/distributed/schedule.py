"""When the ranks next agree on the run's agreement channel: every ``every`` train batches, or about every ``period``
seconds.

The ranks must run the agreement's all-reduce after the same batches, so the interval is never a rank's own
guess: each rank proposes how many of its batches take ``period`` seconds, the agreement carries the
proposals with the riders' numbers, and every rank uses the smallest one it read (the same number on every
rank). An interval at most quadruples from one agreement to the next, and starts again from one batch at
each train loader, so a loader or stage slower than the one before is checked within about its period.
"""
import time

#: Largest growth of the interval from one agreement to the next.
GROWTH = 4


class CheckSchedule:
    """Which train batches end with an agreement read (``global_batch_step`` numbers, equal on every rank)."""

    def __init__(self, every=None, period: float = 0.5, clock=time.perf_counter):
        self.every, self.period, self.clock = every, period, clock
        self.interval, self._next, self._since, self._fresh = 1, 0, None, False

    def start_loader(self, step: int) -> None:
        """A train loader starts after ``step`` batches: batch times are measured from here, and the interval
        starts again from one batch (another loader or stage may run at another speed), ignoring a proposal
        made in the loader before."""
        self._since = (self.clock(), step)
        if self.every is None:
            self.interval, self._next, self._fresh = 1, step + 1, True

    def due(self, step: int) -> bool:
        """Whether the agreement runs at the end of batch ``step``."""
        if self.every is not None:
            return step % self.every == 0
        return step >= self._next

    def proposal(self, step: int) -> int:
        """This rank's interval: the batches that take about ``period`` seconds here (0 with a fixed ``every``)."""
        if self.every is not None or self._since is None or step <= self._since[1]:
            return 0 if self.every is not None else 1
        seconds_per_batch = (self.clock() - self._since[0]) / (step - self._since[1])
        fits = round(self.period / seconds_per_batch) if seconds_per_batch > 0 else self.interval * GROWTH
        return max(1, min(fits, self.interval * GROWTH))

    def agreed(self, step: int, interval: int) -> None:
        """An agreement was read at ``step`` with the ranks' smallest proposal ``interval`` (0: none read)."""
        if self.every is None:
            self.interval = 1 if self._fresh else max(1, interval or self.interval)
            self._next, self._fresh = step + self.interval, False
