"""Graceful stop: a signal or :func:`request_stop` ends the run at the next batch boundary, with a checkpoint.

A signal handler only records a :class:`StopRequest` (no I/O, no collective). The stop callback reads
it at batch boundaries; under several processes the ranks agree through a tiny all-reduce, so every
rank stops after the same batch. ``train()`` then raises :class:`RunStopped`, a ``SystemExit`` whose
code is ``128 + signal number`` (143 for SIGTERM, 130 for SIGINT), as if the signal had ended the
process, so shells, SLURM and ``torchrun --max-restarts`` see an interrupted run.
"""
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger("torchstage")

#: Signals that stop a run gracefully unless told otherwise (SLURM code may add ``signal.SIGUSR1``).
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class StopRequest:
    """Why the run should stop (``reason``), the signal if one caused it, and the process exit code."""

    reason: str
    signum: int = 0
    exit_code: int = 1


_request: Optional[StopRequest] = None


def request_stop(reason: str, exit_code: int = 1, signum: int = 0) -> StopRequest:
    """Ask the running training to stop after the current batch, with a checkpoint; safe in signal handlers.

    The first request wins; later ones return it unchanged.
    """
    global _request
    if _request is None:
        _request = StopRequest(reason=reason, signum=int(signum), exit_code=int(exit_code))
    return _request


def stop_requested() -> Optional[StopRequest]:
    """The pending stop request of this process, or None."""
    return _request


def clear_stop_request() -> None:
    """Forget a pending request (a new run starts clean)."""
    global _request
    _request = None


class RunStopped(SystemExit):
    """Raised by ``train()`` after a graceful stop; uncaught, it exits the process with ``request.exit_code``."""

    def __init__(self, request: StopRequest):
        super().__init__(request.exit_code)
        self.request = request

    def __str__(self):
        return (f"training stopped gracefully ({self.request.reason}); resume it with resume='last' "
                f"(exit code {self.request.exit_code})")


class SignalStop:
    """Turns ``signals`` into a stop request while installed; a second SIGINT interrupts at once."""

    def __init__(self, signals=DEFAULT_SIGNALS):
        self.signals = tuple(signal.Signals(s) for s in signals)
        self._previous = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("train() runs outside the main thread: no signal handlers for a graceful stop")
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and _request is not None and _request.signum == signal.SIGINT:
            self.restore()
            raise KeyboardInterrupt  # Ctrl-C twice: stop now, without waiting for the batch to end
        request_stop(signal.Signals(signum).name, exit_code=128 + signum, signum=signum)


#: The gloo group :func:`control_group` made for the default group it was made under: ``(default group, group)``.
_control = (None, None)


def control_group():
    """A gloo group for host-side flags when the default group is not gloo (NCCL needs device tensors); None: the
    default group. Made once per default group (every rank asks at the same point, as group creation requires),
    so the stop agreement and the straggler detector share it."""
    global _control
    if dist.get_backend() == "gloo":
        return None
    world = dist.group.WORLD
    if _control[0] is not world:
        _control = (world, dist.new_group(backend="gloo"))
    return _control[1]


class AgreementRider:
    """Numbers that travel with the stop agreement (one background all-reduce of integers on a CPU group, about
    every 0.5 s): :meth:`payload` is read as each agreement starts, :meth:`arrived` gets the reduced numbers when
    it is read. The all-reduce takes the maximum, so a rider that wants every rank's numbers puts its own in its
    rank's slots and zeros elsewhere. A payload has the same length on every rank and at every agreement."""

    def payload(self) -> torch.Tensor:
        """This rank's numbers for the agreement starting now (a 1-D int64 CPU tensor)."""
        raise NotImplementedError

    def arrived(self, values: torch.Tensor) -> None:
        """The element-wise maximum over the ranks of the payloads of the agreement just read."""
        raise NotImplementedError


class Agreement:
    """An all-reduce of every rank's stop request, started now (in the background) and read later with
    :meth:`result`; every rank reads the same result, so every rank acts on it at the same point. It also
    carries each rank's proposed ``interval`` to the next agreement and gives every rank the smallest."""

    def __init__(self, request: Optional[StopRequest], group=None, interval: int = 0, riders=()):
        self.request, self.riders = request, tuple(riders)
        local = (request.exit_code, request.signum) if request is not None else (0, 0)
        # the max of -interval is the smallest interval any rank proposed (see callbacks/safety/stop_schedule.py)
        flags = torch.tensor((*local, -interval), dtype=torch.int64)
        payloads = [rider.payload() for rider in self.riders]
        self.sizes = [p.numel() for p in payloads]
        self.flags = torch.cat([flags, *payloads]) if payloads else flags
        self.work = dist.all_reduce(self.flags, op=dist.ReduceOp.MAX, group=group, async_op=True)
        #: The smallest interval the ranks proposed, once :meth:`result` has been read (0: none proposed).
        self.interval = 0

    def result(self) -> Optional[StopRequest]:
        """The stop request every rank acts on (waits for the all-reduce): any rank's request stops all. The riders
        get their numbers first."""
        self.work.wait()
        exit_code, signum, smallest = self.flags[:3].tolist()
        self.interval = -smallest
        if self.riders:
            for rider, values in zip(self.riders, torch.split(self.flags[3:], self.sizes)):
                rider.arrived(values)
        if exit_code == 0:
            return None
        if self.request is not None:
            reason = self.request.reason
        else:
            reason = f"{signal.Signals(signum).name} on another rank" if signum else "requested on another rank"
        return StopRequest(reason=reason, signum=signum, exit_code=exit_code)


def agree(request: Optional[StopRequest], group=None) -> Optional[StopRequest]:
    """The stop request every rank will act on: any rank's request stops all (collective, CPU tensors)."""
    return Agreement(request, group).result()
