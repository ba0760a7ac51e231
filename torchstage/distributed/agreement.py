"""The run's agreement channel: the one way the ranks agree on host-side numbers while training, a background
all-reduce of a few integers on a CPU group about every 0.5 s, which every cross-rank signal of the run rides
(graceful stop requests, straggler timings, any later one) without knowing the others.

A :class:`Rider` joins the channel (:meth:`AgreementChannel.join`). The loop ticks the channel once per train batch:
at a due batch's end (see :mod:`~torchstage.distributed.schedule`) the agreement in flight is read and each rider
gets the element-wise maximum over the ranks of its numbers (:meth:`Rider.arrived`), before the batch-end callbacks,
which may act on it in that batch; at the next train batch's start the next agreement starts with each rider's
:meth:`Rider.payload`, after every callback of the batch before, so what they did (a stop requested in a batch-end
callback) rides it. One all-reduce per agreement whatever the riders; none without riders or alone.
"""
import torch
import torch.distributed as dist

from torchstage.distributed import collectives
from torchstage.distributed.schedule import CheckSchedule

#: About how often the ranks agree when no rider asks for a period or a batch count (seconds of training).
DEFAULT_PERIOD = 0.5


class Rider:
    """Numbers that travel with the agreement. The all-reduce takes the maximum, so a rider that wants every rank's
    numbers puts its own in its rank's slots and zeros elsewhere. A payload has the same length on every rank and
    at every agreement; every rank joins the same riders in the same order."""

    def payload(self) -> torch.Tensor:
        """This rank's numbers for the agreement starting now (a 1-D int64 CPU tensor)."""
        raise NotImplementedError

    def arrived(self, values: torch.Tensor) -> None:
        """The element-wise maximum over the ranks of the payloads of the agreement just read."""
        raise NotImplementedError


class Agreement:
    """One all-reduce (MAX) of the ``riders``' payloads and of this rank's proposed ``interval`` to the next
    agreement, started now in the background and read with :meth:`result`."""

    def __init__(self, riders, group=None, interval: int = 0):
        self.riders = tuple(riders)
        payloads = [rider.payload() for rider in self.riders]
        self.sizes = [p.numel() for p in payloads]
        # the max of -interval is the smallest interval any rank proposed
        self.values = torch.cat([torch.tensor([-interval], dtype=torch.int64), *payloads])
        self.work = dist.all_reduce(self.values, op=dist.ReduceOp.MAX, group=group, async_op=True)

    def result(self) -> int:
        """Wait for the all-reduce, give each rider its numbers, and return the smallest interval the ranks
        proposed (0: none proposed)."""
        self.work.wait()
        for rider, values in zip(self.riders, torch.split(self.values[1:], self.sizes)):
            rider.arrived(values)
        return -int(self.values[0])


class AgreementChannel:
    """The agreement channel of one run on ``engine`` (idle alone or without riders: no collective, no cost)."""

    def __init__(self, engine=None):
        self.active = engine is not None and engine.is_distributed
        self._world = engine.world_size if self.active else 1
        # host-side numbers travel on gloo: a gloo group of its own when the default group is not (NCCL needs device
        # tensors); made here, where every rank makes its channel (group creation is collective)
        self._group = dist.new_group(backend="gloo") if self.active and dist.get_backend() != "gloo" else None
        self._riders, self._asks = [], []
        self._schedule, self._pending, self._start_after = CheckSchedule(period=DEFAULT_PERIOD), None, None
        self._loader_from = None  # a train loader started after this many train batches; its first batch not yet

    def join(self, rider: Rider, every: int = None, period: float = None) -> None:
        """Let ``rider`` travel with every agreement from the next one on (once however often it joins); ``every``
        (train batches) or ``period`` (seconds) ask for agreements at least that often."""
        if not self.active or any(r is rider for r in self._riders):
            return
        self._riders.append(rider)
        self._asks.append((every, period))
        every = min((e for e, _ in self._asks if e is not None), default=None)
        period = min((p for _, p in self._asks if p is not None), default=DEFAULT_PERIOD)
        if (self._schedule.every, self._schedule.period) != (every, period):
            self._schedule = CheckSchedule(every=every, period=period)

    # ---- the loop's ticks ------------------------------------------------------------------------
    def loader_start(self, step: int) -> None:
        """A train loader starts after ``step`` train batches: the schedule starts again as its first batch starts
        (another loader may run at another speed; what the loader-start callbacks do is not the batches' time)."""
        if self._riders:
            self._loader_from, self._start_after = step, None

    def batch_start(self, step: int) -> None:
        """A train batch starts after ``step``: the next agreement starts when the last one was just read."""
        if self._loader_from is not None:
            self._schedule.start_loader(self._loader_from)
            self._loader_from = None
        if self._start_after is not None:
            self._start_after = None
            self._pending = Agreement(self._riders, self._group, self._schedule.proposal(step))

    def batch_end(self, step: int) -> None:
        """Train batch ``step`` ended: when due, the agreement in flight is read (its riders get their numbers)."""
        if self._riders and self._schedule.due(step):
            self._schedule.agreed(step, self._read())
            self._start_after = step

    def agree_now(self) -> None:
        """Agree at once (an epoch's end): the agreement in flight is read, then one more runs and is read."""
        if self._riders:
            self._read()
            Agreement(self._riders, self._group).result()
            self._start_after = None

    def settle(self) -> None:
        """Read the agreement in flight, if any (the run ends: no collective left running)."""
        self._read()
        self._start_after = None

    def abandon(self) -> None:
        """Forget the agreement in flight without waiting for it (a peer may be gone)."""
        self._pending = self._start_after = self._loader_from = None

    def close(self, complete: bool = True) -> None:
        """The run is over: no more riders; the group is released once the run ``complete``-d on every rank."""
        self.abandon()
        self._riders, self._asks = [], []
        if complete and self._group is not None:
            dist.destroy_process_group(self._group)
        self._group, self.active = None, False

    def _read(self) -> int:
        pending, self._pending = self._pending, None
        return 0 if pending is None else pending.result()

    # ---- at once, on the channel's group ------------------------------------------------------------
    def all_gather_object(self, obj) -> list:
        """``obj`` of every rank, in rank order (collective)."""
        return collectives.all_gather_object(obj, self._world, self._group)

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum of a CPU ``tensor`` over the ranks, in place (collective)."""
        return collectives.all_reduce_(tensor, self._world, "max", self._group)
