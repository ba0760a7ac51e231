"""The graceful-stop callback: at a batch boundary after a stop request, checkpoint on every rank and end the run."""
import logging
import signal
from typing import Optional

import torch

from torchstage.callbacks.base import Callback, CancelRun
from torchstage.distributed.agreement import Rider
from torchstage.stop_request import DEFAULT_SIGNALS, SignalStop, StopRequest, clear_stop_request, stop_requested

logger = logging.getLogger("torchstage")


class StopCallback(Callback):
    """Stops after the current train batch (or at epoch end) once ``signals`` or ``request_stop()`` asked.

    Every checkpoint callback writes ``last.pth`` at that point, then ``train()`` raises
    :class:`~torchstage.RunStopped`. Under several processes the stop request rides the run's agreement channel
    (:mod:`torchstage.distributed.agreement`: one background all-reduce of a few integers on a CPU group, no GPU
    sync, shared with every other signal of the run), which the ranks read at each epoch end and, within an epoch,
    about every ``check_period`` seconds of training (an interval in batches the ranks agree on; see
    :mod:`~torchstage.distributed.schedule`), or every ``check_every`` train batches when given, so all stop after
    the same batch. The agreement runs in the background during the next batch(es) and is read at the next check
    (waiting for it, or running it every batch, cost 5-10 % of a small model's step under 2 processes), so a
    request stops the ranks within about ``check_period`` seconds (with ``check_every=k``: a request made during
    batch N stops them after batch N + k); at an epoch end they agree at once. It runs after every other callback,
    so each one sees the last batch complete.
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
        self._handlers, self._vote, self._distributed = None, None, False

    def attach(self, shared) -> None:
        shared.add_stop_signals(self.signals)  # another callback (SLURM's requeue) need not catch them

    def on_experiment_start(self, runner):
        clear_stop_request()
        runner.loop.stop_request = None
        self._handlers = SignalStop(self.signals)
        self._handlers.install()
        self._distributed = runner.engine.is_distributed
        self._vote = StopVote()

    def on_stage_start(self, runner):
        runner.channel.join(self._vote, every=self.check_every, period=self.check_period)

    def on_batch_end(self, runner):
        self._stop(runner, self._vote.agreed if self._distributed else stop_requested())

    def on_epoch_end(self, runner):
        if self._distributed:
            runner.channel.agree_now()
        self._stop(runner, self._vote.agreed if self._distributed else stop_requested())

    def on_experiment_end(self, runner):
        self._release()

    def on_exception(self, runner):
        self._release()

    def _release(self):
        if self._handlers is not None:
            self._handlers.restore()
            self._handlers = None
        clear_stop_request()

    def _stop(self, runner, request):
        if request is None:
            return
        runner.loop.stop_request = request
        paths = runner.save_last()  # every checkpoint writer of the run, at this batch
        if runner.file_writer is not None:
            runner.file_writer.wait()  # on disk before any rank exits (a launcher may then stop the main one)
        runner.engine.barrier()  # no rank exits while the main one is still writing
        if runner.engine.is_main:
            where = f"checkpoint {paths[0]}; continue with train(..., resume='last')" if paths else \
                "no checkpoint (no logdir)"
            logger.warning("graceful stop (%s) after stage %r epoch %d batch %d (global batch %d): %s; exit code %d",
                           request.reason, runner.loop.stage_key, runner.loop.epoch, runner.loop.train_batches_done,
                           runner.loop.global_batch_step, where, request.exit_code)
        raise CancelRun()


class StopVote(Rider):
    """This rank's stop request on the agreement channel: its exit code and signal (the ranks' maximum wins, so any
    rank's request stops all); :attr:`agreed` is the request every rank acts on, once one arrived."""

    def __init__(self):
        self.agreed, self._sent = None, None

    def payload(self) -> torch.Tensor:
        self._sent = request = stop_requested()
        return torch.tensor((request.exit_code, request.signum) if request is not None else (0, 0), dtype=torch.int64)

    def arrived(self, values: torch.Tensor) -> None:
        exit_code, signum = values.tolist()
        if exit_code == 0 or self.agreed is not None:
            return
        if self._sent is not None:
            reason = self._sent.reason
        else:
            reason = f"{signal.Signals(signum).name} on another rank" if signum else "requested on another rank"
        self.agreed = StopRequest(reason=reason, signum=signum, exit_code=exit_code)
