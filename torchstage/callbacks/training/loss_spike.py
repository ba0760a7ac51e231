"""The loss-spike rule: a finite train loss far above the losses just before it (a bad batch that blows the weights up).

A loss is compared with the median of the last ``window`` train losses that were accepted (trained on), read
lazily by :class:`~torchstage.callbacks.training.nonfinite.NonFiniteLossCallback` with the non-finite check
(``spike=LossSpike(...)``): no host sync per batch.
"""
import bisect
import math
import statistics
from collections import deque
from numbers import Real

from torchstage.arguments import ArgumentError

#: The median absolute deviation times this estimates the standard deviation of normally distributed losses.
MAD_TO_SIGMA = 1.4826
#: The deviation rule's unit is at least this share of the median: steady losses (a deviation near 0) do not make
#: every small rise a spike.
MIN_SPREAD = 0.01


class LossSpike:
    """A train loss is a spike when it is above the running median of the last ``window`` accepted losses by a
    ``factor`` (``loss > median + (factor - 1) x |median|``: ``factor`` times a positive median) or by
    ``deviations`` robust deviations (``loss > median + deviations x 1.4826 x MAD``, the median absolute deviation,
    taken at least 1 % of ``|median|``); with both given, either rule flags it. Neither given: ``factor=10``.

    The first ``warmup`` losses of a run (default ``min(window, 20)``) are not judged, only kept. A spike is not
    added to the window; the window is kept per rank and per loss key, and in checkpoints.
    """

    def __init__(self, factor: float = None, deviations: float = None, window: int = 100, warmup: int = None):
        for name, value, low in (("factor", factor, 1), ("deviations", deviations, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, Real) or not
                                      low < value < math.inf):
                raise ArgumentError(name, f"must be a number > {low}, got {value!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 3:
            raise ArgumentError("window", f"must be an integer >= 3 (how many recent losses the median is taken "
                                          f"over), got {window!r}")
        warmup = min(window, 20) if warmup is None else warmup
        if isinstance(warmup, bool) or not isinstance(warmup, int) or not 1 <= warmup <= window:
            raise ArgumentError("warmup", f"must be an integer from 1 to window={window} (losses kept before any is "
                                          f"judged), got {warmup!r}")
        self.factor = 10.0 if factor is None and deviations is None else factor
        self.deviations, self.window, self.warmup = deviations, window, warmup

    def __repr__(self) -> str:
        rules = [f"factor={self.factor}"] if self.factor is not None else []
        rules += [f"deviations={self.deviations}"] if self.deviations is not None else []
        return f"LossSpike({', '.join(rules)}, window={self.window}, warmup={self.warmup})"

    def history(self, values=()) -> "Window":
        """A window of accepted losses (empty, or holding ``values``' last ``window``)."""
        return Window(values, self.window)

    def judge(self, history: "Window", value: float, keep: bool = True):
        """Why ``value`` is a spike against ``history`` (its window), or None: then it is added to the window (unless
        not ``keep``: the caller adds it once the batch is trained on)."""
        if len(history) < self.warmup:
            if keep:
                history.append(value)
            return None
        median = history.median()
        over = f"over the last {len(history)} train losses"
        if self.factor is not None and value > median + (self.factor - 1) * abs(median):
            return f"above {self.factor:g} x its running median {median:.4g} {over}"
        if self.deviations is not None:
            spread = max(MAD_TO_SIGMA * statistics.median(abs(x - median) for x in history),
                         MIN_SPREAD * abs(median), 1e-12)
            if value > median + self.deviations * spread:
                return (f"{(value - median) / spread:.1f} robust deviations above its running median {median:.4g} "
                        f"(deviation unit {spread:.3g}) {over}")
        if keep:
            history.append(value)
        return None


class Window:
    """The last ``size`` accepted losses in order, kept sorted too: the median of each new loss costs a lookup, not a
    sort (one judgement per train batch, at the checks)."""

    def __init__(self, values=(), size: int = 100):
        self.order, self.sorted = deque(maxlen=size), []
        for value in values:
            self.append(value)

    def append(self, value: float) -> None:
        if len(self.order) == self.order.maxlen:
            del self.sorted[bisect.bisect_left(self.sorted, self.order[0])]
        self.order.append(value)
        bisect.insort(self.sorted, value)

    def median(self) -> float:
        values, n = self.sorted, len(self.sorted)
        return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        return iter(self.order)
