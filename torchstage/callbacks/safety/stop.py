"""The graceful-stop callback: at a batch boundary after a stop request, checkpoint on every rank and end the run."""
import logging
import signal
from typing import Optional

from torchstage.callbacks.base import Callback, CallbackScope, CancelRun
from torchstage.callbacks.safety.stop_schedule import CheckSchedule
from torchstage.stop_request import (DEFAULT_SIGNALS, Agreement, AgreementRider, SignalStop, agree, clear_stop_request,
                                     control_group, stop_requested)

logger = logging.getLogger("torchstage")


class StopCallback(Callback):
    """Stops after the current train batch (or at epoch end) once ``signals`` or ``request_stop()`` asked.

    Every checkpoint callback writes ``last.pth`` at that point, then ``train()`` raises
    :class:`~torchstage.RunStopped`. Under several processes the ranks agree (one all-reduce of three
    integers on a CPU group: no GPU sync) at each epoch end and, within an epoch, about every
    ``check_period`` seconds of training (an interval in batches the ranks agree on; see
    :mod:`~torchstage.callbacks.safety.stop_schedule`), or every ``check_every`` train batches when given, so
    all stop after the same batch. The agreement runs in the background during the next batches and is read
    at the next check (waiting for it, or running it every batch, cost 5-10 % of a small model's step under 2
    processes), so a request stops the ranks within about ``check_period`` seconds (with ``check_every=k``:
    a request made during batch N stops them after batch N + k); at an epoch end they agree at once.
    It runs after every other callback, so each one sees the last batch complete. The callbacks of the chain
    that are :class:`~torchstage.stop_request.AgreementRider` s (the straggler detector) send their numbers with
    the periodic agreement: they add no collective of their own.
    """

    order = 10_000
    name = "stop"
    train_batches_only = True

    def __init__(self, signals=DEFAULT_SIGNALS, check_every: Optional[int] = None, check_period: float = 0.5):
        if check_every is not None and (isinstance(check_every, bool) or not isinstance(check_every, int)
                                        or check_every < 1):
            raise ValueError(f"check_every must be None (about every check_period seconds) or an integer >= 1, "
                             f"got {check_every!r}")
        if isinstance(check_period, bool) or not isinstance(check_period, (int, float)) or not check_period > 0:
            raise ValueError(f"check_period must be a number of seconds > 0, got {check_period!r}")
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.check_every, self.check_period = check_every, check_period
        self._handlers, self._group, self._distributed, self._pending = None, None, False, None
        self._schedule, self._riders = None, ()

    def attach(self, shared) -> None:
        shared.add_stop_signals(self.signals)  # another callback (SLURM's requeue) need not catch them

    def on_experiment_start(self, runner):
        clear_stop_request()
        runner.stop_request = None
        self._handlers = SignalStop(self.signals)
        self._handlers.install()
        self._distributed = runner.engine.is_distributed
        self._group = control_group() if self._distributed else None
        self._schedule = CheckSchedule(self.check_every, self.check_period)
        self._riders = riders(runner)

    def on_stage_start(self, runner):
        self._riders = riders(runner)

    def on_loader_start(self, runner):
        if runner.is_train_loader:
            self._schedule.start_loader(runner.global_batch_step)

    def on_batch_end(self, runner):
        if not self._distributed:  # one process: a look at the flag that a signal handler sets
            if stop_requested() is not None and runner.is_train_loader:
                self._stop(runner, stop_requested())
        elif runner.is_train_loader and self._schedule.due(runner.global_batch_step):
            step = runner.global_batch_step
            agreed, interval = self._agreed()  # started at the previous check; every rank reads the same result
            self._schedule.agreed(step, interval)
            if agreed is None:  # runs during the next batches
                self._pending = Agreement(stop_requested(), self._group, self._schedule.proposal(step), self._riders)
            self._stop(runner, agreed)

    def on_epoch_end(self, runner):
        if self._distributed:
            self._stop(runner, self._agreed()[0] or agree(stop_requested(), self._group))
        else:
            self._stop(runner, stop_requested())

    def on_experiment_end(self, runner):
        self._agreed()  # no collective left running when the world ends
        self._release()

    def on_exception(self, runner):
        self._pending = None  # not waited for: a peer may be gone
        self._release()

    def _agreed(self):
        """The agreement in flight, read (waiting for it): its stop request or None, and the interval the ranks
        proposed (0 when none was in flight)."""
        pending, self._pending = self._pending, None
        return (None, 0) if pending is None else (pending.result(), pending.interval)

    def _release(self):
        if self._handlers is not None:
            self._handlers.restore()
            self._handlers = None
        clear_stop_request()

    def _stop(self, runner, request):
        if request is None:
            return
        runner.stop_request = request
        paths = runner.save_last()  # every checkpoint writer of the run, at this batch
        if runner.file_writer is not None:
            runner.file_writer.wait()  # on disk before any rank exits (a launcher may then stop the main one)
        runner.engine.barrier()  # no rank exits while the main one is still writing
        if runner.engine.is_main:
            where = f"checkpoint {paths[0]}; continue with train(..., resume='last')" if paths else \
                "no checkpoint (no logdir)"
            logger.warning("graceful stop (%s) after stage %r epoch %d batch %d (global batch %d): %s; exit code %d",
                           request.reason, runner.stage_key, runner.epoch, runner.train_batches_done,
                           runner.global_batch_step, where, request.exit_code)
        raise CancelRun()


def riders(runner) -> tuple:
    """The callbacks of the current chain whose numbers travel with the stop agreement (every rank runs them, so
    every rank sends the same payloads)."""
    return tuple(cb for cb in runner.callbacks.values()
                 if isinstance(cb, AgreementRider) and cb.scope != CallbackScope.Main)
