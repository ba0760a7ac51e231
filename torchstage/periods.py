"""How often something happens in a run: every N train batches (:class:`Batch`) or N epochs (:class:`Epoch`).

A period is asked after each train batch (:meth:`Period.batch_due`) and at each epoch's end
(:meth:`Period.epoch_due`); several periods may be combined as a tuple, due when any one is due.
"""
from torchstage.arguments import ArgumentError


class Period:
    """Base class: never due; subclasses say at which batch or epoch boundaries they are."""

    def __init__(self, n: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{type(self).__name__}(n) needs an integer n >= 1, got {n!r}")
        self.n = n

    def batch_due(self, runner) -> bool:
        """True after a train batch at which this period is due."""
        return False

    def epoch_due(self, runner) -> bool:
        """True at the end of an epoch at which this period is due."""
        return False

    def __eq__(self, other):
        return type(self) is type(other) and self.n == other.n

    def __hash__(self):
        return hash((type(self).__name__, self.n))

    def __repr__(self):
        return f"{type(self).__name__}({self.n})"


class Batch(Period):
    """Due after every ``n``-th train batch of the run (counted by ``runner.global_batch_step``)."""

    def batch_due(self, runner) -> bool:
        return runner.loop.is_train_loader and runner.loop.global_batch_step % self.n == 0


class Epoch(Period):
    """Due at the end of every ``n``-th epoch of a stage (``runner.epoch``, counted from 1)."""

    def epoch_due(self, runner) -> bool:
        return runner.loop.epoch % self.n == 0


def as_periods(value, name: str = "period") -> tuple:
    """A tuple of periods from a Period, an int (``n`` means ``Epoch(n)``), a tuple/list of them, or None."""
    if value is None:
        return ()
    items = value if isinstance(value, (tuple, list)) else (value,)
    periods = []
    for item in items:
        if isinstance(item, Period):
            periods.append(item)
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 1:
            periods.append(Epoch(item))
        else:
            raise ArgumentError(name, f"must be Batch(n), Epoch(n), an integer n >= 1 (every n epochs), a tuple of "
                                      f"those, or None; got {item!r}")
    return tuple(periods)


def batch_due(periods: tuple, runner) -> bool:
    """True if any of ``periods`` is due after the current train batch."""
    return any(p.batch_due(runner) for p in periods)


def epoch_due(periods: tuple, runner) -> bool:
    """True if any of ``periods`` is due at the end of the current epoch."""
    return any(p.epoch_due(runner) for p in periods)
