"""Graceful stop: a signal or :func:`request_stop` ends the run at the next batch boundary, with a checkpoint.

A signal handler only records a :class:`StopRequest` (no I/O, no collective). The stop callback reads
it at batch boundaries; under several processes it rides the run's agreement channel
(:mod:`torchstage.distributed.agreement`), so every rank stops after the same batch. ``train()`` then
raises :class:`RunStopped`, a ``SystemExit`` whose code is ``128 + signal number`` (143 for SIGTERM, 130
for SIGINT), as if the signal had ended the process, so shells, SLURM and ``torchrun --max-restarts``
see an interrupted run.
"""
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Optional

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
